"""Generated Python runs only here: `load_module` executes source that flexdsl generated itself
(validated names, printed sympy) as a module registered under a stable importable name,
`flexdsl._generated.<kind>_<key>`, so that `torch.compile`, `pickle` and a new process can
import it again by that name: the import finder below rebuilds it from the verified cache entry
of that key. (Importing `flexdsl._generated` installs the finder: the one import cycle of the
package, on purpose.)
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import linecache
import sys
import threading
from types import ModuleType

from .cache import read

GENERATED_PACKAGE = "flexdsl._generated"


def module_name(kind: str, k: str) -> str:
    return f"{GENERATED_PACKAGE}.{kind}_{k}"


_modules_lock = threading.RLock()


def load_module(kind: str, k: str, source: str) -> ModuleType:
    """Execute source that flexdsl generated itself (validated names, printed sympy) as the
    module `flexdsl._generated.<kind>_<key>`; once per process."""
    name = module_name(kind, k)
    with _modules_lock:
        mod = sys.modules.get(name)
        if mod is not None:
            return mod
        import flexdsl._generated  # noqa: F401 - the parent package

        fname = f"<flexdsl-generated {kind} {k}>"
        linecache.cache[fname] = (len(source), None, source.splitlines(True), fname)
        mod = ModuleType(name)
        mod.__file__ = fname
        mod.__loader__ = _FINDER
        mod.__spec__ = importlib.machinery.ModuleSpec(name, _FINDER, origin=fname)
        sys.modules[name] = mod
        try:
            exec(compile(source, fname, "exec"), mod.__dict__)  # noqa: S102 - generated code only
        except BaseException:
            del sys.modules[name]
            raise
        return mod


def forget(mod: ModuleType) -> None:
    """Drop a generated module from `sys.modules` and `linecache` (its program was evicted from
    the runtime's bounded cache; whoever holds it keeps it, and a later load or import makes it
    again from the store)."""
    with _modules_lock:
        if sys.modules.get(mod.__name__) is mod:
            del sys.modules[mod.__name__]
        linecache.cache.pop(getattr(mod, "__file__", None) or "", None)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports `flexdsl._generated.<kind>_<key>` from a verified cache entry (a new process
    unpickling a model, or torch.compile's workers)."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(GENERATED_PACKAGE + "."):
            return None
        kind, _, k = fullname[len(GENERATED_PACKAGE) + 1:].rpartition("_")
        if not kind or read(k) is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, origin=f"<flexdsl-generated {kind} {k}>")

    def create_module(self, spec):
        kind, _, k = spec.name[len(GENERATED_PACKAGE) + 1:].rpartition("_")
        art = read(k)
        assert art is not None
        return load_module(kind, k, art.source)

    def exec_module(self, module):
        pass


_FINDER = _Finder()
if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _FINDER)


__all__ = ["load_module", "module_name", "GENERATED_PACKAGE"]
