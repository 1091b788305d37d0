"""The checked model: what the checker gives (declarations sorted by role and validated, the
surrogate resolved, the outputs, and in a model with units the units of every name and the
model as written). Data only; `check.py` makes it, `unitcheck.py` and `convert.py` read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from . import ast as A
from .catalog import DRAWS
from .dims import Dim
from .options import NONE, LoadOptions


@dataclass
class UnitInfo:
    """The units of a model, for the runtime and the docs (sympy-free data).

    `factor[name]`: the factor from a param's or an input's declared unit to base units;
    `unit[name]`: the unit the API exchanges the value in (declared for params and inputs,
    base for states); `dim[name]`: the dimension of every declared name."""

    factor: dict[str, Fraction] = field(default_factory=dict)
    unit: dict[str, str] = field(default_factory=dict)
    dim: dict[str, Dim] = field(default_factory=dict)


@dataclass
class ResolvedSurrogate:
    name: str
    arg: str  # the formal argument of a user surrogate ("x" for built-ins)
    kwargs: dict[str, A.Expr]  # keyword -> value expression (defaults filled in)
    user: A.SurrogateDef | None = None
    pos: A.Pos | None = None


@dataclass
class CheckedModel:
    ast: A.Neuron
    inputs: list[A.Input]
    params: list[A.Param]
    states: list[A.State]
    equations: A.Equations | None
    method: str | None  # as written (normalized), None = automatic
    update: list[A.Assign]
    spike: A.SpikeRule | None
    surrogate: ResolvedSurrogate | None
    on_spike: list[A.Assign]
    outputs: list[tuple[str, A.Pos]]
    locals: list[str] = field(default_factory=list)
    subexprs: list[str] = field(default_factory=list)
    refractory: A.Refractory | None = None
    units: UnitInfo | None = None  # None: a model written without units
    noise: list[str] = field(default_factory=list)  # the equations' white noise sources (`xi`...), by first use
    # the model as written, before the conversion to base units (None: this is it); the docs show it
    written: CheckedModel | None = None
    # what was chosen at load (frontend/options.py), and the bounds that learnable params train
    # within (frontend/bounds.py: param name -> its Bound)
    options: LoadOptions = NONE
    bounds: dict[str, Any] = field(default_factory=dict)

    @property
    def hidden(self) -> list[str]:
        """The bookkeeping states the lowering adds (`HIDDEN_STATES`), after the model's own."""
        return [s.name for s in self.states if s.meta.get("hidden")]

    @property
    def stochastic(self) -> bool:
        """Whether a step draws random numbers: white noise in the equations, or `randn()`/`rand()`."""
        if self.noise:
            return True
        exprs = [st.value for st in [*self.update, *self.on_spike]]
        if self.spike is not None:
            exprs += [self.spike.left, self.spike.right]
        return any(isinstance(n, A.Call) and n.func in DRAWS for e in exprs for n in A.nodes(e))

    @property
    def noise_pos(self) -> A.Pos:
        """Where the model first draws: white noise in the equations, else a draw (else the model)."""
        exprs = [ln.value for ln in self.equations.lines] if self.equations is not None else []
        exprs += [st.value for st in self.update]
        exprs += [self.spike.left, self.spike.right] if self.spike is not None else []
        exprs += [st.value for st in self.on_spike]
        for e in exprs:
            for n in A.nodes(e):
                if (isinstance(n, A.Name) and n.id in self.noise) or (isinstance(n, A.Call) and n.func in DRAWS):
                    return n.pos
        return self.ast.pos

    @property
    def name(self) -> str:
        return self.ast.name

    @property
    def filename(self) -> str:
        return self.ast.filename

    @property
    def source(self) -> str:
        return self.ast.source

    def param(self, name: str) -> A.Param:
        return next(p for p in self.params if p.name == name)


__all__ = ["CheckedModel", "ResolvedSurrogate", "UnitInfo"]
