"""The checked model: what the checker gives (declarations sorted by role and validated, the
surrogate resolved, the outputs, and in a model with units the units of every name and the
model as written). Data only; `check.py` makes it, `unitcheck.py` and `convert.py` read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from . import ast as A
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
