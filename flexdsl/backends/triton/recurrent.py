"""The Triton backend's recurrent scan: a persistent kernel per direction for a whole recurrent
layer (`templates/recurrent.py.j2`), printed from the same schedule as the neuron's own kernels
(the forward body, the save plan, the derived backward), so any model runs in it.

Per step and tile of the `[B, H]` step, a program computes the recurrent product of the previous
step (`tl.dot`), the neuron's step on it, and stores the outputs; a grid barrier separates the
steps (every program is resident: at most one per multiprocessor). The backward walks back the
same way, the source's gradient taking `gI[t + 1] W` (gI: the port's gradient), and writes `gI`
for the products after the loop (`backends/recurrent.py`).

The recurrent product exploits binary spikes. In float32 on CUDA the forward runs it in fixed
point (`split_fixed`): each neuron's row of W as a 31-bit integer of its binary range in four
int8 digits, the spikes in int8 (`_Sb`), four int8 tensor-core products summed exactly in
int32, combined in int64 and rounded once to float32 (error per spike within 2^-31 of the row's
binary range, 2^-30 of its largest |w|; the same call gives the same bits). Elsewhere (the
backward's gradients, Triton's interpreter, FLEXDSL_RECURRENT_FIXED=0) float32 weights are split
into three bfloat16 matrices (`split3`, summing to the float32 value): a spike is exact in
bfloat16, so three bfloat16 products give the float32 result; a float32 operand that is not a
spike is split too (six products, error ~2^-24). With 16-bit I/O, one product in that dtype with
float32 accumulation. A program owning one tile keeps its neurons' states in registers and loads
its input a step ahead, while it waits at the grid barrier (FLEXDSL_RECURRENT_RESIDENT=0: not).

Launch heuristics (env): `FLEXDSL_RECURRENT_TILE=BMxBNxBK` (the tile), `FLEXDSL_RECURRENT_BK` (the
product's K block), `FLEXDSL_RECURRENT_WARPS` (4), `FLEXDSL_RECURRENT_STAGES` (Triton's pipelining
depth, 4), `FLEXDSL_RECURRENT_PROGRAMS` (at most the multiprocessor count);
`FLEXDSL_RECURRENT_PRODUCTS=fp32` turns off the exact bfloat16 products of spikes outside the kernels;
`FLEXDSL_RECURRENT_FIXED` (0/1) and `FLEXDSL_RECURRENT_RESIDENT` (0) as above.
"""

from __future__ import annotations

from functools import lru_cache
from types import SimpleNamespace
from typing import Any

import torch

from ...errors import FlexDSLError
from ...frontend.parse import source_lines
from ...ir.functions import TNOW
from ...settings import env_choice, env_int, env_tile
from ...store import cache
from ...store.generated import load_module
from ..base import IR, NoiseKey
from ..exact import exact_in_bf16
from ..naming import ident
from . import products
from .emit import TritonPrinter, _env, _fire_on_stored_values, _lanes, _Printed, emit
from .kernel import Launcher
from .launch import LAUNCHES, interpret
from .products import split3, split_fixed

TEMPLATE = "recurrent.py.j2"


