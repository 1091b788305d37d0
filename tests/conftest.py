"""Test session setup: Triton runs through its interpreter on the CPU (set before any import),
and generated sources are cached in a fresh directory (tests never see a stale cache)."""

import os
import tempfile

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("FLEXDSL_CACHE_DIR", tempfile.mkdtemp(prefix="flexdsl-test-cache-"))


import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# property tests draw the same examples on every machine and every run (a red run anywhere is red
# everywhere, and reproducible); `pytest --hypothesis-profile=explore` draws new ones
settings.register_profile("repeatable", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", print_blob=True)
settings.load_profile(os.environ.get("FLEXDSL_HYPOTHESIS_PROFILE", "repeatable"))

if os.environ.get("PYTEST_XDIST_WORKER"):  # (one process per core: each computes on one thread)
    import torch

    torch.set_num_threads(1)


def pytest_collection_modifyitems(items):
    """Under pytest-xdist (`-n`, pyproject's addopts) the tests that read the library's site run in
    one worker, which builds it once."""
    for item in items:
        if "library_site" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("library_site"))


@pytest.fixture(scope="session")
def library_site(tmp_path_factory):
    """`flexdsl doc neurons/` once per session (the docs tests and the browser tests read it):
    (outdir, BuildResult, progress calls)."""
    from pathlib import Path

    import flexdsl.docs as docs

    out = tmp_path_factory.mktemp("site")
    seen: list = []
    res = docs.build([Path(__file__).resolve().parent.parent / "neurons"], out,
                     progress=lambda k, n, label, s: seen.append((k, n, label)))
    return out, res, seen
