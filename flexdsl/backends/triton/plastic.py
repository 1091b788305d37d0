"""The Triton backend's online plastic layer: one kernel runs a feed-forward layer whose weights a
plasticity rule changes after every step (`plasticity="online"`), for the whole call
(`templates/plastic.py.j2`), printed from the neuron's forward step (as the recurrent scan prints
it: `recurrent.forward_view`) and the rule's plan (`ir/rule.py`: its postsynaptic states and the
factors `c_k(w) * a_k(post side) * b_k(pre side)` of the weight's change).

Each program owns rows of W (postsynaptic neurons) for the whole batch and streams them once a
step: the previous step's change is added to them (one `[rows, B] x [B, cols]` product per term, and
the bounds) and this step's input product is taken from the changed rows in the same pass; the
neuron's step, the rule's postsynaptic states and the terms' `a_k` follow in registers. Rows share
nothing, so no program waits for another. What runs here is what `runtime/rulesteps.ProductSteps`
runs step by step (the reference): the same order (the step's product with the weights before the
step's change), float32 arithmetic; the products on tensor cores as three TF32 parts
(`input_precision="tf32x3"`, float32's accuracy; IEEE float32 in Triton's interpreter).

Served: a rule whose change factors, read only `pre`/`post` (no modulators or `post_<x>` inputs, no
`output`), a neuron model without random draws whose only input is the port, float32, no gradient
wanted; anything else takes the step-by-step loop (`runtime/plastic.py` decides).
"""

from __future__ import annotations

import threading
from typing import Any

import sympy as sp
import torch

from ...ir.functions import SpikeGE, SpikeGT
from ...settings import env_choice, env_int
from ...store import cache
from ...store.generated import load_module
from ..base import IR
from ..exact import exact_in_tf32
from .args import lane_param
from .emit import _env
from .kernel import Launcher
from .launch import LAUNCHES, interpret
from .recurrent import _sm_count, forward_view

TEMPLATE = "plastic.py.j2"
_R = "_r_"  # the rule's names in the kernel (apart from the neuron's)


