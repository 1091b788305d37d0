"""The registries of the language's built-in names, without sympy (the checker needs only
these, so loading a model never imports sympy).

- `FUNCTIONS`: one record per built-in function — arity, doc, numeric form (floats or
  tensors, `numeric.py`) and the name of its sympy form (`flexdsl.ir.functions.SYMPY`, which
  also gives its derivative). How a target spells it is the target's business: each code
  printer has a `SPELL` table (`flexdsl.backends`), checked to cover every record here;
  `INTERNAL` holds the functions the lowering produces (spike, detach, sign, and `exprel_d`,
  the derivative of `exprel`, whose removable singularity exact steps and rate functions avoid).
- `DRAWS`: the random draws of a step, `randn()` and `rand()` (not functions: a draw has no
  value outside a step, and a printer spells it only where its backend draws noise); the white
  noise of an ODE is a name, `xi` or `xi_<suffix>` (`is_noise_name`), with Brian2's meaning;
- `SURROGATES`: name, keyword defaults, `S'(x)` as text (the sympy form is in
  `flexdsl.ir.surrogates`).
- `METHODS`: the ODE integration methods, with aliases (implementations in
  `flexdsl.ir.integrate`).
- `UNIT_BASES`, `UNIT_PREFIXES`: the unit names a model may write (`ms`, `mV`, `nS`, `uF`,
  `cm`...); what they mean (scale and dimension) comes from `sympy.physics.units`, read by
  `flexdsl.frontend.dims` only when a model uses units.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .numeric import exprel_d_float, exprel_float, numeric, sigmoid_float


@dataclass(frozen=True)
class Function:
    name: str
    arity: int
    doc: str
    numeric: Callable[..., Any]  # floats or tensors (`numeric.py`)
    sympy: str  # key in flexdsl.ir.functions.SYMPY (the sympy form and its derivative)
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


def _fn(name: str, arity: int, doc: str, numeric_form: Callable[..., Any], sympy: str, user: bool = True) -> Function:
    return Function(name, arity, doc, numeric_form, sympy, user)


FUNCTIONS: dict[str, Function] = {
    f.name: f
    for f in [
        _fn("exp", 1, "exponential", numeric(math.exp, "exp"), "exp"),
        _fn("log", 1, "natural logarithm", numeric(math.log, "log"), "log"),
        _fn("sqrt", 1, "square root", numeric(math.sqrt, "sqrt"), "sqrt"),
        _fn("abs", 1, "absolute value", numeric(abs, "abs"), "Abs"),
        _fn("sin", 1, "sine", numeric(math.sin, "sin"), "sin"),
        _fn("cos", 1, "cosine", numeric(math.cos, "cos"), "cos"),
        _fn("tanh", 1, "hyperbolic tangent", numeric(math.tanh, "tanh"), "tanh"),
        _fn("sigmoid", 1, "logistic function 1/(1+exp(-x))", numeric(sigmoid_float, "sigmoid"), "sigmoid"),
        _fn("relu", 1, "max(x, 0)", numeric(lambda x: max(x, 0.0), "relu"), "relu"),
        _fn("exprel", 1, "(exp(z) - 1)/z, 1 at z = 0, from expm1: no 0/0 (rate functions such as x/(1 - exp(-x)) "
            "= 1/exprel(-x), as Brian2 writes them; the exact step of a linear equation)",
            numeric(exprel_float, "exprel"), "exprel"),
        _fn("min", 2, "smaller of two values", numeric(min, "minimum"), "fmin"),
        _fn("max", 2, "larger of two values", numeric(max, "maximum"), "fmax"),
        _fn("clip", 3, "clip(x, lo, hi): x limited to [lo, hi]",
            numeric(lambda x, lo, hi: min(max(x, lo), hi), "clamp"), "clip"),
        _fn("where", 3, "where(cond, a, b): a where cond holds, else b",
            numeric(lambda c, a, b: a if c else b, "where"), "Where"),
        _fn("heaviside", 1, "heaviside(u): 1 where u >= 0, else 0 (zero gradient)",
            numeric(lambda u: 1.0 if u >= 0 else 0.0, "heaviside"), "heaviside"),
    ]
}

# Produced by the lowering, never written in a model. (The torch core prints the spike with
# its surrogate through `ops.fire_ge/gt`; the numeric forms are the plain forward values.)
INTERNAL: dict[str, Function] = {
    f.name: f
    for f in [
        _fn("spike_ge", 1, "the spike, u >= 0 fires", numeric(lambda u: 1.0 if u >= 0 else 0.0, "heaviside"),
            "SpikeGE", user=False),
        _fn("spike_gt", 1, "the spike, u > 0 fires", numeric(lambda u: 1.0 if u > 0 else 0.0, "heaviside_gt"),
            "SpikeGT", user=False),
        _fn("detach", 1, "the value, cut from the graph (detach_reset)", numeric(lambda x: x, "identity"), "Detach",
            user=False),
        _fn("sign", 1, "sign of x", numeric(lambda x: float((x > 0) - (x < 0)), "sign"), "sign", user=False),
        _fn("exprel_d", 1, "the derivative of exprel, 1/2 at z = 0", numeric(exprel_d_float, "exprel_d"),
            "exprel_d", user=False),
    ]
}

ALL_FUNCTIONS: dict[str, Function] = {**FUNCTIONS, **INTERNAL}


@dataclass(frozen=True)
class Draw:
    """A random draw of a step (`randn()`, `rand()`): one value per step and element, from the
    counter-based generator (the same on every backend); `sympy` names its sympy form."""

    name: str
    doc: str
    sympy: str


DRAWS: dict[str, Draw] = {
    d.name: d
    for d in [
        Draw("randn", "a standard normal number, drawn anew at every step for every element", "Randn"),
        Draw("rand", "a uniform number in (0, 1), drawn anew at every step for every element", "Rand"),
    ]
}


def is_noise_name(name: str) -> bool:
    """`xi` or `xi_<suffix>`: Gaussian white noise in an ODE (Brian2's names; unit 1/sqrt(time)),
    independent sources for different names."""
    return name == "xi" or (name.startswith("xi_") and len(name) > 3)

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
        Surrogate("spike_rate_escape", {"beta": 1.0, "slope": 25.0}, "slope*exp(-beta*|x-1|)",
                  "snnTorch `spike_rate_escape`", unitless_arg=True),
    ]
}

DEFAULT_SURROGATE = "sigmoid"
# the default of a stochastic spike rule (`spike when rand() < p`): S' = 1, so d spike / d p is 1, the
# derivative of the firing probability P(spike) = p (Bengio et al. 2013's straight-through estimator)
STOCHASTIC_SURROGATE = "straight_through"

METHODS: dict[str, Method] = {
    m.name: m
    for m in [
        Method("exact", "linear systems with state-free coefficients: the matrix exponential; with additive noise "
                        "the exact variance (Ornstein-Uhlenbeck)", ("linear",)),
        Method("exponential_euler", "each equation linear in its own state: x_inf + (x - x_inf)*exp(a*dt)"),
        Method("euler", "explicit Euler: x + dt*f(x); with noise, Euler-Maruyama: + g(x)*sqrt(dt)*randn()"),
        Method("rk2", "explicit midpoint: x + dt*f(x + dt/2*f(x))", ("midpoint",)),
        Method("rk4", "classical fourth-order Runge-Kutta"),
        Method("heun", "explicit trapezoid: x + dt/2*(f(x) + f(x + dt*f(x))); with noise, the stochastic Heun "
               "method (Stratonovich)"),
        Method("milstein", "stochastic: Brian2's derivative-free Milstein method (one noise source per "
                           "equation, Stratonovich)"),
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
