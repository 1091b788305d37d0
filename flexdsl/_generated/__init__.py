"""The namespace of generated modules (`flexdsl._generated.<kind>_<key>`), filled at run time
by `flexdsl.store.generated.load_module` from verified cache entries. Nothing is stored here;
importing this package installs the finder that rebuilds a generated module by its name."""

from ..store import generated as _generated  # noqa: F401 - installs the import finder
