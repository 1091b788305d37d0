"""NIR's neuron primitives as flexdsl text (`neuron_text`), and the conventions export and import
share: the discretisations (`euler`, `exact`), the default surrogate, the step `dt` (checked), a
surrogate written as text, the `nir` package (an error that says how to install it)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import FlexDSLError, did_you_mean
from ..frontend.catalog import SURROGATES

METHODS = ("euler", "exact")
DEFAULT_SURROGATE = "sigmoid(alpha=4.0)"
_NETWORK = "<network>"  # the "file" of errors about a torch network


def _nir():
    """The `nir` package, or an error that says how to install it."""
    try:
        import nir
    except ImportError:
        raise FlexDSLError("flexdsl.nir needs the `nir` package, which is not installed", "<flexdsl.nir>",
                           hint="pip install 'flexdsl[nir]'") from None
    return nir


# ============================================================================ the primitives
@dataclass(frozen=True)
class Primitive:
    """A NIR neuron primitive as flexdsl text: its params (NIR's field names), its states, and the
    body of one step under each discretisation (input `x`, step `dt`)."""

    name: str
    params: tuple[str, ...]
    states: tuple[str, ...]  # membrane `v`, synaptic current `i`
    spiking: bool
    euler: tuple[str, ...]  # `update:` statements
    exact: tuple[str, ...]  # `equations method exact:` lines (`update:` statements where exact_update)
    ode: str  # the NIR equations, for the docstring
    exact_update: bool = False

    @property
    def output(self) -> str:
        return "spike" if self.spiking else (self.states[-1] if self.states else "spike")


_LIF_EULER = ("v = v + dt / tau * ((v_leak - v) + r * x)",)
_LIF_EXACT = ("dv/dt = ((v_leak - v) + r * x) / tau",)
_CUBA_EULER = ("i = i + dt / tau_syn * (w_in * x - i)", "v = v + dt / tau_mem * ((v_leak - v) + r * i)")
# The closed form of both equations over a step, written out: v sees the current through
# kappa = a_mem*(dt/tau_mem)*(exp(z) - 1)/z, z = dt*(tau_syn - tau_mem)/(tau_syn*tau_mem), with a series
# where z is small, so that equal or nearly equal time constants lose no precision.
_CUBA_EXACT = (
    "let a_syn = exp(-dt / tau_syn)",
    "let a_mem = exp(-dt / tau_mem)",
    "let z = dt * (tau_syn - tau_mem) / (tau_syn * tau_mem)",
    "let z_safe = where(abs(z) > 0.0001, z, 1.0)",
    "let phi = where(abs(z) > 0.0001, (exp(z_safe) - 1) / z_safe, 1 + z / 2 + z * z / 6)",
    "let i_inf = w_in * x",
    "v = v_leak + r * i_inf + (v - v_leak - r * i_inf) * a_mem + r * (i - i_inf) * a_mem * dt / tau_mem * phi",
    "i = i_inf + (i - i_inf) * a_syn",
)
_INT_EULER = ("v = v + dt * r * x",)
_INT_EXACT = ("dv/dt = r * x",)
_LIF_ODE = "tau dv/dt = (v_leak - v) + r x"
_CUBA_ODE = "tau_syn di/dt = -i + w_in x;  tau_mem dv/dt = (v_leak - v) + r i"

PRIMITIVES: dict[str, Primitive] = {p.name: p for p in [
    Primitive("LIF", ("tau", "r", "v_leak", "v_threshold", "v_reset"), ("v",), True, _LIF_EULER, _LIF_EXACT,
              _LIF_ODE),
    Primitive("LI", ("tau", "r", "v_leak"), ("v",), False, _LIF_EULER, _LIF_EXACT, _LIF_ODE),
    Primitive("IF", ("r", "v_threshold", "v_reset"), ("v",), True, _INT_EULER, _INT_EXACT, "dv/dt = r x"),
    Primitive("I", ("r",), ("v",), False, _INT_EULER, _INT_EXACT, "dv/dt = r x"),
    Primitive("CubaLIF", ("tau_syn", "tau_mem", "r", "v_leak", "v_threshold", "v_reset", "w_in"), ("i", "v"),
              True, _CUBA_EULER, _CUBA_EXACT, _CUBA_ODE, exact_update=True),
    Primitive("CubaLI", ("tau_syn", "tau_mem", "r", "v_leak", "w_in"), ("i", "v"), False, _CUBA_EULER,
              _CUBA_EXACT, _CUBA_ODE, exact_update=True),
    Primitive("Threshold", ("threshold",), (), True, (), (), "z = x > threshold"),
]}

_PARAM_DOCS = {
    "tau": "membrane time constant (time unit of dt)", "tau_mem": "membrane time constant (time unit of dt)",
    "tau_syn": "synaptic time constant (time unit of dt)", "r": "input resistance", "w_in": "input weight of the current",
    "v_leak": "leak potential, also the initial potential", "v_threshold": "firing threshold (fires when v > v_threshold)",
    "v_reset": "potential after a spike", "threshold": "fires when x > threshold",
}
_POSITIVE = {"tau", "tau_mem", "tau_syn"}
_INITIAL = {"LIF": "v_leak", "LI": "v_leak", "CubaLIF": "v_leak", "CubaLI": "v_leak", "IF": "v_reset", "I": "0.0"}


def _num(v: float) -> str:
    return repr(float(v))


def neuron_text(kind: str, values: Mapping[str, float], dt: float, method: str = "euler", *,
                surrogate: str = DEFAULT_SURROGATE, learnable: Iterable[str] = (),
                shapes: Mapping[str, Sequence[int]] | None = None) -> str:
    """The `.neuron` text of a NIR primitive: its ODEs discretised with `method` over the step
    `dt`, `values` as the params' defaults (per-channel params, named in `shapes`, get their
    values at load)."""
    if kind not in PRIMITIVES:
        raise FlexDSLError(f"`{kind}` is not a NIR neuron primitive", "<flexdsl.nir>",
                           hint=did_you_mean(str(kind), PRIMITIVES) or "primitives: " + ", ".join(PRIMITIVES))
    if method not in METHODS:
        raise FlexDSLError(f"method must be 'euler' or 'exact', not {method!r}", "<flexdsl.nir>")
    p = PRIMITIVES[kind]
    learn = set(learnable)
    shapes = dict(shapes or {})
    how = {"euler": "forward Euler (the current first, then the membrane)" if len(p.states) == 2 else "forward Euler",
           "exact": "the exact solution, the input held constant over the step"}[method]
    lines = [
        f"# Generated by flexdsl.nir from a NIR {kind} node.",
        f"neuron Nir{kind}:",
        f'    """NIR {kind}: {p.ode}' + ("; spike when v > v_threshold, then v = v_reset." if kind not in
                                         ("Threshold",) and p.spiking else "."),
        f"    Discretised over a step dt: {how}." + '"""',
        '    input x                "input"',
        f'    param dt = {_num(dt)} where dt > 0    "time step"',
    ]
    for name in p.params:
        where = f" where {name} > 0" if name in _POSITIVE else ""
        doc = _PARAM_DOCS[name] + (f"; per neuron, shape {tuple(shapes[name])}" if name in shapes else "")
        lines.append(f"    param {name} = {_num(values[name])}{where}{' learnable' if name in learn else ''}"
                     f'    "{doc}"')
    if "v" in p.states:
        lines.append(f'    state v = {_INITIAL[kind]}    "membrane potential"')
    if "i" in p.states:
        lines.append('    state i = 0.0    "synaptic current"')
    lines.append("")
    if p.states:
        ode = method == "exact" and not p.exact_update
        lines.append("    equations method exact:" if ode else "    update:")
        lines += [f"        {s}" for s in (p.euler if method == "euler" else p.exact)]
        lines.append("")
    if kind == "Threshold":
        lines += [f"    spike when x > threshold surrogate {surrogate}", ""]
    elif p.spiking:
        lines += [f"    spike when v > v_threshold surrogate {surrogate}", "", "    on spike:", "        v = v_reset", ""]
    lines += [f"    output {p.output}", ""]
    return "\n".join(lines)


