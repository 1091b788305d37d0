"""Test session setup: Triton runs through its interpreter on the CPU (set before any import),
and generated sources are cached in a fresh directory (tests never see a stale cache)."""

import os
import tempfile

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("FLEXDSL_CACHE_DIR", tempfile.mkdtemp(prefix="flexdsl-test-cache-"))


import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# property tests draw the same examples on every machine and every run (a red run anywhere is red
# everywhere, and reproducible); FLEXDSL_HYPOTHESIS_PROFILE=explore draws new ones
settings.register_profile("repeatable", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", print_blob=True)
settings.load_profile(os.environ.get("FLEXDSL_HYPOTHESIS_PROFILE", "repeatable"))

if os.environ.get("PYTEST_XDIST_WORKER"):  # (one process per core: each computes on one thread)
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def library_site(tmp_path_factory):
    """`flexdsl doc neurons/` once per test run (the docs tests and the browser tests read it):
    (outdir, BuildResult, progress calls). Under pytest-xdist the first worker that needs it builds
    it and the others wait for it and read it (a lock in the run's shared temporary folder)."""
    import pickle
    from pathlib import Path

    from filelock import FileLock

    import flexdsl.docs as docs

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    done = root / "library_site.pickle"
    with FileLock(str(root / "library_site.lock")):
        if done.exists():
            return pickle.loads(done.read_bytes())
        out = root / "library_site"
        out.mkdir()
        seen: list = []
        res = docs.build([Path(__file__).resolve().parent.parent / "neurons"], out,
                         progress=lambda k, n, label, s: seen.append((k, n, label)))
        done.write_bytes(pickle.dumps((out, res, seen)))
        return out, res, seen


@pytest.fixture
def numpy_backend():
    """The NumPy backend of `tests/numpy_backend/`, registered for one test (a new backend is one
    folder and this one line), and removed after it."""
    from numpy_backend import NumpyBackend

    from flexdsl import backends

    backends.register("numpy", NumpyBackend())
    yield "numpy"
    backends.unregister("numpy")
