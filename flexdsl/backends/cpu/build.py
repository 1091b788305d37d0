"""Building the CPU backend's kernels: the C++ compiler PyTorch uses for Inductor, a shared
library per model, kept in the flexdsl disk cache.

The compiler is `$CXX` if set, else the first of `g++`, `c++`, `clang++` on the PATH (Inductor's
choice on Linux is `$CXX` or `g++`). The library is built once per model text, compiler and
machine (`-march=native`), with OpenMP (without it where the compiler has none), no floating
contraction (no fused multiply-add that the torch backend would not do), `-fno-math-errno` and
`-fno-trapping-math` (floating-point exceptions are never read, so both sides of a `?:` may be
computed: without it GCC vectorizes no lane loop that selects, as a spike rule does; the values
are the same IEEE operations either way).
It is written next to the cache's JSON entries (atomically: a temporary file renamed into
place) and its SHA-256 is recorded in a cache entry of its own, written once the library has
loaded, and checked before it is loaded again; a missing or damaged library is rebuilt. A library
that cannot be loaded (a compiler that exits 0 but writes no valid library, one without the
kernels' symbols) is damaged too: removed with its entry (no later process loads it) and rebuilt
once; where the rebuilt one cannot be loaded either, the build fails (the backend then runs the
torch backend's loop, with one warning that names why). A build runs under a time limit,
`FLEXDSL_CPU_BUILD_TIMEOUT` seconds (default 60): a compiler that does not finish by then is
stopped (its whole process group) and the build fails. Where the cache folder cannot be used, the
library goes to a private temporary folder for this process.

`FLEXDSL_CPU_KERNELS=0` turns the backend off (the torch backend runs CPU tensors).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from functools import lru_cache
from pathlib import Path

from ...errors import FlexDSLError
from ...settings import env_int
from ...store import cache

BASE_FLAGS = ["-O3", "-march=native", "-shared", "-fPIC", "-std=c++17", "-ffp-contract=off", "-fno-math-errno",
              "-fno-trapping-math", "-w"]
OPENMP = ["-fopenmp"]
COMPILE_TIMEOUT_S = 60  # the default of FLEXDSL_CPU_BUILD_TIMEOUT
SYMBOLS = [f"flexdsl_{kind}_{suffix}" for kind in ("fwd", "bwd") for suffix in ("f32", "f64")]  # what a library exports
# the time each build took (seconds, by library key), for reports
BUILD_TIMES: dict[str, float] = {}


class BuildError(FlexDSLError):
    """The compiler failed on generated code (a flexdsl bug, or a broken toolchain)."""


def disabled() -> bool:
    return os.environ.get("FLEXDSL_CPU_KERNELS", "1").strip().lower() in ("0", "false", "no", "off")


@lru_cache(maxsize=4)
def _find(cxx_env: str | None) -> str | None:
    names = [cxx_env] if cxx_env else ["g++", "c++", "clang++"]
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    return None


def compiler() -> str | None:
    """The C++ compiler's path, or None."""
    return _find(os.environ.get("CXX") or None)


def why_unavailable() -> str | None:
    """None where kernels can be built here, else why not (one line)."""
    if disabled():
        return "FLEXDSL_CPU_KERNELS=0"
    if compiler() is None:
        cxx = os.environ.get("CXX")
        return f"the C++ compiler $CXX={cxx!r} was not found" if cxx else "no C++ compiler (g++, c++ or clang++)"
    return None


@lru_cache(maxsize=4)
def _identity(path: str) -> str:
    """What the built library depends on besides its source: the compiler (path, size, time)
    and the machine (-march=native)."""
    st = os.stat(path)
    cpu = platform.machine() + " " + platform.processor()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features", "model name")):
                    cpu += line
                if line.strip() == "":
                    break
    except OSError:
        pass
    return f"{os.path.realpath(path)} {st.st_size} {int(st.st_mtime)} {hashlib.sha256(cpu.encode()).hexdigest()[:16]}"


def version() -> str:
    """Part of the artefact key."""
    c = compiler()
    return f"cpu kernels, {_identity(c) if c else 'no compiler'}, flags {' '.join(BASE_FLAGS)}"


_lock = threading.Lock()
_private: list[Path] = []


def _folder() -> Path:
    d = cache.folder()
    if d is not None:
        return d
    if not _private:
        _private.append(Path(tempfile.mkdtemp(prefix="flexdsl-cpu-")))
    return _private[0]