def _check_dt(dt: Any) -> float:
    """A step given to `load` or recorded in a graph: one real number (a number, or an array of
    one number), positive and finite; a bool, text, an empty or longer array are errors."""
    try:
        if isinstance(dt, bool | str | bytes) or type(dt).__name__ == "bool_":
            raise TypeError
        if isinstance(dt, int | float):
            d = float(dt)
        else:  # (numpy arrays and scalars, lists: one real number)
            import numpy as np

            a = np.asarray(dt)
            if a.size != 1 or a.dtype.kind not in "iuf":
                raise TypeError
            d = float(a.reshape(-1)[0])
    except (TypeError, ValueError, OverflowError):
        d = float("nan")
    if not (math.isfinite(d) and d > 0):
        shown = repr(dt) if len(repr(dt)) <= 60 else repr(dt)[:57] + "..."
        raise FlexDSLError(f"dt must be a positive finite number, not {shown}", "<flexdsl.nir>",
                           hint="NIR is continuous time: dt is the length of one flexdsl step in NIR's time unit")
    return d


_NUMBER = r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"  # ASCII digits, as the language
_SURROGATE = re.compile(rf"^\s*([a-z_][a-z0-9_]*)\s*\(\s*((?:[a-z_][a-z0-9_]*\s*=\s*{_NUMBER}\s*,?\s*)*)\)\s*$")
_KWARG = re.compile(rf"([a-z_][a-z0-9_]*)\s*=\s*({_NUMBER})")


def _surrogate(text: Any) -> str | None:
    """A built-in surrogate clause `name(k=number, ...)`, rebuilt from its parts (None if `text`
    is not one): nothing of the text reaches the generated model unchecked."""
    if not isinstance(text, str):
        return None
    m = _SURROGATE.match(text)
    if m is None or m.group(1) not in SURROGATES:
        return None
    known = SURROGATES[m.group(1)].defaults
    kwargs = _KWARG.findall(m.group(2))
    if any(k not in known for k, _ in kwargs) or len({k for k, _ in kwargs}) != len(kwargs):
        return None
    vals = [(k, float(v)) for k, v in kwargs]
    if not all(math.isfinite(v) for _, v in vals):
        return None
    return f"{m.group(1)}(" + ", ".join(f"{k}={v!r}" for k, v in vals) + ")"
