"""The namespace of generated modules (`flexdsl._generated.<kind>_<key>`), filled at run time
by `flexdsl.runtime.cache.load_module` from verified cache entries. Nothing is stored here."""
