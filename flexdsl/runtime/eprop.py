"""e-prop: online learning of a recurrent layer of any model (`flexdsl.recurrent(..., learning="eprop")`).

Bellec et al., "A solution to the learning dilemma for recurrent networks of spiking neurons",
Nat. Commun. 11:3625 (2020). A layer's call runs the model's generated e-prop step
(`backends/eprop.py`: one step and its derived factors `J`, `b`, `c`, `g`, see `ir/eprop.py`) and
carries, from call to call, each synapse's eligibility vector (`eps`, one entry per state of the
neuron). The backward receives the learning signal `L_t = dE/d out_t` (through the readout: its
weights, or a fixed random matrix with `feedback="random"`) and gives

    dE/dW_ip = sum_t L_i(t) (c_t . eps_{t-1} + g_t pre_p(t)),   eps_t = J_t eps_{t-1} + b_t pre_p(t)

for W_in (pre: the input), W_rec (pre: the fed-back source of the step before), the bias (pre: 1)
and the neuron's learnable params (`dh/dtheta` in place of `b pre`): the gradient of the loss with
every path through other neurons' past cut. Nothing of a call is kept for the next one but the
eligibility and the states, so a stream cut into calls (each with its own loss and backward) learns
with memory independent of its length, and the calls' gradients add up to one call's.

Where `J` and `b` depend on params only (a neuron whose step is linear in its states between
spikes, and whose reset is detached or subtractive), a synapse's eligibility vector does not
depend on the postsynaptic neuron: on the torch operations' path, one trace per presynaptic value
(`[batch, pre, states]`, Bellec's filtered spikes). Otherwise (a hard reset whose derivative is
kept, adaptation, conductances), and always in a backend's kernel (`_walk_kernel`: the Triton
kernel on CUDA, which sums a call's steps as per-neuron products and two matrix products, see
`backends/triton/eprop.py`), it is kept per synapse, `[batch, hidden, pre, states]` in the input's dtype.

The forward leaves the call's eligibility pending (`Pending`): the backward runs the traces once,
with the learning signal, and settles it; a later call that comes first runs them without it. On
CUDA the steps run on the layer's own scan and the factors of all steps in one call (`_from_scan`);
the layer's side (build-time checks, the readout, the calls) is `runtime/eprop_layer.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..backends import eprop as programs
from ..errors import FlexDSLError

LEARNING = ("bptt", "eprop")
SCAN_DEVICES = {"cuda"}  # where a call's steps run on the layer's scan (`_from_scan`); elsewhere one by one
FEEDBACK = ("symmetric", "random")


# ---------------------------------------------------------------------------- the factors of a call
class Factors:
    """The stacked factors of a call's steps: `J` `[T, F, H, d, d]` (or `[d, d]` when constant), `b`
    `[T, F, H, d]` (`[d]`), `c` `[T, F, H, n_out, d]`, `g` `[T, F, H, n_out]`, `dF` `[T, F, H, n_learn, d]`,
    `dG` `[T, F, H, n_out, n_learn]`; absent factors are zeros."""

    def __init__(self, prog: programs.EPropProgram, meta: dict[str, Any], f: dict[str, Any], T: int,
                 shape: torch.Size, like: torch.Tensor) -> None:
        """`f`: each factor of every step, `[T, F, H]` (or a number, the same for all)."""
        st, outs, learn = meta["states"], meta["outputs"], meta["learnable"]
        self.d, self.n_out, self.n_learn = len(st), len(outs), len(learn)
        full = (T, *shape)

        zero = like.new_zeros(()).expand(full)  # (an absent factor: a view, nothing filled)

        def entry(v: Any) -> torch.Tensor:  # (a number: one element filled, seen as the full shape)
            return _full(v, full, like) if isinstance(v, torch.Tensor) else like.new_full((), float(v)).expand(full)

        def grid(names: list[list[str]]) -> torch.Tensor:
            """The factors `names` (rows of entries) as one tensor `[*full, rows, columns]`, stacked
            in one copy (no zeros filled first, no copy an entry)."""
            cols = len(names[0]) if names else 0
            if not names or not cols:
                return like.new_zeros((*full, len(names), cols))
            flat = [entry(f[n]) if n in f else zero for row in names for n in row]
            return torch.stack(flat, -1).view(*full, len(names), cols)

        self.constant = prog.constant and all(_scalar(v) for n, v in f.items() if n.startswith(("J[", "b[")))
        if self.constant:  # (0-d values stacked on their device: no value read back to the host)
            self.J = torch.stack([_element(f.get(f"J[{a},{b}]"), like) for a in st for b in st]).view(len(st), len(st))
            self.b = torch.stack([_element(f.get(f"b[{a}]"), like) for a in st])
        else:
            self.J = grid([[f"J[{a},{b}]" for b in st] for a in st])
            self.b = grid([[f"b[{a}]"] for a in st])[..., 0]
        self.c = grid([[f"c[{o},{a}]" for a in st] for o in outs])
        self.g = grid([[f"g[{o}]"] for o in outs])[..., 0]
        self.dF = grid([[f"dF[{p},{a}]" for a in st] for p in learn]) if learn else None
        self.dG = grid([[f"dG[{o},{p}]" for p in learn] for o in outs]) if learn else None


def _scalar(v: Any) -> bool:
    """A factor the same at every step and lane: a number or a 0-d tensor (a one-lane call's per-step
    factors have one element too, and change with the step)."""
    return v is None or not isinstance(v, torch.Tensor) or v.dim() == 0


def _element(v: Any, like: torch.Tensor) -> torch.Tensor:
    """A factor the same for every lane (None: 0) as a 0-d tensor like `like`."""
    if isinstance(v, torch.Tensor):
        return v.reshape(()).to(like.dtype)
    return like.new_full((), 0.0 if v is None else float(v))


def _full(v: Any, shape: torch.Size, like: torch.Tensor) -> torch.Tensor:
    if not isinstance(v, torch.Tensor):
        return torch.full(shape, float(v), dtype=like.dtype, device=like.device)
    return v.to(like.dtype).expand(shape)


# ---------------------------------------------------------------------------- the recursions
def _step_eps(eps: torch.Tensor, J: torch.Tensor, b: torch.Tensor, pre: torch.Tensor, constant: bool
              ) -> torch.Tensor:
    """One step of a dense group's eligibility: per synapse `[F, H, P, d]`, or per presynaptic
    neuron `[F, P, d]` when `constant` (`J` `[d, d]`, `b` `[d]`)."""
    if constant:
        return torch.einsum("kl,fpl->fpk", J, eps) + pre[..., None] * b
    if eps.shape[-1] == 1:  # (one state: in place, `eps` is the walk's own copy)
        return eps.mul_(J[..., :1]).addcmul_(b[:, :, None, :], pre[:, None, :, None])
    return torch.einsum("fikl,fipl->fipk", J, eps) + b[:, :, None, :] * pre[:, None, :, None]


def _step_diag(eps: torch.Tensor, J: torch.Tensor, src: torch.Tensor, constant: bool) -> torch.Tensor:
    """One step of a per-neuron eligibility `[F, H, d]` (the bias, a one-to-one W_rec, a param),
    `src` `[F, H, d]` its source term."""
    if constant:
        return torch.einsum("kl,fil->fik", J, eps) + src
    return torch.einsum("fikl,fil->fik", J, eps) + src


class Eligibility:
    """A layer's eligibility between calls: `dense` (W_in, a dense W_rec and the bias, in that order
    of presynaptic values: per synapse `[F, H, P, d]`, or per presynaptic value `[F, P, d]` where
    `constant`) and the per-neuron ones `diag` (`[F, H, d]`: a one-to-one W_rec, learnable params)."""

    def __init__(self, dense: torch.Tensor | None, diag: dict[str, torch.Tensor], constant: bool) -> None:
        self.dense, self.diag, self.constant = dense, diag, constant

    def detach(self) -> Eligibility:
        return Eligibility(None if self.dense is None else self.dense.detach(),
                           {k: v.detach() for k, v in self.diag.items()}, self.constant)

    def resolve(self) -> Eligibility:
        return self

    def like(self, t: torch.Tensor) -> Eligibility:
        """In `t`'s dtype and device (a layer moved or cast mid-stream: its kept states are too)."""
        def to(v: torch.Tensor) -> torch.Tensor:
            return v.to(dtype=t.dtype, device=t.device)
        return Eligibility(None if self.dense is None else to(self.dense), {k: to(v) for k, v in self.diag.items()},
                           self.constant)

    def batch(self) -> int:
        if self.dense is not None:
            return self.dense.shape[0]
        return next(iter(self.diag.values())).shape[0] if self.diag else -1


