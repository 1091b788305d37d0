"""The registries of the language's built-in names, without sympy (the checker needs only
these, so loading a model never imports sympy).

- `FUNCTIONS`: one record per built-in function — arity, doc, numeric form (floats or
  tensors), the name of its sympy form (`flexdsl.ir.functions.SYMPY`, which also gives its
  derivative) and its spelling in each generated-code target. Printers dispatch from these
  records; `INTERNAL` holds the functions the lowering produces (spike, detach, sign, and
  `exprel`, the removable singularity of exact steps, with its derivative).
- `SURROGATES`: name, keyword defaults, `S'(x)` as text (the sympy form is in
  `flexdsl.ir.surrogates`).
- `METHODS`: the ODE integration methods, with aliases (implementations in
  `flexdsl.ir.integrate`).
- `UNIT_BASES`, `UNIT_PREFIXES`: the unit names a model may write (`ms`, `mV`, `nS`, `uF`,
  `cm`...); what they mean (scale and dimension) comes from `sympy.physics.units`, read by
  `flexdsl.frontend.dims` only when a model uses units.

A spelling is a format string over the printed arguments (`{0}`, `{1}`, ...). Targets:
`torch` (the generated torch core), `triton` (kernel code, float32), `host` (Python floats,
for loop invariants computed on the host).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

TARGETS = ("torch", "triton", "host")


def _is_tensor(a: Any) -> bool:
    torch = sys.modules.get("torch")  # no tensor can exist unless torch was imported
    return torch is not None and isinstance(a, torch.Tensor)


def _numeric(fmath: Callable[..., Any], ftorch: str) -> Callable[..., Any]:
    """A numeric form that takes floats (math) or tensors (the torch function `ftorch`)."""

    def f(*args: Any) -> Any:
        if any(_is_tensor(a) for a in args):
            import torch

            t = [a if isinstance(a, torch.Tensor) else torch.as_tensor(a, dtype=torch.float64) for a in args]
            if ftorch == "where":  # the condition is a truth value, whatever made it
                t[0] = t[0].to(torch.bool)
            return _TORCH_FORMS[ftorch](torch)(*t)
        return fmath(*args)

    f.__name__ = ftorch
    return f


_TORCH_FORMS: dict[str, Callable[[Any], Callable[..., Any]]] = {
    "exp": lambda t: t.exp, "log": lambda t: t.log, "sqrt": lambda t: t.sqrt, "abs": lambda t: t.abs,
    "sin": lambda t: t.sin, "cos": lambda t: t.cos, "tanh": lambda t: t.tanh, "sigmoid": lambda t: t.sigmoid,
    "relu": lambda t: t.relu, "minimum": lambda t: t.minimum, "maximum": lambda t: t.maximum,
    "clamp": lambda t: t.clamp, "where": lambda t: (lambda c, a, b: t.where(c.bool(), a, b)),
    "heaviside": lambda t: (lambda u: (u >= 0).to(u.dtype)),
    "heaviside_gt": lambda t: (lambda u: (u > 0).to(u.dtype)),
    "sign": lambda t: t.sign, "identity": lambda t: (lambda x: x),
    "exprel": lambda t: _torch_ops().exprel, "exprel_d": lambda t: _torch_ops().exprel_d,
}


def _torch_ops() -> Any:
    from ..backends.torch import ops

    return ops


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


# exprel(z) = (exp(z) - 1)/z (1 at z = 0) and its derivative, the removable singularities of an
# exact step: x*exp(a*dt) + b*dt*exprel(a*dt) is exact for every a, a = 0 included. exprel is
# expm1(z)/z (accurate to an ulp or two); its derivative ((z - 1)*exp(z) + 1)/z**2 cancels near
# 0, so for |z| < EXPREL_SERIES_BOUND it is a Taylor series, sum (k+1)/(k+2)! z**k: 20 terms
# reach float64 rounding on the whole interval, the first 12 float32 rounding (the Triton kernels).
EXPREL_SERIES_BOUND = 1.0
EXPREL_D_SERIES: tuple[float, ...] = tuple((k + 1) / math.factorial(k + 2) for k in range(20))
EXPREL_D_SERIES_F32: tuple[float, ...] = EXPREL_D_SERIES[:12]


def exprel_float(z: float) -> float:
    return math.expm1(z) / z if z != 0 else 1.0


def exprel_d_float(z: float) -> float:
    if abs(z) < EXPREL_SERIES_BOUND:
        acc = 0.0
        for c in reversed(EXPREL_D_SERIES):
            acc = acc * z + c
        return acc
    return ((z - 1.0) * math.exp(z) + 1.0) / (z * z)


@dataclass(frozen=True)
class Function:
    name: str
    arity: int
    doc: str
    numeric: Callable[..., Any]  # floats or tensors
    sympy: str  # key in flexdsl.ir.functions.SYMPY (the sympy form and its derivative)
    spell: Mapping[str, str] = field(default_factory=dict)  # target -> format string
    user: bool = True  # callable from a model (False: produced by the lowering)


@dataclass(frozen=True)
class Surrogate:
    """A built-in surrogate. With units, the spike rule's `u` has a unit; `scales` gives the
    power of u's unit that each keyword must have so that the surrogate's argument (`alpha*x`,
    `x/width`) is dimensionless and S'(u) has the unit of 1/u; a keyword not listed is
    dimensionless. `unitless_arg`: the formula has no scale keyword, so `u` itself must be
    dimensionless."""

    name: str
    defaults: dict[str, float]
    doc: str  # S'(x) as text
    source: str = "SpikingJelly"
    scales: dict[str, int] = field(default_factory=dict)
    unitless_arg: bool = False


@dataclass(frozen=True)
class Method:
    name: str
    doc: str
    aliases: tuple[str, ...] = ()


def _fn(name: str, arity: int, doc: str, numeric: Callable[..., Any], sympy: str, torch: str, triton: str,
        host: str, user: bool = True) -> Function:
    return Function(name, arity, doc, numeric, sympy, {"torch": torch, "triton": triton, "host": host}, user)


FUNCTIONS: dict[str, Function] = {
    f.name: f
    for f in [
        _fn("exp", 1, "exponential", _numeric(math.exp, "exp"), "exp",
            "torch.exp({0})", "tl.exp({0})", "math.exp({0})"),
        _fn("log", 1, "natural logarithm", _numeric(math.log, "log"), "log",
            "torch.log({0})", "tl.log({0})", "math.log({0})"),
        _fn("sqrt", 1, "square root", _numeric(math.sqrt, "sqrt"), "sqrt",
            "torch.sqrt({0})", "tl.sqrt({0})", "math.sqrt({0})"),
        _fn("abs", 1, "absolute value", _numeric(abs, "abs"), "Abs",
            "torch.abs({0})", "tl.abs({0})", "abs({0})"),
        _fn("sin", 1, "sine", _numeric(math.sin, "sin"), "sin",
            "torch.sin({0})", "tl.sin({0})", "math.sin({0})"),
        _fn("cos", 1, "cosine", _numeric(math.cos, "cos"), "cos",
            "torch.cos({0})", "tl.cos({0})", "math.cos({0})"),
        _fn("tanh", 1, "hyperbolic tangent", _numeric(math.tanh, "tanh"), "tanh",
            "torch.tanh({0})", "_tanh({0})", "math.tanh({0})"),
        _fn("sigmoid", 1, "logistic function 1/(1+exp(-x))", _numeric(_sigmoid, "sigmoid"), "sigmoid",
            "torch.sigmoid({0})", "tl.sigmoid({0})", "_sigmoid({0})"),
        _fn("relu", 1, "max(x, 0)", _numeric(lambda x: max(x, 0.0), "relu"), "relu",
            "torch.relu({0})", "tl.maximum({0}, 0.0)", "_relu({0})"),
        _fn("min", 2, "smaller of two values", _numeric(min, "minimum"), "fmin",
            "ops.minimum({0}, {1})", "tl.minimum({0}, {1})", "min({0}, {1})"),
        _fn("max", 2, "larger of two values", _numeric(max, "maximum"), "fmax",
            "ops.maximum({0}, {1})", "tl.maximum({0}, {1})", "max({0}, {1})"),
        _fn("clip", 3, "clip(x, lo, hi): x limited to [lo, hi]",
            _numeric(lambda x, lo, hi: min(max(x, lo), hi), "clamp"), "clip",
            "ops.clip({0}, {1}, {2})", "tl.minimum(tl.maximum({0}, {1}), {2})", "_clip({0}, {1}, {2})"),
        _fn("where", 3, "where(cond, a, b): a where cond holds, else b",
            _numeric(lambda c, a, b: a if c else b, "where"), "Where",
            "ops.where({0}, {1}, {2})", "tl.where({0}, {1}, {2})", "({1} if {0} else {2})"),
        _fn("heaviside", 1, "heaviside(u): 1 where u >= 0, else 0 (zero gradient)",
            _numeric(lambda u: 1.0 if u >= 0 else 0.0, "heaviside"), "heaviside",
            "ops.heaviside({0})", "tl.where({0} >= 0, 1.0, 0.0)", "(1.0 if {0} >= 0 else 0.0)"),
    ]
}

# Produced by the lowering, never written in a model. (The torch core prints the spike with
# its surrogate through `ops.fire_ge/gt`; these spellings are the plain forward values.)
INTERNAL: dict[str, Function] = {
    f.name: f
    for f in [
        _fn("spike_ge", 1, "the spike, u >= 0 fires", _numeric(lambda u: 1.0 if u >= 0 else 0.0, "heaviside"),
            "SpikeGE", "ops.heaviside_ge({0})", "tl.where({0} >= 0, 1.0, 0.0)", "(1.0 if {0} >= 0 else 0.0)",
            user=False),
        _fn("spike_gt", 1, "the spike, u > 0 fires", _numeric(lambda u: 1.0 if u > 0 else 0.0, "heaviside_gt"),
            "SpikeGT", "ops.heaviside_gt({0})", "tl.where({0} > 0, 1.0, 0.0)", "(1.0 if {0} > 0 else 0.0)",
            user=False),
        _fn("detach", 1, "the value, cut from the graph (detach_reset)", _numeric(lambda x: x, "identity"), "Detach",
            "ops.detach({0})", "{0}", "{0}", user=False),
        _fn("sign", 1, "sign of x", _numeric(lambda x: float((x > 0) - (x < 0)), "sign"), "sign",
            "torch.sign({0})", "tl.where({0} > 0, 1.0, tl.where({0} < 0, -1.0, 0.0))",
            "float(({0} > 0) - ({0} < 0))", user=False),
        _fn("exprel", 1, "(exp(z) - 1)/z, 1 at z = 0 (the exact step of a linear equation)",
            _numeric(exprel_float, "exprel"), "exprel", "ops.exprel({0})", "_exprel({0})", "_host_exprel({0})",
            user=False),
        _fn("exprel_d", 1, "the derivative of exprel, 1/2 at z = 0", _numeric(exprel_d_float, "exprel_d"),
            "exprel_d", "ops.exprel_d({0})", "_exprel_d({0})", "_host_exprel_d({0})", user=False),
    ]
}

ALL_FUNCTIONS: dict[str, Function] = {**FUNCTIONS, **INTERNAL}

CONSTANTS: dict[str, float] = {"pi": math.pi}

SURROGATES: dict[str, Surrogate] = {
    s.name: s
    for s in [
        Surrogate("sigmoid", {"alpha": 4.0}, "alpha*sigma(alpha*x)*(1-sigma(alpha*x))", scales={"alpha": -1}),
        Surrogate("atan", {"alpha": 2.0}, "(alpha/2)/(1+(pi/2*alpha*x)^2)", scales={"alpha": -1}),
        Surrogate("piecewise_quadratic", {"alpha": 1.0}, "alpha-alpha^2*|x| where |x| <= 1/alpha, else 0",
                  scales={"alpha": -1}),
        Surrogate("piecewise_exp", {"alpha": 1.0}, "(alpha/2)*exp(-alpha*|x|)", scales={"alpha": -1}),
        Surrogate("soft_sign", {"alpha": 2.0}, "1/(2*alpha*(1/alpha+|x|)^2)", scales={"alpha": -1}),
        Surrogate("super_spike", {"alpha": 1.0}, "alpha/(|x|+1)^2", unitless_arg=True),
        Surrogate("erf", {"alpha": 2.0}, "(alpha/sqrt(pi))*exp(-(alpha*x)^2)", scales={"alpha": -1}),
        Surrogate("fast_sigmoid", {"slope": 25.0}, "1/(slope*|x|+1)^2", "snnTorch; Norse `super`",
                  unitless_arg=True),
        Surrogate("triangle", {"alpha": 1.0}, "alpha*relu(1-alpha*|x|)", scales={"alpha": -1}),
        Surrogate("rect", {"alpha": 1.0}, "alpha where |x| < 1/(2*alpha), else 0", scales={"alpha": -1}),
        Surrogate("straight_through", {}, "1", unitless_arg=True),
        Surrogate("pseudo_derivative", {"gamma": 0.3, "width": 1.0}, "gamma/width*relu(1-|x|/width)",
                  "Bellec et al. 2018 (LSNN)", scales={"width": 1}),
        Surrogate("norse_triangle", {"alpha": 0.3}, "alpha*relu(1-|x|)", "Norse `triangle`", unitless_arg=True),
        Surrogate("norse_tanh", {"k": 1.0}, "1-tanh(k*x)^2", "Norse `tanh`", unitless_arg=True),
    ]
}

DEFAULT_SURROGATE = "sigmoid"

METHODS: dict[str, Method] = {
    m.name: m
    for m in [
        Method("exact", "linear systems with state-free coefficients: the matrix exponential", ("linear",)),
        Method("exponential_euler", "each equation linear in its own state: x_inf + (x - x_inf)*exp(a*dt)"),
        Method("euler", "explicit Euler: x + dt*f(x)"),
        Method("rk2", "explicit midpoint: x + dt*f(x + dt/2*f(x))", ("midpoint",)),
        Method("rk4", "classical fourth-order Runge-Kutta"),
        Method("heun", "explicit trapezoid: x + dt/2*(f(x) + f(x + dt*f(x)))"),
    ]
}

METHOD_ALIASES: dict[str, str] = {a: m.name for m in METHODS.values() for a in m.aliases}

# Attributes of the torch module a model is loaded as (`torch.nn.Module` and `NeuronModule`):
# params and states are attributes by name, so they cannot take these names. (A test checks
# that this covers every public attribute of the installed torch's nn.Module.)
MODULE_ATTRIBUTES: frozenset[str] = frozenset("""
    T_destination add_module apply bfloat16 buffers call_super_init children compile cpu cuda double
    dump_patches eval extra_repr float forward get_buffer get_extra_state get_parameter get_submodule half
    ipu load_state_dict modules mtia named_buffers named_children named_modules named_parameters parameters
    register_backward_hook register_buffer register_forward_hook register_forward_pre_hook
    register_full_backward_hook register_full_backward_pre_hook register_load_state_dict_post_hook
    register_load_state_dict_pre_hook register_module register_parameter register_state_dict_post_hook
    register_state_dict_pre_hook requires_grad_ set_extra_state set_submodule share_memory state_dict to
    to_empty train training type xpu zero_grad
    backend check_finite compiled core detach detach_reset initial_state neuron_text param_values reset state_names
    state_seqs
    step step_mode store_state_seqs
    memories named_memories register_memory set_reset_value get_reset_value supported_step_mode
    single_step_forward multi_step_forward functional_forward materialize_states single_step_functional_forward
    multi_step_functional_forward