def forward_view(ir: IR, port: int, source: int) -> tuple[str, Any, _Printed, SimpleNamespace, list, list]:
    """What a kernel running the neuron's forward step on an in-kernel input `port` prints (the
    recurrent scan's and the plastic layer's): the neuron's kernels module, its ABI, the printer,
    the forward's parts (`fwd`), the params' loads and their block."""
    step, sch = ir.step, ir.schedule
    base, abi = emit(ir)
    io_ptr = abi.name_of("out", abi.outputs[0])
    P = _Printed(TritonPrinter(io_ptr), step.origins, source_lines(step.checked.source))
    S = P.pr._print
    port_sym = step.inputs[port]
    src_name = abi.outputs[source]
    others = [x for x in step.inputs if x != port_sym]
    param_loads = [{"name": ident(p), "arg": abi.name_of("param", p), "mode": abi.name_of("mode", p)}
                   for p in abi.params]
    param_block = []
    for p in param_loads:
        param_block += [f"if {p['mode']} == 0:", f"    {p['name']} = {p['arg']}", f"elif {p['mode']} == 1:",
                        f"    {p['name']} = tl.load({p['arg']}).to(tl.float32)", "else:",
                        f"    {p['name']} = tl.load({p['arg']} + _offs, mask=_mask, other=1.0).to(tl.float32)"]
    lane_f = _lanes(step.assignments, set(step.inputs) | set(step.states) | {TNOW})
    fwd = SimpleNamespace(
        others=[{"name": ident(x.name), "arg": abi.name_of("in", x.name)} for x in others],
        outputs=[{"arg": abi.name_of("out", n), "value": P.block(v, lane_f), "source": n == src_name}
                 for n, v in step.outputs],
        states=[{"name": ident(s)} for s in abi.states],
        hoisted=[{"name": S(y), "arg": abi.name_of("hoisted", y.name)} for y, _ in sch.fwd_hoisted],
        hoisted_lines=P.lines(sch.fwd_hoisted),
        saved_before=[{"index": i, "name": S(s)} for i, s in enumerate(sch.saved) if s in step.states],
        saved_after=[{"index": i, "name": S(s)} for i, s in enumerate(sch.saved) if s not in step.states],
        body=P.lines(_fire_on_stored_values(sch.fwd_body, sch.saved, step.states)),
        next=[P.block(v, lane_f) for v in step.next_states],
        port_name=ident(port_sym.name),
    )
    return base, abi, P, fwd, param_loads, param_block


def emit_recurrent(ir: IR, port: int, source: int) -> tuple[str, dict[str, Any]]:
    """The neuron's kernels module with the recurrent kernels appended, and their metadata."""
    step, bw, sch = ir.step, ir.backward, ir.schedule
    base, abi, P, fwd, param_loads, param_block = forward_view(ir, port, source)
    S = P.pr._print
    port_sym = step.inputs[port]
    src_name = abi.outputs[source]
    others = [x for x in step.inputs if x != port_sym]

    lane_b = set(bw.grad_outputs) | set(bw.grad_next_states) | set(step.inputs) | set(step.states) | {TNOW}
    lane_b = _lanes([*sch.recompute, *sch.bwd_body], lane_b | set(sch.saved))
    bwd_hoisted = [*sch.bwd_fwd_hoisted, *sch.bwd_hoisted]
    used_out = {n: u for n, u in zip(abi.outputs, sch.grad_outputs_used)}
    bwd = SimpleNamespace(
        reread=[{"name": ident(x.name), "arg": abi.name_of("in", x.name)} for x in sch.reread if x != port_sym],
        outputs=[{"grad": S(g), "arg": abi.name_of("gout", n), "hasg": abi.name_of("hasgout", n),
                  "source": n == src_name}
                 for n, g in zip(abi.outputs, bw.grad_outputs) if used_out[n]],
        states=[{"grad": S(g)} for g in bw.grad_next_states],
        grad_inputs=[{"arg": abi.name_of("gx", x.name), "need": abi.name_of("needgx", x.name),
                      "value": P.block(g, lane_b)}
                     for x, g, nz in zip(step.inputs, bw.grad_inputs, abi.grad_inputs) if x != port_sym and nz],
        learnable=[{"arg": abi.name_of("gp", p), "need": abi.name_of("needgp", p), "value": P.block(g, lane_b)}
                   for p, g in zip(abi.learnable, bw.grad_params)],
        hoisted=[{"name": S(y), "arg": abi.name_of("hoisted", y.name)} for y, _ in bwd_hoisted],
        hoisted_lines=P.lines(bwd_hoisted),
        saved=[{"index": i, "name": S(s)} for i, s in enumerate(sch.saved)],
        recompute=P.lines(sch.recompute),
        body=P.lines(sch.bwd_body, comments=False),
        next=[P.block(v, lane_b) for v in bw.grad_states],
    )
    port_reread = port_sym in sch.reread
    rec = _env().get_template(TEMPLATE).render(
        model=step.name, port=port_sym.name, source=src_name, port_name=ident(port_sym.name),
        src_out=abi.name_of("out", src_name), param_loads=param_loads, param_block=param_block, fwd=fwd, bwd=bwd,
        port_reread=port_reread, port_grad=P.block(bw.grad_inputs[port], lane_b),
        src_used=used_out[src_name], draws=step.draws)
    meta = {"abi": abi.to_dict(), "port": port, "source": source, "port_reread": port_reread,
            "others": [x.name for x in others], "reread_others": [x["arg"] for x in bwd.reread],
            "grad_others": [x.name for x, nz in zip(step.inputs, abi.grad_inputs) if x != port_sym and nz],
            "hoisted_fwd": [y.name for y, _ in sch.fwd_hoisted], "hoisted_bwd": [y.name for y, _ in bwd_hoisted],
            "used_outputs": [n for n in abi.outputs if used_out[n]]}
    return base + rec, meta


