"""The layer level: `CheckedLayer` -> `LayerPlan`, what a layer's call computes and in which part
of its time loop, derived with sympy like the neuron's step.

A synapse is a per-connection current (`current`, a sympy expression of the weight `w` and the
presynaptic value `pre`: `w*pre` for every connectivity this version runs) summed into its
postsynaptic port: over the presynaptic neurons (`dense`, `mask`) or one to one. Its backward is
derived from that expression: `dI/dw` and `dI/dpre`; a current bilinear in (w, pre) makes every
reduction a product over all steps at once:

    lowered   I_port[t] = sum_j current(W[i, j], pre[t, j])  (+ b)        per synapse
    derived   dL/dW = sum_{t, batch} g[t]^T pre[t]   dL/dpre = g W   dL/db = sum g   (dense, mask)
              dL/dw = sum_{t, batch} g * pre          dL/dpre = g * w                (one_to_one)
    schedule  before the loop: the synapses whose `pre` is a layer input (one product over T*batch);
              inside: the recurrent synapse (its `pre` is the neuron's output one step late: the scan);
              after: every weight's gradient (one product over T*batch, from the port's gradient g)

The plan is data (`to_dict`/`from_dict`): the store keeps it in the disk cache, so a process that
has seen a layer builds it without sympy. `scan` is what a backend's layer scan is made from.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .._sympy import load as load_sympy
from ..frontend.layer import CheckedLayer, CheckedSynapse


@dataclass(frozen=True)
class SynapsePlan:
    name: str
    pre: str
    port: int  # the neuron's input it feeds
    recurrent: bool
    pre_index: int  # the layer input (or, recurrent, the neuron output) it carries
    connect: str  # "dense", "one_to_one", "mask"
    bias: str | None
    hoisted: bool  # computed before the loop, for all steps at once
    fused: bool  # the scan's input product (x W^T + b, exact where the backend can), not a separate one
    current: str  # the per-connection current, as derived (`w*pre`)
    grad_weight: str  # "product" (g^T pre over T*batch) or "reduce" (sum of g*pre)
    grad_pre: str  # "product" (g W) or "scale" (g*w)
    delay_kind: str | None = None  # "uniform", "axonal", "synaptic", "dendritic" (fixed delays: the layer's history)
    delay: int = 0  # steps (uniform), or the largest (the others)
    delay_interp: str | None = None  # learnable delays: their relaxation ("gauss", "linear"); None: fixed


@dataclass(frozen=True)
class ScanPlan:
    port: int
    source: int
    dense: bool


@dataclass(frozen=True)
class LayerPlan:
    name: str
    size: int
    synapses: tuple[SynapsePlan, ...]
    scan: ScanPlan | None  # the recurrent loop (None: a feed-forward layer runs the neuron's own program)
    direct: tuple[str, ...]
    equations: tuple[str, ...]  # the lowered and derived equations, for `flexdsl show` and the docs

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> LayerPlan:
        syns = tuple(SynapsePlan(**s) for s in d["synapses"])
        scan = ScanPlan(**d["scan"]) if d["scan"] is not None else None
        return LayerPlan(d["name"], d["size"], syns, scan, tuple(d["direct"]), tuple(d["equations"]))

    def synapse(self, name: str) -> SynapsePlan:
        return next(s for s in self.synapses if s.name == name)


def derive_current(current: str) -> tuple[str, str]:
    """(grad_weight, grad_pre) of a per-connection current in `w` and `pre`, from its derivatives:
    bilinear (d/dw = pre, d/dpre = w, no other term) makes both gradients products."""
    sp = load_sympy()
    w, pre = sp.Symbol("w"), sp.Symbol("pre")
    expr = sp.sympify(current, locals={"w": w, "pre": pre})
    dw, dpre = sp.diff(expr, w), sp.diff(expr, pre)
    if sp.simplify(dw - pre) != 0 or sp.simplify(dpre - w) != 0:
        raise NotImplementedError(f"a synaptic current `{current}` that is not w*pre")  # (none this version)
    return "product", "product"


def _synapse_plan(layer: CheckedLayer, s: CheckedSynapse, fused: bool) -> SynapsePlan:
    current = "w*pre"
    gw, gp = derive_current(current)
    if s.connect == "one_to_one":  # (the sum over presynaptic neurons is one term: elementwise)
        gw, gp = "reduce", "scale"
    return SynapsePlan(s.name, s.pre, s.port_index, s.recurrent, s.pre_index, s.connect, s.bias, not s.recurrent,
                       fused, current, gw, gp, s.delay_kind, s.delay, s.delay_interp)


def plan_layer(layer: CheckedLayer) -> LayerPlan:
    """The layer's plan (see the module's docstring)."""
    rec = layer.recurrent
    scan = None
    fused_name = None
    if rec is not None:
        scan = ScanPlan(rec.port_index, rec.pre_index, rec.connect != "one_to_one")
        into = [s for s in layer.synapses if not s.recurrent and s.port_index == rec.port_index]
        if len(into) == 1 and into[0].connect == "dense":  # (the scan's fused input product)
            fused_name = into[0].name
    syns = tuple(_synapse_plan(layer, s, s.name == fused_name) for s in layer.synapses)
    return LayerPlan(layer.name, layer.size, syns, scan, layer.direct, tuple(_equations(layer, syns)))


def _delayed_time(s: SynapsePlan) -> str:
    """The step a synapse reads its presynaptic value at (the postsynaptic index is `i`)."""
    base = "t-1" if s.recurrent else "t"
    if s.delay_kind == "uniform" and s.delay:
        return f"{base}-{s.delay}"
    if s.delay_kind == "axonal":
        return f"{base}-{s.name}_delay[j]"
    return base


def _equations(layer: CheckedLayer, syns: tuple[SynapsePlan, ...]) -> list[str]:
    out = []
    for s in syns:
        t = _delayed_time(s)
        w = f"({s.name} * mask)" if s.connect == "mask" else s.name
        j = "i" if s.connect == "one_to_one" else "j"
        tj = t.replace("[j]", f"[{j}]") if s.delay_kind != "synaptic" else f"{t}-{s.name}_delay[i, j]"
        term = (f"{w}[i] * {s.pre}[{tj}, i]" if s.connect == "one_to_one" else f"sum_j {w}[i, j] * {s.pre}[{tj}, j]")
        port = layer.neuron.inputs[s.port].name
        lhs = f"{port}[t, i]" if s.delay_kind != "dendritic" else f"{port}[t + {s.name}_delay[i], i]"
        out.append(f"{lhs} += {term}" + (f" + {s.bias}[i]" if s.bias else "")
                   + (("   (in the loop)" if s.delay_kind is None else "   (in a loop of the neuron's steps, the source's "
                       f"last {s.delay + 1} values kept: not the fused scan)") if s.recurrent
                      else "   (before the loop, all steps at once)"))
        if s.delay_kind not in (None, "uniform") and s.delay_interp is None:
            out.append(f"  {s.name}_delay: integers from 0 to {s.delay} (given at load: delays=); the layer keeps "
                       f"the last {s.delay + 1 if s.recurrent else s.delay} steps between calls")
        elif s.delay_kind not in (None, "uniform"):
            d, sig = f"{s.name}_delay", f"{s.name}_delay_width"
            g = (f"exp(-(k - {d})^2 / (2 {sig}^2)) / sum_k' exp(-(k' - {d})^2 / (2 {sig}^2))"
                 if s.delay_interp == "gauss" else f"max(0, 1 - |k - {d}|)")
            out.append(f"  {d}: learnable real delays in [0, {s.delay}] steps; a value at t-{d} is the sum over the "
                       f"steps k = 0..{s.delay} of g_k * value[t-k], g_k = {g} ({s.delay_interp}; "
                       f"{sig} = 0, or m.round_delays(): whole steps); the layer keeps the last "
                       f"{s.delay + 1 if s.recurrent else s.delay} steps between calls")
    for s in syns:
        port = layer.neuron.inputs[s.port].name
        t = "t-1" if s.recurrent else "t"
        if s.delay_kind is not None:
            out.append(f"dL/d{s.name}, dL/d{s.pre}" + (f", dL/d{s.name}_delay" if s.delay_interp else "") +
                       ": autograd through the delayed values (index operations and products over the kept steps)")
        elif s.grad_weight == "product":
            out.append(f"dL/d{s.name} = sum_(t,batch) dL/d{port}[t]^T {s.pre}[{t}]   (after the loop, one product)")
        else:
            out.append(f"dL/d{s.name} = sum_(t,batch) dL/d{port}[t] * {s.pre}[{t}]   (after the loop)")
        if s.bias:
            out.append(f"dL/d{s.bias} = sum_(t,batch) dL/d{port}[t]")
    return out


__all__ = ["LayerPlan", "ScanPlan", "SynapsePlan", "derive_current", "plan_layer"]