class Pending:
    """The eligibility at the end of a call whose traces have not been run yet: the call's backward
    runs them (with the learning signal) and leaves the result here; a later call, `detach()` or a
    pickle that comes first runs them without it."""

    def __init__(self, plan: Plan, fac: Factors, e0: Eligibility, x3: torch.Tensor | None, S: torch.Tensor) -> None:
        self.plan: Plan | None = plan
        self.args: tuple | None = (fac, e0, x3, S)
        self.done: Eligibility | None = None

    def settle(self, e: Eligibility) -> None:
        if self.done is None:
            self.done = e.detach()
        self.plan, self.args = None, None

    def resolve(self) -> Eligibility:
        if self.done is None:
            assert self.plan is not None and self.args is not None
            fac, e0, x3, S = self.args
            with torch.no_grad():
                fac, S = _sure(self.plan, fac, S)
                self.settle(_walk(self.plan, fac, e0, x3, S, None)[0])
        assert self.done is not None
        return self.done

    def detach(self) -> Eligibility:
        return self.resolve()

    def batch(self) -> int:
        return self.resolve().batch()


def _pre(x: torch.Tensor | None, s_prev: torch.Tensor | None, one: bool) -> torch.Tensor:
    """A step's presynaptic values of the dense group `[F, P]`: the input, the source before, 1."""
    ref = x if x is not None else s_prev
    assert ref is not None
    parts = [q for q in (x, s_prev) if q is not None]
    if one:
        parts.append(ref.new_ones((*ref.shape[:-1], 1)))
    return parts[0] if len(parts) == 1 else torch.cat(parts, -1)


