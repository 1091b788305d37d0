"""Test session setup: Triton runs through its interpreter on the CPU (set before any import),
and generated sources are cached in a fresh directory (tests never see a stale cache)."""

import os
import tempfile

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("FLEXDSL_CACHE_DIR", tempfile.mkdtemp(prefix="flexdsl-test-cache-"))