def emit_plastic(ir: IR, rule_ir: Any, port: int, source: int) -> tuple[str, dict[str, Any]]:
    """The neuron's kernels module with the online plastic kernel of rule `rule_ir` appended, and
    its metadata."""
    from ...ir.rule import NEXT, plan_rule

    base, abi, P, fwd, param_loads, param_block = forward_view(ir, port, source)
    rule = rule_ir.rule
    step = rule_ir.step
    plan = plan_rule(step, rule.weight, rule.output)
    if plan.terms is None or step.draws:
        raise NotServed(f"rule {rule.name}: its change does not factor, or it draws random numbers")
    names = plan.of_side("post") + plan.of_side("global")
    known = {"post", rule.weight, *names, *(NEXT + n for n in names), *(p.name for p in step.params)}
    for e in [*(plan.next[n] for n in names), *(x for t in plan.terms for x in t[:2])]:
        unknown = {f.name for f in e.free_symbols} - known
        if unknown:  # (the time, a modulator: not what this kernel reads)
            raise NotServed(f"rule {rule.name}: its postsynaptic side reads {', '.join(sorted(unknown))}")
    syms: dict[str, sp.Symbol] = {}

    def ren(e: sp.Expr) -> sp.Expr:
        return e.xreplace({s: syms.setdefault(s.name, sp.Symbol(_R + s.name, real=True)) for s in e.free_symbols})

    pr = P.pr._print
    rule_next = [(pr(sp.Symbol(_R + NEXT + n, real=True)), pr(ren(plan.next[n]))) for n in names]
    # terms with the same c(w) up to a constant share one accumulator (the constant goes into a_k)
    groups: dict[sp.Expr, list[int]] = {}
    a = []
    post_sym, pre_sym = sp.Symbol("post", real=True), sp.Symbol("pre", real=True)
    terms = [(c, -a, pre_sym) if b == -pre_sym else (c, a, b) for c, a, b in plan.terms]  # (b = pre: the input)
    for k, (ck, ak, _) in enumerate(terms):
        coeff, rest = sp.sympify(ck).as_coeff_Mul()
        groups.setdefault(rest, []).append(k)
        a.append(pr(ren(coeff * ak)))
    # operands exact in TF32 (one product instead of a split): a_k = +-post where the neuron's
    # output is a spike (0/1); b_k = +-pre where the call's input is (`_XEXACT`, checked per call)
    binary = isinstance(dict(ir.step.assignments).get(dict(ir.step.outputs)[ir.step.outputs[source][0]]),
                        (SpikeGE, SpikeGT))
    exact_a = [bool(binary and sp.sympify(t[0]).as_coeff_Mul()[0] * t[1] in (post_sym, -post_sym))
               for t in terms]
    exact_b = ["_XEXACT" if t[2] == pre_sym else "False" for t in terms]
    group_view = [{"index": i, "c": pr(ren(rest)), "terms": ks} for i, (rest, ks) in enumerate(groups.items())]
    params = [p.name for p in step.params]
    used = {n for n in syms if n in params}
    rule_params = [n for n in params if n in used]
    src_value = next(o["value"] for o in fwd.outputs if o["source"])
    src = _env().get_template(TEMPLATE).render(
        model=ir.step.name, rule=rule.name, port=ir.step.inputs[port].name,
        nterms=len(plan.terms), param_loads=param_loads, param_block=param_block, fwd=fwd,
        rule_params=[pr(sp.Symbol(_R + n, real=True)) for n in rule_params],
        rule_states=[pr(sp.Symbol(_R + n, real=True)) for n in names],
        next_names=[pr(sp.Symbol(_R + NEXT + n, real=True)) for n in names],
        rule_next=rule_next, groups=group_view, a=a, exact_a=exact_a, exact_b=exact_b, weight=pr(sp.Symbol(_R + rule.weight, real=True)),
        post=pr(sp.Symbol(_R + "post", real=True)), source_value=src_value)
    meta = {"abi": abi.to_dict(), "port": port, "source": source, "rule_states": names, "rule_params": rule_params,
            "hoisted_fwd": [h["arg"] for h in fwd.hoisted], "terms": len(plan.terms),
            "b_is_pre": [t[2] == pre_sym for t in terms]}
    return base + src, meta


class NotServed(ValueError):
    """A rule this kernel does not run (the layer's step-by-step loop does)."""