def _per_synapse(eps: torch.Tensor, H: int) -> torch.Tensor:
    """A presynaptic trace `[F, P, d]` as the per-synapse eligibility it stands for `[F, H, P, d]`."""
    return eps[:, None].expand(eps.shape[0], H, *eps.shape[1:]).clone()


class Plan:
    """What a call's Function needs besides its tensors: the program, the layer's form, the kept
    eligibility it starts from, the kernel that runs the per-synapse traces (None: torch), and after
    the forward the final states and the pending eligibility."""

    def __init__(self, prog: programs.EPropProgram, port: int, source: int, dense_rec: bool, bias: bool,
                 n_others: int, diag_names: list[str], elig: Eligibility | None, kernel: Any, stepper: Any) -> None:
        self.prog, self.port, self.source, self.dense_rec, self.bias = prog, port, source, dense_rec, bias
        self.n_others, self.diag_names, self.elig_in, self.kernel, self.stepper = \
            n_others, diag_names, elig, kernel, stepper
        self.n_inits = sum(n.startswith("init:") for n in diag_names)  # (states a learnable param starts)
        self.at: tuple[str, int, int, str] | None = None  # (where its errors point: the model's file, line, column)
        self.pending: Pending | None = None
        self.finals: list[torch.Tensor] = []
        self.scanned: Any = None  # (CUDA: the call's steps by the layer's scan, `EPropLearning._scanned`)
        self.whole: Any = prog.fn  # (the e-prop step on all the call's steps at once)
        self.unsure: Flag | None = None  # (whether the scan's steps disagreed with the e-prop step's)
        self.redo: Any = None  # (the steps one by one, for that case)
        self.redone: tuple[Factors, torch.Tensor] | None = None
        self.zeros: torch.Tensor | None = None  # (the call's start, where it is zeros: made so after a reset)


def stepper(prog: programs.EPropProgram, port: int, dense_rec: bool, compiled: bool):
    """One step of the layer: the port's current, then the model's e-prop step (compiled by
    torch.compile where `compiled`: on CUDA a step is then a few kernels, not one per operation)."""
    fn = prog.fn

    def body(ix_t, s_prev, w, others_t, h, params):
        cur = ix_t + (s_prev @ w.t() if dense_rec else s_prev * w)
        inputs = list(others_t)
        inputs.insert(port, cur)
        return cur, fn(*inputs, *h, *params)

    return torch.compile(body, dynamic=False) if compiled else body