""".split())

# ---------------------------------------------------------------- units
# Unit names: a base (a `sympy.physics.units` quantity) with an optional SI prefix, short
# (`ms`, `mV`, `nS`, `uF`, `cm`, `mM`) or Brian2's long form (`msecond`, `mvolt`, `namp`).
UNIT_BASES: dict[str, str] = {
    "s": "second", "second": "second",
    "m": "meter", "metre": "meter", "meter": "meter",
    "V": "volt", "volt": "volt",
    "A": "ampere", "amp": "ampere", "ampere": "ampere",
    "S": "siemens", "siemens": "siemens",
    "F": "farad", "farad": "farad",
    "ohm": "ohm", "Ohm": "ohm",
    "C": "coulomb", "coulomb": "coulomb",
    "Hz": "hertz", "hertz": "hertz",
    "mol": "mole", "mole": "mole",
    "M": "molar", "molar": "molar",  # mol/liter
    "K": "kelvin", "kelvin": "kelvin",
}

# prefix as written -> its key in sympy.physics.units.prefixes.PREFIXES
UNIT_PREFIXES: dict[str, str] = {
    "f": "f", "p": "p", "n": "n", "u": "mu", "m": "m", "c": "c", "k": "k", "M": "M", "G": "G",
}


def unit_parts(name: str) -> tuple[str, str] | None:
    """(prefix, base) of a unit name (`"ms"` -> `("m", "s")`, `"mol"` -> `("", "mol")`), or None."""
    if name in UNIT_BASES:
        return "", name
    if len(name) > 1 and name[0] in UNIT_PREFIXES and name[1:] in UNIT_BASES:
        return name[0], name[1:]
    return None


def is_unit(name: str) -> bool:
    return unit_parts(name) is not None
