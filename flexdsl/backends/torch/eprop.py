"""The torch backend's e-prop step: one step of the model and its e-prop factors
(`ir/eprop.py`) as one generated function, run by `runtime/eprop.py`:

    (*outputs, *next_states, *factors) = eprop_step(*inputs, *states, *params)

`meta["factors"]` names the returned factors (`J[v,a]`, `b[v]`, `c[spike,v]`, `g[spike]`, ...);
a factor that is identically zero is not returned (its name is absent).
"""

from __future__ import annotations

from typing import Any

from ...frontend.parse import source_lines
from ...store import cache
from ...store.generated import load_module
from ..base import IR


def emit_eprop(ir: IR, port: int) -> tuple[str, dict[str, Any]]:
    from ...ir.eprop import derive_eprop  # (sympy: only when emitted, not when loaded from the disk cache)
    from ..printer import lhs_rhs_lines
    from .emit import TorchPrinter, module_head

    step = ir.step
    e = derive_eprop(step, port)
    pr = TorchPrinter(like=pr_name(step, port))
    S = pr._print
    args = [S(s) for s in [*step.inputs, *step.states]] + [S(p.symbol) for p in step.params]
    factors = [(n, f) for n, f in e.factors() if f != 0]
    rets = [S(v) for _, v in step.outputs] + [S(v) for v in step.next_states] + [S(f) for _, f in factors]
    lines = [
        *module_head(step, "the e-prop step (one step and its eligibility factors)"),
        f"def eprop_step({', '.join(args)}):",
        "    # one step, then its derivatives along the neuron's own history (forward mode):",
        "    # " + ", ".join(n for n, _ in factors),
        *lhs_rhs_lines(pr, e.assignments, step.origins, source_lines(step.checked.source)),
        "    return (" + "".join(r + ", " for r in rets) + ")",
        "",
    ]
    meta = {"inputs": [x.name for x in step.inputs], "states": [s.name for s in step.states],
            "outputs": [n for n, _ in step.outputs], "params": [p.name for p in step.params],
            "learnable": [p.name for p in step.learnable], "factors": [n for n, _ in factors],
            "constant": e.constant, "port": port}
    return "\n".join(lines) + "\n", meta


def pr_name(step: Any, port: int) -> str:
    """The argument whose dtype a `where` of two numbers takes (the port's current)."""
    return step.inputs[port].name


def load_eprop(ir: IR, key: str, port: int) -> tuple[Any, dict[str, Any]]:
    """The generated e-prop step of `ir` for input `port` (cached on disk like every artefact)."""
    k = cache.key("eprop", key, str(port))

    def make() -> cache.Artefact:
        src, meta = emit_eprop(ir, port)
        return cache.Artefact("torch-eprop", src, meta)

    art = cache.get_or_make(k, make)
    return load_module("eprop", k, art.source), art.meta


__all__ = ["emit_eprop", "load_eprop"]