def _run(plan: Plan, ix: torch.Tensor, w: torch.Tensor, s0: torch.Tensor,
         others: Sequence[torch.Tensor], states: Sequence[Any], params: Sequence[Any]):
    """The call's steps: (outputs per step, the source before each step `[T + 1, F, H]`, Factors)."""
    prog, meta = plan.prog, plan.prog.meta
    T = ix.shape[0]
    params = [p if isinstance(p, torch.Tensor) else torch.full((), float(p), dtype=torch.float64, device=s0.device)
              for p in params]  # (0-d float64: a number, in the lanes' dtype; filled there, not copied: no wait)
    s_prev, h = s0, list(states)
    n, d = prog.n_out, prog.n_states
    outs: list[list[torch.Tensor]] = [[] for _ in meta["outputs"]]
    S = [s0]
    steps = []
    for t in range(T):
        cur, res = plan.stepper(ix[t], s_prev, w, [o[t] for o in others], h, params)
        o = [_full(v, cur.shape, cur) for v in res[:n]]
        h = [_full(v, cur.shape, cur) for v in res[n:n + d]]
        for k, v in enumerate(o):
            outs[k].append(v)
        s_prev = o[plan.source]
        S.append(s_prev)
        steps.append(dict(zip(prog.factors, res[n + d:])))
    plan.finals = h
    stacked = {n: (torch.stack([_full(st[n], s0.shape, s0) for st in steps]) if not _scalar(steps[0][n]) else steps[0][n])
               for n in prog.factors}
    fac = Factors(prog, meta, stacked, T, s0.shape, s0)
    return [torch.stack(v) for v in outs], torch.stack(S), fac


def _from_scan(plan: Plan, others: Sequence[torch.Tensor], params: Sequence[Any], s0: torch.Tensor):
    """The call's steps by the layer's scan, the factors of all steps in one call of the e-prop step
    on the states the neuron's kernels give. Where the e-prop step's source output is not the scan's
    at every step (a spike that the two computations of the current put on either side of the
    threshold), the traces follow the steps run one by one instead (`_sure`: looked at when the traces
    run, so that the forward waits for nothing)."""
    prog = plan.prog
    outs, S, cur, hs, fins = plan.scanned()
    plan.scanned = None  # (no reference from the plan to the module or the call's tensors: see `_sure`)
    params = [p if isinstance(p, torch.Tensor) else torch.full((), float(p), dtype=torch.float64, device=s0.device)
              for p in params]  # (filled on the device: a copy from the host would wait for the scan)
    inputs = list(others)
    inputs.insert(plan.port, cur)
    res = plan.whole(*inputs, *hs, *params)
    full = cur.shape
    plan.unsure = Flag((_full(res[plan.source], full, cur) != outs[plan.source]).any())
    plan.finals = list(fins)
    n, d = prog.n_out, prog.n_states
    fac = Factors(prog, prog.meta, dict(zip(prog.factors, res[n + d:])), cur.shape[0], s0.shape, s0)
    return list(outs), S, fac


