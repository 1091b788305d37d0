"""The one disk cache of generated artefacts.

Entries live under `$FLEXDSL_CACHE_DIR` (default `~/.cache/flexdsl`), one JSON file per key:
the artefact (readable source and its metadata) and the SHA-256 of that content, verified
before anything is used; a damaged entry is deleted and regenerated. Keys hash the model
text, the backend and its tool versions, and every file of the installed flexdsl package
(`package_hash`), so nothing stale survives an upgrade or an edit of flexdsl.

A cache folder is trusted only if the current user owns it and no one else can write to it;
otherwise (or when it cannot be created or written) flexdsl warns once and keeps artefacts
in memory for this process. Nothing is unpickled. (Generated Python runs only through
`generated.load_module`.)
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FORMAT = 1  # of the entry files
_PKG_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Artefact:
    """What a backend emits for one model: readable source and JSON-serialisable metadata."""

    kind: str
    source: str
    meta: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------- keys
_HASH: list[str] = []
_HASH_LOCK = threading.Lock()


def package_hash() -> str:
    """SHA-256 over every file of the installed flexdsl package (sources, templates, grammar)."""
    with _HASH_LOCK:
        if not _HASH:
            from .._paths import GRAMMAR_DIR

            h = hashlib.sha256()
            files = [p for p in _PKG_ROOT.rglob("*") if p.is_file() and p.suffix in (".py", ".j2", ".lark")
                     and "__pycache__" not in p.parts]
            files += [p for p in GRAMMAR_DIR.glob("*.lark") if p not in files]
            for p in sorted(files, key=lambda q: q.as_posix()):
                h.update(p.name.encode())
                h.update(b"\0")
                h.update(p.read_bytes())
                h.update(b"\0")
            _HASH.append(h.hexdigest())
        return _HASH[0]


def key(*parts: str) -> str:
    """A cache key: the parts (model text, backend, versions...) and the package hash."""
    h = hashlib.sha256()
    for p in (*parts, package_hash()):
        h.update(p.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()[:32]


# ----------------------------------------------------------------------------- the folder
_warned: set[str] = set()
_memory: dict[str, Artefact] = {}  # the entries read or written by this process, most recent last
_lock = threading.Lock()
MEMORY_ENTRIES = 512  # (bounded: the least recently used go, and are read again from the folder)


def _remember(k: str, art: Artefact) -> None:
    with _lock:
        _memory.pop(k, None)
        _memory[k] = art
        while len(_memory) > MEMORY_ENTRIES:
            _memory.pop(next(iter(_memory)))


def _warn(msg: str) -> None:
    if msg not in _warned:
        _warned.add(msg)
        warnings.warn(f"flexdsl: {msg}; generated code is kept in memory for this process", stacklevel=3)


def root() -> Path:
    r = os.environ.get("FLEXDSL_CACHE_DIR")
    return Path(r).expanduser() if r else Path.home() / ".cache" / "flexdsl"


def _trusted(p: Path, is_dir: bool) -> str | None:
    """None if `p` is ours and writable by us alone, else why not."""
    try:
        st = p.lstat()
    except OSError as e:
        return f"cannot read {p}: {e.strerror}"
    import stat

    if is_dir and not stat.S_ISDIR(st.st_mode):
        return f"the cache path {p} is not a folder"
    if not is_dir and not stat.S_ISREG(st.st_mode):
        return f"the cache entry {p} is not a plain file"
    if hasattr(os, "getuid"):
        if st.st_uid != os.getuid():
            return f"the cache folder {p} belongs to another user"
        if st.st_mode & 0o022:
            return f"the cache folder {p} is writable by other users"
    return None


def folder() -> Path | None:
    """The cache folder, created if needed, or None when it cannot be trusted or written."""
    d = root() / f"v{FORMAT}"
    try:
        d.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as e:
        _warn(f"cannot use the cache folder {d} ({e.strerror or e})")
        return None
    for p in (root(), d):
        why = _trusted(p, True)
        if why:
            _warn(why)
            return None
    if not os.access(d, os.W_OK | os.X_OK):
        _warn(f"the cache folder {d} is not writable")
        return None
    return d


def _digest(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode("utf-8", "surrogatepass")).hexdigest()


MAX_ENTRY_BYTES = 64 << 20  # far above any generated source; larger files are not entries


def read(k: str) -> Artefact | None:
    """The verified entry of key `k`, or None (a damaged entry is deleted)."""
    with _lock:
        hit = _memory.get(k)
    if hit is not None:
        _remember(k, hit)
        return hit
    d = folder()
    if d is None:
        return None
    p = d / f"{k}.json"
    if not p.exists():
        return None
    if _trusted(p, False):
        _warn(_trusted(p, False) or "")
        return None
    try:
        if p.stat().st_size > MAX_ENTRY_BYTES:
            raise ValueError("too large for an entry")
        doc = json.loads(p.read_text(encoding="utf-8"))
        payload = doc["payload"]
        ok = doc.get("format") == FORMAT and doc.get("sha256") == _digest(payload) and payload.get("key") == k
        art = Artefact(str(payload["kind"]), str(payload["source"]), dict(payload["meta"])) if ok else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError, MemoryError):
        art = None  # (anything a damaged file can make the JSON reader or the checks raise)
    if art is None:
        try:
            p.unlink()
        except OSError:
            pass
        return None
    _remember(k, art)
    return art


STALE_TMP_SECONDS = 600  # a write takes milliseconds: an older temporary file was left by a killed writer
_swept: set[str] = set()


def _sweep(d: Path) -> None:
    """Delete the temporary files of writers that were killed before renaming them into place
    (once per process and folder, before its first write)."""
    if str(d) in _swept:
        return
    _swept.add(str(d))
    now = time.time()
    try:
        entries = list(os.scandir(d))
    except OSError:
        return
    for e in entries:
        if e.name.startswith(".") and e.name.endswith(".tmp"):
            try:
                if now - e.stat(follow_symlinks=False).st_mtime > STALE_TMP_SECONDS:
                    os.unlink(e.path)
            except OSError:
                pass


def write(k: str, art: Artefact) -> None:
    """Store an entry atomically (a temporary file renamed into place); in memory if the
    folder cannot be used."""
    _remember(k, art)
    d = folder()
    if d is None:
        return
    payload = {"key": k, "kind": art.kind, "source": art.source, "meta": art.meta}
    doc = {"format": FORMAT, "sha256": _digest(payload), "payload": payload}
    _sweep(d)
    tmp = d / f".{k}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # left by a killed process that had this pid and thread id
            tmp.unlink()
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(doc, f)
        os.replace(tmp, d / f"{k}.json")
    except OSError as e:
        _warn(f"cannot write to the cache folder {d} ({e.strerror or e})")
        try:
            tmp.unlink()
        except OSError:
            pass


def forget(k: str) -> None:
    """Remove the entry of key `k` (from memory and from the folder): what it stands for is
    damaged (a built library that does not load)."""
    with _lock:
        _memory.pop(k, None)
    d = folder()
    if d is not None:
        try:
            (d / f"{k}.json").unlink()
        except OSError:
            pass


def get_or_make(k: str, make) -> Artefact:
    """The cached artefact of key `k`, else `make()`, stored."""
    art = read(k)
    if art is None:
        art = make()
        write(k, art)
    return art