def _sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def library(source: str, name: str, filename: str) -> tuple[ctypes.CDLL, bool]:
    """The loaded library of this source (built now if the cache has none): (library, whether
    it runs OpenMP threads). `name` and `filename` name the model in errors."""
    cxx = compiler()
    if cxx is None:
        raise BuildError(f"cannot build the CPU kernels of {name}: {why_unavailable()}", filename)
    k = cache.key("cpu-library", source, _identity(cxx), " ".join(BASE_FLAGS))
    d = _folder()
    path = d / f"{k}.so"
    with _lock:
        entry = cache.read(k)
        builds = 2  # a library that does not load is damaged: removed, and built once more
        if entry is not None and path.is_file():
            try:
                if _sha256(path) == entry.meta.get("sha256"):
                    return _open(path), bool(entry.meta.get("openmp"))
            except OSError:  # (unreadable, or a library that does not load: damaged)
                builds = 1
            _discard(k, path)
        for attempt in range(builds):
            openmp = _compile(cxx, source, path, name, filename)
            try:
                lib = _open(path)
            except OSError as e:
                _discard(k, path)
                if attempt + 1 < builds:
                    continue
                raise BuildError(f"the C++ compiler {cxx} wrote a library of the CPU kernels of {name} that cannot "
                                 f"be loaded: {str(e).strip()[:300]}", filename,
                                 hint="check the compiler ($CXX) and its linker; meanwhile use backend='torch'") from None
            cache.write(k, cache.Artefact("cpu-library", "", {"sha256": _sha256(path), "openmp": openmp,
                                                              "file": path.name}))
            return lib, openmp
        raise AssertionError("unreachable")


def _open(path: Path) -> ctypes.CDLL:
    """The library loaded, with every kernel it must export; OSError where it is no such library."""
    lib = ctypes.CDLL(str(path))
    missing = [s for s in SYMBOLS if not hasattr(lib, s)]
    if missing:
        raise OSError(f"{path.name} has no symbol {missing[0]}")
    return lib


def _discard(k: str, path: Path) -> None:
    """A damaged library: its file and its entry removed, so that no process loads it again."""
    try:
        path.unlink()
    except OSError:
        pass
    cache.forget(k)


def build_timeout() -> int:
    """Seconds a build may take (`FLEXDSL_CPU_BUILD_TIMEOUT`, checked)."""
    v = env_int("FLEXDSL_CPU_BUILD_TIMEOUT")
    return COMPILE_TIMEOUT_S if v is None else v


def _run(cmd: list[str], timeout: float) -> tuple[int, str]:
    """(exit status, output) of the compiler, run in a process group of its own that is killed
    whole when it runs past `timeout` (subprocess.TimeoutExpired then)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         text=True, errors="replace", start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except OSError:
            p.kill()
        p.communicate()
        raise
    return p.returncode, out or ""


def _compile(cxx: str, source: str, path: Path, name: str, filename: str) -> bool:
    """Compile into `path` (atomically); True if with OpenMP."""
    t0 = time.perf_counter()
    limit = build_timeout()
    with tempfile.TemporaryDirectory(prefix="flexdsl-build-") as tmp:
        src = Path(tmp) / "kernels.cpp"
        src.write_text(source, encoding="utf-8")
        out = Path(tmp) / "kernels.so"
        err = ""
        for extra in (OPENMP, []):
            try:
                code, err = _run([cxx, *BASE_FLAGS, *extra, str(src), "-o", str(out)],
                                 max(limit - (time.perf_counter() - t0), 1.0))
            except subprocess.TimeoutExpired:
                raise BuildError(f"the C++ compiler {cxx} did not finish the CPU kernels of {name} within {limit} s",
                                 filename, hint="set FLEXDSL_CPU_BUILD_TIMEOUT to more seconds, or check the compiler "
                                                "($CXX); meanwhile use backend='torch'") from None
            except (OSError, subprocess.SubprocessError) as e:
                err = str(e)
                continue
            if code == 0 and out.is_file():
                tmp_dst = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
                shutil.copyfile(out, tmp_dst)
                os.chmod(tmp_dst, 0o700)
                os.replace(tmp_dst, path)
                BUILD_TIMES[path.stem] = time.perf_counter() - t0
                return bool(extra)
            err = err.strip() or f"it exited with status {code} and wrote no library"
    tail = "\n".join(err.splitlines()[-12:])
    raise BuildError(f"the C++ compiler {cxx} failed on the CPU kernels of {name}:\n{tail}", filename,
                     hint="this is a flexdsl bug: please report it with the model; meanwhile use backend='torch'")


__all__ = ["BuildError", "library", "compiler", "why_unavailable", "version", "disabled", "build_timeout",
           "BUILD_TIMES"]