class Flag:
    """A 0-d bool computed on the device, read by the host later: on CUDA copied into pinned memory
    as soon as it is queued (an event after the copy), so that reading it waits only for the work
    queued before it, not for what the host queued since (a plain `bool(t)` waits for everything)."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t, self.host, self.event = t, None, None
        if t.is_cuda and not torch.compiler.is_compiling():
            try:
                self.host = torch.empty((), dtype=torch.bool, pin_memory=True)
            except RuntimeError:  # (no pinned memory: read as it is)
                return
            self.host.copy_(t, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record(torch.cuda.current_stream(t.device))

    def __bool__(self) -> bool:
        if self.event is not None and self.host is not None:
            self.event.synchronize()
            return bool(self.host)
        return bool(self.t)


def _sure(plan: Plan, fac: Factors, S: torch.Tensor) -> tuple[Factors, torch.Tensor]:
    """The factors and sources the traces run on: the scan's, or where they disagreed with the e-prop
    step (`_from_scan`), those of the steps one by one (`plan.redo`)."""
    if plan.unsure is not None:
        bad, plan.unsure = bool(plan.unsure), None
        if bad and plan.redo is not None:
            finals = plan.finals
            _, S2, fac2 = plan.redo()
            plan.finals, plan.redone = finals, (fac2, S2)
    plan.redo = None  # (a closure over the plan: a cycle that would keep the call's tensors until a collection)
    return plan.redone if plan.redone is not None else (fac, S)


def _eligibility0(plan: Plan, fac: Factors, F: int, H: int, P: int, like: torch.Tensor) -> Eligibility:
    """The eligibility at the call's start: the kept one, in the form this call runs (zeros after
    a reset)."""
    e = plan.elig_in
    dense = None
    if P:
        if e is not None and e.dense is not None:
            dense = e.dense
            if e.constant and not fac.constant:
                dense = _per_synapse(dense, H)
        else:
            dense = plan.zeros = like.new_zeros((F, P, fac.d) if fac.constant else (F, H, P, fac.d))
    diag = {n: (e.diag[n] if e is not None and n in e.diag else
                _unit(like, F, H, fac.d, int(n.split(":")[1])) if e is None and n.startswith("init:") else
                like.new_zeros((F, H, fac.d))) for n in plan.diag_names}
    return Eligibility(dense, diag, fac.constant)


def _unit(like: torch.Tensor, F: int, H: int, d: int, k: int) -> torch.Tensor:
    """The eligibility of an initial state itself (`init:k`) at the start of the first call: `e_k`."""
    u = like.new_zeros((F, H, d))
    u[..., k] = 1
    return u


def _diag_src(fac: Factors, name: str, t: int, S: torch.Tensor) -> torch.Tensor:
    """The source term of a per-neuron eligibility at step t: `b pre` (a one-to-one W_rec: the
    neuron's own source of the step before) or `dh/dtheta`."""
    if name == "rec":
        return S[t][..., None] * (fac.b if fac.constant else fac.b[t])
    if name.startswith("init:"):  # (an initial state's: the steps carry it, nothing adds to it)
        return torch.zeros_like(S[t])[..., None].expand(*S[t].shape, fac.d)
    return fac.dF[t][:, :, int(name.split(":")[1])]


def _diag_pre(name: str, S: torch.Tensor, t: int, fac: Factors, L: torch.Tensor) -> torch.Tensor:
    """The direct term of a per-neuron gradient at step t: `L g pre` (or `L dG` of a param)."""
    if name == "rec":
        return (L[t] * fac.g[t]).sum(-1) * S[t]
    if name.startswith("init:"):
        return torch.zeros_like(S[t])
    k = int(name.split(":")[1])
    return (L[t] * fac.dG[t][..., k]).sum(-1)


def _walk(plan: Plan, fac: Factors, e0: Eligibility, x3: torch.Tensor | None, S: torch.Tensor,
          L: torch.Tensor | None) -> tuple[Eligibility, torch.Tensor | None, dict[str, torch.Tensor]]:
    """Run the eligibility through the call's steps from `e0`; with the learning signal `L`
    `[T, F, H, n_out]`, also the gradients (the dense group's `[H, P]`, the per-neuron ones `[F, H]`)."""
    T = S.shape[0] - 1
    dense, g_dense = e0.dense, None
    if dense is not None and plan.kernel is not None:
        dense, g_dense = _walk_kernel(plan, fac, dense, x3, S, L)
    diag = dict(e0.diag)
    g_diag = {n: torch.zeros_like(S[0]) for n in diag}
    ops_dense = dense is not None and plan.kernel is None
    if ops_dense and not e0.constant:
        dense = dense.clone()  # (stepped in place: the call's start stays as it was, for its backward)
    if not ops_dense and not diag:
        return Eligibility(dense, diag, fac.constant and plan.kernel is None), g_dense, g_diag
    per = None  # (a one-state walk's gradient per batch element [F, H, P])
    for t in range(T):
        J = fac.J if fac.constant else fac.J[t]
        pre = _pre(x3[t] if x3 is not None else None, S[t] if plan.dense_rec else None, plan.bias) \
            if ops_dense else None
        if L is not None:
            A = torch.einsum("fio,fiok->fik", L[t], fac.c[t])  # (L c): [F, H, d]
            if ops_dense:
                Lg = (L[t] * fac.g[t]).sum(-1)  # [F, H]
                term = Lg.t() @ pre
                if not fac.constant and dense.shape[-1] == 1:  # (one state: summed over the batch at the end)
                    per = torch.zeros_like(dense[..., 0]) if per is None else per
                    per.addcmul_(dense[..., 0], A[..., :1])
                else:
                    term = term + (torch.einsum("fik,fpk->ip", A, dense) if fac.constant else
                                   torch.einsum("fik,fipk->ip", A, dense))
                g_dense = term if g_dense is None else g_dense + term
            for n, eps in diag.items():
                g_diag[n] = g_diag[n] + (A * eps).sum(-1) + _diag_pre(n, S, t, fac, L)
        if ops_dense:
            dense = _step_eps(dense, J, fac.b if fac.constant else fac.b[t], pre, fac.constant)
        for n in diag:
            diag[n] = _step_diag(diag[n], J, _diag_src(fac, n, t, S), fac.constant)
    if per is not None:
        g_dense = g_dense + per.sum(0)
    return Eligibility(dense, diag, fac.constant and plan.kernel is None), g_dense, g_diag


def _initial_grads(fac: Factors, L: torch.Tensor, which: list[int], like: torch.Tensor) -> list[torch.Tensor]:
    """dE/dh0 `[F, H]` of each initial state in `which` (where a learnable param sets it): the
    eligibility of h0 itself, `eps(0) = e_k`, `eps(t) = J eps(t-1)`, its gradient `Σ_t (L c)(t) · eps(t)`
    (each neuron's own history, as every e-prop path)."""
    if not which:
        return []
    T = L.shape[0]
    eps = like.new_zeros((*like.shape, fac.d, len(which)))
    for j, k in enumerate(which):
        eps[..., k, j] = 1
    g = like.new_zeros((*like.shape, len(which)))
    for t in range(T):
        A = torch.einsum("fio,fiok->fik", L[t], fac.c[t])
        g = g + torch.einsum("fik,fikj->fij", A, eps)
        J = fac.J if fac.constant else fac.J[t]
        eps = torch.einsum("kl,filj->fikj", J, eps) if fac.constant else torch.einsum("fikl,filj->fikj", J, eps)
    return [g[..., j] for j in range(len(which))]


def _walk_kernel(plan: Plan, fac: Factors, dense: torch.Tensor, x3: torch.Tensor | None, S: torch.Tensor,
                 L: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The dense group's traces by the backend's kernel (per synapse; the states padded to a power of 2)."""
    T, F, H = S.shape[0] - 1, S.shape[1], S.shape[2]
    d = fac.d
    D = 1 << (d - 1).bit_length()
    zero = dense is plan.zeros  # (the call after a reset: its start's terms are zeros, left out)
    if dense.dim() == 3:  # (a presynaptic trace from a call that ran on torch)
        dense = _per_synapse(dense, H)
    J = fac.J.expand(T, F, H, d, d) if fac.constant else fac.J
    b = fac.b.expand(T, F, H, d) if fac.constant else fac.b
    A = Lg = None
    if L is not None:
        A = torch.einsum("tfio,tfiok->tfik", L, fac.c)
        Lg = (L * fac.g).sum(-1)
    if D != d:
        pad = D - d
        dense = torch.nn.functional.pad(dense, (0, pad))
        J = torch.nn.functional.pad(J, (0, pad, 0, pad))
        b = torch.nn.functional.pad(b, (0, pad))
        A = torch.nn.functional.pad(A, (0, pad)) if A is not None else None
    out, g = plan.kernel(dense, J, b, x3, S[:-1] if plan.dense_rec else None, plan.bias, A, Lg, zero)
    return out[..., :d], g


class EPropCall(torch.autograd.Function):
    """One call of an e-prop layer: the forward runs the steps and leaves the eligibility pending
    (`plan.pending`); the backward runs the traces from the call's start with the learning signal
    (the gradients of the outputs), settles the pending eligibility and gives the gradients of W_in,
    the bias, W_rec and the learnable params (`plan.diag_names` "param:j:k": the j-th learnable
    param, `params[k]`)."""

    @staticmethod
    def forward(ctx, plan: Plan, x3, w_in, bias, w, s0, *rest):  # type: ignore[override]
        rest = rest[:len(rest) - plan.n_inits]  # (the initial states' values: their gradient's way to the params)
        n_p = len(rest) - plan.n_others - plan.prog.n_states
        params, others, states = list(rest[:n_p]), list(rest[n_p:n_p + plan.n_others]), list(rest[n_p + plan.n_others:])
        ix = x3 @ w_in.t() if w_in is not None else x3
        if bias is not None:
            ix = ix + bias
        got = _from_scan(plan, others, params, s0) if plan.scanned is not None else None
        outs, S, fac = got if got is not None else _run(plan, ix, w, s0, others, states, params)
        if got is not None:
            plan.redo = lambda: _run(plan, ix, w, s0, others, states, params)
        F, H = s0.shape
        xin = x3.detach().clone() if w_in is not None else None  # (the traces may run later: the caller may reuse x's buffer)
        P = (x3.shape[-1] if xin is not None else 0) + (H if plan.dense_rec else 0) + int(plan.bias)
        e0 = _eligibility0(plan, fac, F, H, P, s0)
        plan.pending = Pending(plan, fac, e0, xin, S)
        ctx.plan, ctx.fac, ctx.e0 = plan, fac, e0
        ctx.save_for_backward(xin, S)
        ctx.shapes = [p.shape if isinstance(p, torch.Tensor) else None for p in params]
        ctx.n_rest = len(rest) + plan.n_inits
        ctx.mark_non_differentiable(*plan.finals)
        return (*outs, *plan.finals)

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        if torch.is_grad_enabled():  # (create_graph=True: a second derivative is asked of the traces)
            file, line, col, text = ctx.plan.at or ("<e-prop>", 0, 0, None)
            raise FlexDSLError("e-prop gives first derivatives only: its traces are not differentiated again "
                               "(a backward with create_graph=True through an e-prop layer)", file, line, col, text,
                               hint="use learning='bptt' for higher derivatives, or leave create_graph off")
        plan, fac = ctx.plan, ctx.fac
        x3, S = ctx.saved_tensors
        g_outs = [g if g is not None else torch.zeros_like(S[1:]) for g in grads[:fac.n_out]]
        L = torch.stack(g_outs, -1)  # [T, F, H, n_out]: the learning signal
        # whether the scan and the e-prop step agreed (`Flag`: copied to the host at the end of the
        # forward's work, so reading it waits for that work only, which is usually done by now); where
        # they did not (rare), the traces run on the steps one by one
        fac, S = _sure(plan, fac, S)
        e1, g_dense, g_diag = _walk(plan, fac, ctx.e0, x3, S, L)
        if plan.pending is not None:
            plan.pending.settle(e1)
        plan.pending = plan.redone = None
        n_in = x3.shape[-1] if x3 is not None else 0
        H = S.shape[-1]
        g_w_in = g_dense[:, :n_in] if g_dense is not None and n_in else None
        if plan.dense_rec:
            g_w = g_dense[:, n_in:n_in + H] if g_dense is not None else None
        else:
            g_w = g_diag["rec"].sum(0)
        g_bias = g_dense[:, -1] if plan.bias and g_dense is not None else None
        g_rest: list[Any] = [None] * ctx.n_rest
        inits = [n for n in plan.diag_names if n.startswith("init:")]
        for n, g in g_diag.items():
            if n.startswith("param:"):
                k = int(n.split(":")[2])
                g_rest[k] = g.sum_to_size(ctx.shapes[k])
            elif n.startswith("init:"):  # (dE/dh0 over every call since the reset: `v = v_reset`'s v_reset)
                g_rest[ctx.n_rest - plan.n_inits + inits.index(n)] = g
        first = ctx.n_rest - plan.n_inits - fac.d  # (the call's start states, where one wants a gradient)
        wanted = [k for k in range(fac.d) if ctx.needs_input_grad[6 + first + k]]
        for k, g in zip(wanted, _initial_grads(fac, L, wanted, S[0])):
            g_rest[first + k] = g
        return (None, None, g_w_in, g_bias, g_w, None, *g_rest)


__all__ = ["EPropCall", "Eligibility", "Factors", "LEARNING", "FEEDBACK", "Plan", "SCAN_DEVICES"]
