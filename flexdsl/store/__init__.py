"""The store: what compiling makes, kept for running. Below the backends, above the IR.

- `cache.py`: the one verified disk cache of artefacts (`Artefact`: readable source and JSON
  metadata, keyed by model text, tool versions and the package's own files);
- `generated.py`: `load_module`, the only way generated Python runs, as an importable module
  `flexdsl._generated.<kind>_<key>` (its import finder rebuilds one from the cache by name);
- `pipeline.py`: `IR`, one model through the compiler: its text, each stage computed on first
  use (checked model, step, backward, the host's split, schedule, host program) — the object a
  backend's `emit` receives.

Takes model text; gives the IR and the stored artefacts. Imports nothing above it.
"""