class PlasticProgram:
    """The online plastic kernel of one neuron model, port, source and rule."""

    def __init__(self, module: Any, meta: dict[str, Any]) -> None:
        from .abi import KernelABI

        self.mod = module
        self.meta = meta
        self.abi = KernelABI.from_dict(meta["abi"])
        self.kernel = Launcher(module._plastic_fwd_kernel)
        self.interpret = interpret()

    def forward(self, x: torch.Tensor, b: list[torch.Tensor], ext: torch.Tensor | None, w: torch.Tensor,
                states: list[Any], rule_states: list[Any], params: list[Any], rule_params: dict[str, float],
                lo: float | None, hi: float | None, x_exact: bool | None = None
                ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        """Run the call: `x` [T, B, NI], `b` the terms' presynaptic factors ([T, B, NI] each; those the
        kernel reads from `x` itself, `meta["b_is_pre"]`, are not read), `ext` [T, B, H] or None, `w` [H, NI]
        float32 contiguous (changed in place); states and params as floats or tensors broadcasting to
        [B, H]; `x_exact`: whether `x` is exact in TF32 (`exact.exact_in_tf32`; None: checked here). Returns (outputs [T, B, H] each, the neuron's final states, the rule's final states),
        the states [B, H]."""
        T, B, NI = x.shape
        H = w.shape[0]
        dev = x.device
        N = B * H
        outs = [torch.empty((T, B, H), dtype=torch.float32, device=dev) for _ in self.abi.outputs]
        st = _stack(states, B, H, dev)
        rst = _stack(rule_states, B, H, dev)
        if T and N and NI:
            bb = max(16, 1 << (B - 1).bit_length())
            bm = env_int("FLEXDSL_PLASTIC_BM") or (16 if self.interpret else 128)
            bn = env_int("FLEXDSL_PLASTIC_BN") or 32
            warps = env_int("FLEXDSL_PLASTIC_WARPS") or (4 if self.interpret else 8)
            stages = env_int("FLEXDSL_PLASTIC_STAGES") or 3
            rb = -(-H // bm)
            split = 1
            if not self.interpret:  # (Triton's interpreter runs one program after another: no waiting)
                sms = _sm_count(dev.index or 0)
                split = max(1, min(sms // rb, -(-NI // (4 * bn)))) if rb <= sms // 2 else 1
                split = env_int("FLEXDSL_PLASTIC_SPLIT") or split
                if rb * split > sms:
                    split = max(1, sms // rb)
            per = -(-NI // split)
            cw = -(-per // bn) * bn  # (each program's columns: whole blocks)
            split = -(-NI // cw)
            part = torch.empty((2, split, N), dtype=torch.float32, device=dev) if split > 1 else st
            bar = torch.zeros(rb, dtype=torch.int32, device=dev)
            kw: dict[str, Any] = {"_X": x, "_ext": ext if ext is not None else x, "_W": w, "_st": st,
                                  "_rst": rst, "_lo": 0.0 if lo is None else float(lo),
                                  "_hi": 0.0 if hi is None else float(hi), "_B": B, "_H": H, "_NI": NI, "_T": T,
                                  "_HOST": False, "_ROUND": False, "_EXT": ext is not None, "_LO": lo is not None,
                                  "_HI": hi is not None, "_XEXACT": exact_in_tf32(x) if x_exact is None else x_exact,
                                  "_PREC": "ieee" if self.interpret else (env_choice("FLEXDSL_PLASTIC_PRECISION")
                                                                          or "tf32x3"),
                                  "_BB": bb, "_BM": bm, "_BN": bn, "_C": split, "_CW": cw, "_P": part,
                                  "_bar": bar}
            for k, bk in enumerate(b):
                kw[f"_B{k}"] = x if self.meta["b_is_pre"][k] else bk.to(torch.float32).contiguous()
            for k, name in enumerate(self.abi.outputs):
                kw[self.abi.name_of("out", name)] = outs[k]
            for name, p in zip(self.abi.params, params):
                kw[self.abi.name_of("param", name)], kw[self.abi.name_of("mode", name)] = lane_param(p, B, H, dev)
            for h in self.meta["hoisted_fwd"]:
                kw[h] = 0.0
            for n in self.meta["rule_params"]:
                kw[_R + n] = float(rule_params[n])
            self.kernel((rb * split,), num_warps=warps, num_stages=stages, **kw)
            LAUNCHES["plastic_fwd"] += 1
        fins = [st[i].view(B, H) for i in range(st.shape[0])]
        rfins = [rst[i].view(B, H) for i in range(rst.shape[0])]
        return outs, fins, rfins


def _stack(vals: list[Any], B: int, H: int, dev: torch.device) -> torch.Tensor:
    out = torch.empty((max(len(vals), 1), B * H), dtype=torch.float32, device=dev)
    for i, v in enumerate(vals):
        if isinstance(v, torch.Tensor):
            out[i].copy_(v.detach().to(torch.float32).expand(B, H).reshape(B * H))
        else:
            out[i].fill_(float(v))
    return out


_PROGRAMS: dict[str, PlasticProgram | None] = {}
_LOCK = threading.Lock()


def program(ir: IR, key: str, rule_ir: Any, rule_key: str, port: int, source: int) -> PlasticProgram | None:
    """The online plastic kernel of neuron `ir` (its Triton artefact's `key`) and rule `rule_ir`
    (cached on disk like every artefact, loaded once per process), or None for a rule it does not run."""
    k = cache.key(key, rule_key, "plastic", str(port), str(source))
    if k not in _PROGRAMS:
        with _LOCK:
            if k not in _PROGRAMS:
                try:
                    art = cache.get_or_make(k, lambda: cache.Artefact("tritonplastic",
                                                                      *emit_plastic(ir, rule_ir, port, source)))
                    _PROGRAMS[k] = PlasticProgram(load_module("tritonplastic", k, art.source), art.meta)
                except NotServed:
                    _PROGRAMS[k] = None
    return _PROGRAMS[k]


__all__ = ["PlasticProgram", "emit_plastic", "program"]