# ------------------------------------------------------------------------------------ launch
FIXED_DEFAULT = True  # (measured faster on an H100: bench/RESULTS.md)


def _fixed_scan(interpreted: bool) -> bool:
    """Whether float32 spikes' recurrent products run in fixed point (`split_fixed`):
    FLEXDSL_RECURRENT_FIXED=1 or 0, by default on CUDA (not in Triton's interpreter)."""
    knob = env_choice("FLEXDSL_RECURRENT_FIXED")
    return knob == "1" or (knob == "" and FIXED_DEFAULT and not interpreted)


def _resident() -> bool:
    """Whether a program owning one tile keeps its states in registers and loads its input a step
    ahead (FLEXDSL_RECURRENT_RESIDENT, on by default)."""
    return env_choice("FLEXDSL_RECURRENT_RESIDENT") != "0"


@lru_cache(maxsize=8)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def tile_shape(B: int, H: int, programs: int, a_bytes: int, w_bytes: int) -> tuple[int, int, int]:
    """(BM, BN, BK): the tile of the [B, H] step a program computes. Per step a tile reads BM rows
    of the previous step (a_bytes each per neuron) and BN rows of W (w_bytes each), all from L2:
    among the shapes (16..128 x 32..128, as tl.dot needs) whose count fits the programs, the one
    reading the fewest bytes in all, of those keeping at least half the programs busy (else the
    most tiles)."""
    fixed = env_tile("FLEXDSL_RECURRENT_TILE")
    if fixed is not None:
        return fixed
    best = None
    for bm in (16, 32, 64, 128):
        for bn in (32, 64, 128):
            tiles = (-(-B // bm)) * (-(-H // bn))
            if tiles > programs:
                continue
            busy = tiles >= programs // 2
            key = (not busy, tiles * (bm * a_bytes + bn * w_bytes) if busy else -tiles, bm * bn)
            if best is None or key < best[0]:
                best = (key, bm, bn)
    bm, bn = (best[1], best[2]) if best is not None else (128, 128)
    return bm, bn, env_int("FLEXDSL_RECURRENT_BK") or (32 if max(bm, bn) >= 128 else 64)


class TritonRecurrentProgram:
    """The recurrent scan of one model, port and source in the Triton kernels."""

    def __init__(self, module, meta: dict[str, Any], port: int, source: int, dense: bool) -> None:
        from .abi import KernelABI

        self.mod = module
        self.abi = abi = KernelABI.from_dict(meta["abi"])
        self.meta = meta
        self.port, self.source, self.dense = port, source, dense
        self.inputs, self.states, self.params, self.outputs = abi.inputs, abi.states, abi.params, abi.outputs
        self.learn_idx = [abi.params.index(p) for p in abi.learnable]
        self.interpret = interpret()
        self.binary = self.outputs[source] == "spike"  # the source is 0/1: exact in any float dtype
        self.fwd_kernel, self.bwd_kernel = Launcher(module._rec_fwd_kernel), Launcher(module._rec_bwd_kernel)
        self.fused_products = products  # (the layer's input product and checks in Triton too)
        self._host_cache: dict = {}

    # ------------------------------------------------------------------ helpers
    def _host(self, params) -> tuple[bool, dict]:
        if not (self.meta["hoisted_fwd"] or self.meta["hoisted_bwd"]) or any(isinstance(p, torch.Tensor)
                                                                             for p in params):
            return False, {}
        key = tuple(float(p) for p in params)
        hit = self._host_cache.get(key)
        if hit is None:
            try:
                hit = (True, self.mod.host_invariants(*key))
            except (ValueError, ZeroDivisionError, OverflowError):
                hit = (False, {})
            if len(self._host_cache) > 64:
                self._host_cache.clear()
            self._host_cache[key] = hit
        return hit

    def _params(self, params, B: int, H: int, dev) -> dict[str, Any]:
        kw: dict[str, Any] = {}
        for name, p in zip(self.params, params):
            if not isinstance(p, torch.Tensor):
                a, mode = float(p), 0
            elif p.numel() == 1:
                a, mode = p.detach().to(dev).reshape(1), 1
            else:
                a, mode = p.detach().to(dev).expand(B, H).reshape(B * H).contiguous(), 2
            kw[self.abi.name_of("param", name)] = a
            kw[self.abi.name_of("mode", name)] = mode
        return kw

    def _layout(self, B: int, H: int, dev: torch.device, dtype: torch.dtype, a_bytes: int,
                fixed: bool = False) -> dict[str, Any]:
        if self.interpret or dev.type != "cuda":
            programs = 1
        else:
            programs = env_int("FLEXDSL_RECURRENT_PROGRAMS") or _sm_count(dev.index or 0)
            programs = min(programs, _sm_count(dev.index or 0))
        exact32 = self.interpret
        split_w = 4 if fixed else 3 if (dtype == torch.float32 and self.dense and not exact32) else 1
        w_bytes = 4 if fixed else 2 * split_w if dtype == torch.float32 else dtype.itemsize
        bm, bn, bk = tile_shape(B, H, programs, a_bytes, w_bytes)
        if fixed and env_tile("FLEXDSL_RECURRENT_TILE") is None and env_int("FLEXDSL_RECURRENT_BK") is None:
            bk = 128  # (int8: half the bytes of a bfloat16 block, and fewer steps of the K loop)
        if fixed:
            bk = max(bk, 32)  # (an int8 tensor-core product takes K blocks of 32 or more)
        tiles = (-(-B // bm)) * (-(-H // bn))
        nprog = max(1, min(programs, tiles))
        return {"grid": (nprog,), "num_warps": env_int("FLEXDSL_RECURRENT_WARPS") or 4,
                "num_stages": env_int("FLEXDSL_RECURRENT_STAGES") or (3 if fixed else 4), "_NPROG": nprog, "_BM": bm, "_BN": bn, "_BK": bk, "_SYNC": nprog > 1 and self.dense,
                "_DENSE": self.dense, "_SPLIT_W": split_w, "_EXACT32": exact32}

    def _weights(self, w: torch.Tensor, dtype: torch.dtype, split_w: int) -> torch.Tensor:
        if not self.dense:
            return w.detach().float().contiguous()
        if split_w == 3:
            return split3(w.detach())  # ([3, H, H] bfloat16, one launch)
        return w.detach().to(dtype).contiguous()

    def _hoisted(self, names: list[str], host: bool, hv: dict) -> dict[str, Any]:
        return {self.abi.name_of("hoisted", n): (hv.get(n, 0.0) if host else 0.0) for n in names}

    # ------------------------------------------------------------------ forward
    def _key(self, noise: NoiseKey | None) -> dict[str, int]:
        """The kernels' key arguments (a noisy model's)."""
        if not self.abi.draws:
            return {}
        if noise is None:
            raise ValueError("a noisy model's recurrent scan needs the call's NoiseKey")
        return {"_seedlo": noise.seed & 0x7FFFFFFF, "_seedhi": noise.seed >> 31, "_tbase": noise.t0}

    def exact_ints(self, dtype: torch.dtype) -> bool:
        """Whether this layer's exact products in `dtype` run in int8 fixed point (float32 spikes fed
        back, `split_fixed`): the values called exact are then integers from -127 to 127."""
        return dtype == torch.float32 and self.dense and self.binary and _fixed_scan(self.interpret)

    def forward(self, ix, w, s0, inputs, states, params, save, noise: NoiseKey | None = None,
                s0_exact: bool | None = None):
        T, B, H = ix.shape
        dev, dtype = ix.device, ix.dtype
        if dev.type != "cuda" and not self.interpret:
            raise FlexDSLError(f"the Triton kernels run on CUDA tensors, but the input is on {dev}", self.abi.name,
                               hint="use backend='auto' (the torch path on the CPU)")
        N = B * H
        S = torch.empty((T + 1, B, H), dtype=dtype, device=dev)
        S[0].copy_(s0)
        outs = [S[1:] if k == self.source else torch.empty((T, B, H), dtype=dtype, device=dev)
                for k in range(len(self.outputs))]
        st = torch.empty((len(self.states), N), dtype=torch.float32, device=dev)
        for i, v in enumerate(states):
            if isinstance(v, torch.Tensor):
                st[i].copy_(v.detach().expand(B, H).reshape(N))
            else:
                st[i].fill_(float(v))
        K = len(self.abi.saved)
        sav = torch.empty((K, T, B, H), dtype=dtype, device=dev) if save and K else None
        xp = torch.empty((T, B, H), dtype=dtype, device=dev) if save and self.meta["port_reread"] else None
        Sb = None
        if T and N:
            # the previous step's source as a product operand: spikes are exact in bfloat16 (the
            # initial one too, unless it was given other values)
            exact = self.dense and self.binary and (dtype != torch.float32 or (
                s0_exact if s0_exact is not None else exact_in_bf16(s0, self)))
            fixed = exact and self.exact_ints(dtype)  # (then s0_exact says: small integers)
            shadow = exact and dtype == torch.float32 and (fixed or not self.interpret)
            if shadow:
                Sb = torch.empty((T + 1, B, H), dtype=torch.int8 if fixed else torch.bfloat16, device=dev)
                Sb[0].copy_(s0)
            lay = self._layout(B, H, dev, dtype, 1 if fixed else 2 if (shadow or dtype != torch.float32) else 4,
                               fixed)
            host, hv = self._host(params)
            wk, wsc = split_fixed(w) if fixed else (self._weights(w, dtype, lay["_SPLIT_W"]), None)
            tiles = (-(-B // lay["_BM"])) * (-(-H // lay["_BN"]))
            kw: dict[str, Any] = {"_ix": ix, "_S": S, "_Sb": Sb, "_W": wk, "_Wsc": wsc, "_xp": xp,
                                  "_RESIDENT": tiles <= lay["_NPROG"] and _resident(), "_st": st, "_saved": sav,
                                  "_bar": torch.zeros(1, dtype=torch.int32, device=dev), "_B": B, "_H": H, "_T": T,
                                  "_HOST": host, "_SAVE": sav is not None or xp is not None, "_ROUND": sav is not None,
                                  "_SPLIT_A": 1 if exact else 3, "_SHADOW": shadow, **self._key(noise)}
            for k, name in enumerate(self.inputs):
                if k != self.port:
                    kw[self.abi.name_of("in", name)] = inputs[k].contiguous()
            for k, name in enumerate(self.outputs):
                if k != self.source:
                    kw[self.abi.name_of("out", name)] = outs[k]
            kw.update(self._params(params, B, H, dev))
            kw.update(self._hoisted(self.meta["hoisted_fwd"], host, hv))
            grid = lay.pop("grid")
            kw.update(lay)
            self.fwd_kernel(grid, **kw)
            LAUNCHES["rec_fwd"] += 1
        fins = [st[i].view(B, H).to(dtype) for i in range(len(self.states))]
        saved = (sav, xp, Sb, params, B, H, dtype, [inputs[k] for k in range(len(self.inputs)) if k != self.port and
                                   self.abi.name_of("in", self.inputs[k]) in self.meta["reread_others"]], noise)
        return outs, fins, S, saved if save else None

    # ------------------------------------------------------------------ backward
    def backward(self, saved, w, g_outs, g_fins, need):
        sav, xp, Sb, params, B, H, dtype, reread, noise = saved
        T = need["T"]
        dev = w.device
        N = B * H
        gI = torch.empty((T + 1, B, H), dtype=dtype, device=dev)
        gI[T].zero_()
        gst = torch.empty((len(self.states), N), dtype=torch.float32, device=dev)
        for i, g in enumerate(g_fins):
            if g is None:
                gst[i].zero_()
            else:
                gst[i].copy_(g.reshape(N))
        gx = {name: (torch.empty((T, B, H), dtype=dtype, device=dev) if need["inputs"][self.inputs.index(name)]
                     else None) for name in self.meta["grad_others"]}
        n_learn = len(self.abi.learnable)
        gp = torch.zeros((max(n_learn, 1), N), dtype=torch.float32, device=dev)
        need_p = [bool(need["params"][i]) for i in self.learn_idx]
        parts = (torch.empty((3, T, B, H), dtype=torch.bfloat16, device=dev)
                 if need.get("parts") and dtype == torch.float32 and not self.interpret and T and N else None)
        if T and N:
            lay = self._layout(B, H, dev, dtype, dtype.itemsize)
            host, hv = self._host(params)
            kw: dict[str, Any] = {"_gI": gI, "_gIp": parts, "_PARTS": parts is not None,
                                  "_W": self._weights(w, dtype, lay["_SPLIT_W"]), "_xp": xp, "_gst": gst,
                                  "_gp": gp, "_saved": sav, "_bar": torch.zeros(1, dtype=torch.int32, device=dev),
                                  "_B": B, "_H": H, "_T": T, "_HOST": host,
                                  "_SPLIT_A": 3 if dtype == torch.float32 else 1, **self._key(noise)}
            it = iter(reread)
            for a in self.meta["reread_others"]:
                kw[a] = next(it).contiguous()
            for name, g in zip(self.outputs, g_outs):
                if name in self.meta["used_outputs"]:
                    kw[self.abi.name_of("gout", name)] = None if g is None else g.contiguous()
                    kw[self.abi.name_of("hasgout", name)] = g is not None
            for name, g in gx.items():
                kw[self.abi.name_of("gx", name)] = g
                kw[self.abi.name_of("needgx", name)] = g is not None
            for name, n in zip(self.abi.learnable, need_p):
                kw[self.abi.name_of("needgp", name)] = n
            kw.update(self._params(params, B, H, dev))
            kw.update(self._hoisted(self.meta["hoisted_bwd"], host, hv))
            grid = lay.pop("grid")
            kw.update(lay)
            self.bwd_kernel(grid, **kw)
            LAUNCHES["rec_bwd"] += 1
        g_st = [gst[i].view(B, H) if n else None for i, n in enumerate(need["states"])]
        g_in: list[Any] = [None] * len(self.inputs)
        for name, g in gx.items():
            g_in[self.inputs.index(name)] = g
        g_pr: list[Any] = [None] * len(params)
        for k, i in enumerate(self.learn_idx):
            if need["params"][i]:
                p = params[i]
                g = gp[k].view(B, H)
                g_pr[i] = (g.sum() if p.numel() == 1 else g.sum_to_size(p.shape)).reshape(p.shape).to(p.dtype)
        return gI[:T], g_in, g_st, g_pr, {"parts": parts, "sb": Sb}


def load_recurrent(ir: IR, key: str, port: int, source: int, dense: bool) -> TritonRecurrentProgram:
    k = cache.key(key, str(port), str(source))
    art = cache.get_or_make(k, lambda: cache.Artefact("tritonrec", *emit_recurrent(ir, port, source)))
    return TritonRecurrentProgram(load_module("tritonrec", k, art.source), art.meta, port, source, dense)


__all__ = ["emit_recurrent", "TritonRecurrentProgram", "load_recurrent", "tile_shape"]
