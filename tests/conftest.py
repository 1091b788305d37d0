"""Test session setup: Triton runs through its interpreter on the CPU (set before any import)."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
