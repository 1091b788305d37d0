"""e-prop's per-synapse eligibility over a call, as per-neuron products and two matrix products
(`runtime/eprop.py` describes the recursion). Over a call of T steps, for a batch element `f`, a
postsynaptic neuron `i` and a presynaptic value `p` (an input, the fed-back source of the step
before, 1 for the bias):

    eps_t[f, i, p, :] = J_t[f, i] @ eps_{t-1}[f, i, p, :] + b_t[f, i, :] * pre_t[f, p]       (eps_{-1}: the kept one)
    g[i, p]          += sum_t A_t[f, i, :] . eps_{t-1}[f, i, p, :] + Lg_t[f, i] * pre_t[f, p]

Both are linear in `pre` and in the kept `eps_{-1}`, with coefficients that belong to the neuron
alone. One kernel (`_adjoint`) runs over the call's steps backwards, once per neuron lane `(f, i)`,
and gives them: `mu_t = A_{t+1} + J_{t+1}^T mu_{t+1}` (what the gradient owes `eps_t`),
`u_t = mu_t . b_t + Lg_t` (what it owes `pre_t`), `Psi_t = J_{T-1} ... J_{t+1}` and
`nu_t = Psi_t b_t` (what the call's last eligibility owes `pre_t`). Then

    g[i, p]               = sum_{t, f} u_t[f, i] pre_t[f, p]  +  sum_{f} mu_{-1}[f, i] . eps_{-1}[f, i, p]
    eps_{T-1}[f, i, p, :] = Psi_{-1}[f, i] @ eps_{-1}[f, i, p, :]  +  sum_t nu_t[f, i, :] pre_t[f, p]

the same sums regrouped: the steps' sums over `t` (and over the batch, for `g`) are matrix products
(cuBLAS, float32 in and out, under PyTorch's float32 matmul setting), and nothing of size
`[batch, hidden, pre, states]` is read or written per step, only the kept eligibility once in
and the call's last one once out. The eligibility still flows forward from call to call; within
a call it is the closed form of the forward recursion, not an approximation of it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .kernel import cdiv


@triton.jit
def _adjoint(J_ptr, b_ptr, A_ptr, Lg_ptr, u_ptr, nu_ptr, mu_ptr, psi_ptr, T, N,
             D: tl.constexpr, ACC: tl.constexpr, BN: tl.constexpr):
    """Backwards over the steps, a lane `n = f * H + i` a row of the block: `nu_t` (`[N, D, T]`; and
    with `ACC` the learning signal's `u_t`, `[T, N]`), then `Psi_{-1}` (and `mu_{-1}`). `J`
    `[T, N, D, D]`, `b` and `A` `[T, N, D]`, `Lg` `[T, N]`."""
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    nm = n < N
    k = tl.arange(0, D)
    eye = (k[:, None] == k[None, :]).to(tl.float32)
    psi = tl.zeros([BN, D, D], dtype=tl.float32) + eye[None, :, :]
    mu = tl.zeros([BN, D], dtype=tl.float32)
    m2 = nm[:, None]
    for tt in range(0, T):
        row = (T - 1 - tt).to(tl.int64) * N + n  # [BN]: the lane at step t
        b = tl.load(b_ptr + row[:, None] * D + k[None, :], mask=m2, other=0.0).to(tl.float32)  # [BN, D]
        tl.store(nu_ptr + (n.to(tl.int64)[:, None] * D + k[None, :]) * T + (T - 1 - tt), tl.sum(psi * b[:, None, :], axis=2),
                 mask=m2)  # (nu as [N, D, T]: per batch element the left operand of a matrix product over the steps)
        J = tl.load(J_ptr + (row[:, None, None] * D + k[None, :, None]) * D + k[None, None, :],
                    mask=nm[:, None, None], other=0.0).to(tl.float32)  # [BN, D (k), D (l)]: d h_k / d h_l
        if ACC:
            Lg = tl.load(Lg_ptr + row, mask=nm, other=0.0).to(tl.float32)
            tl.store(u_ptr + row, tl.sum(mu * b, axis=1) + Lg, mask=nm)
            A = tl.load(A_ptr + row[:, None] * D + k[None, :], mask=m2, other=0.0).to(tl.float32)
            mu = A + tl.sum(J * mu[:, :, None], axis=1)  # (J^T mu)
        psi = tl.sum(psi[:, :, :, None] * J[:, None, :, :], axis=2)  # (Psi J)
    n64 = n.to(tl.int64)
    tl.store(psi_ptr + (n64[:, None, None] * D + k[None, :, None]) * D + k[None, None, :], psi,
             mask=nm[:, None, None])
    if ACC:
        tl.store(mu_ptr + n64[:, None] * D + k[None, :], mu, mask=m2)


@triton.jit
def _start(e_ptr, se_f, se_i, se_p, se_k, out_ptr, psi_ptr, mu_ptr, g_ptr, F, H, P,
           D: tl.constexpr, ACC: tl.constexpr, BI: tl.constexpr, BP: tl.constexpr):
    """The kept eligibility's terms, in one pass over it (any strides): `out = Psi_{-1} @ eps_{-1}`
    (`[F, H, D, P]`, every batch element) and, with `ACC`, `g = sum_f mu_{-1} . eps_{-1}` (a
    program's tile summed over the batch in registers: no atomics)."""
    i = tl.program_id(1) * BI + tl.arange(0, BI)
    p = tl.program_id(0) * BP + tl.arange(0, BP)
    k = tl.arange(0, D)
    im, pm = i < H, p < P
    m2 = im[:, None] & pm[None, :]
    g = tl.zeros([BI, BP], dtype=tl.float32)
    for f in range(0, F):
        n = (f * H + i).to(tl.int64)  # [BI]
        fl = (f + 0 * i).to(tl.int64)  # [BI]: the batch element (in 64 bits: the offsets may pass 2^31)
        eoff = (fl * se_f + i.to(tl.int64) * se_i)[:, None, None] + p[None, :, None] * se_p + k[None, None, :] * se_k
        e = tl.load(e_ptr + eoff, mask=m2[:, :, None], other=0.0).to(tl.float32)  # [BI, BP, D]
        if ACC:
            mu = tl.load(mu_ptr + n[:, None] * D + k[None, :], mask=im[:, None], other=0.0)  # [BI, D]
            g += tl.sum(e * mu[:, None, :], axis=2)
        for r in tl.static_range(D):
            psi = tl.load(psi_ptr + (n[:, None] * D + r) * D + k[None, :], mask=im[:, None], other=0.0)  # row r
            tl.store(out_ptr + (n[:, None] * D + r) * P + p[None, :], tl.sum(e * psi[:, None, :], axis=2), mask=m2)
    if ACC:
        tl.store(g_ptr + i[:, None].to(tl.int64) * P + p[None, :], g, mask=m2)


BN = 64  # lanes a program (the kernel is a fraction of the call's time: its loads are per neuron)
SI, SP = 16, 64  # `_start`'s tile: neurons x presynaptic values


def walk(eps: torch.Tensor, J: torch.Tensor, b: torch.Tensor, x: torch.Tensor | None, s: torch.Tensor | None,
         one: bool, A: torch.Tensor | None = None, Lg: torch.Tensor | None = None, zero: bool = False
         ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The eligibility after the call's steps (`[F, H, P, D]`) and, with `A` and `Lg`, the gradient
    `[H, P]` (float32, in `eps`'s dtype). `J` `[T, F, H, D, D]`, `b` and `A` `[T, F, H, D]`, `Lg`
    `[T, F, H]`; presynaptic values `x` `[T, F, NX]`, `s` `[T, F, NS]` (the source before each
    step), then 1 if `one`: `P = NX + NS + one`. `zero`: `eps` is known to be zeros (the call
    after a reset), so its terms are not computed. `D` a power of 2 (the caller pads)."""
    F, H, P, D = eps.shape
    T = J.shape[0]
    dev, dt = eps.device, eps.dtype
    f32 = torch.float32
    N = F * H
    acc = A is not None
    empty = torch.zeros(1, device=dev, dtype=f32)
    nu = torch.empty((F, H * D, T), device=dev, dtype=f32)
    psi = torch.empty((F, H, D, D), device=dev, dtype=f32)
    u = torch.empty((T, F, H), device=dev, dtype=f32) if acc else empty
    mu = torch.empty((F, H, D), device=dev, dtype=f32) if acc else empty
    _adjoint[(cdiv(N, BN),)](J.contiguous(), b.contiguous(), A.contiguous() if acc else empty,
                                    Lg.contiguous() if acc else empty, u, nu, mu, psi, T, N, D=D, ACC=acc, BN=BN)
    parts = [q.to(f32) for q in (x, s) if q is not None]
    if one:
        parts.append(torch.ones((T, F, 1), device=dev, dtype=f32))
    pre = parts[0] if len(parts) == 1 else torch.cat(parts, -1)  # [T, F, P]
    assert pre.shape[-1] == P
    g = u.reshape(T * F, H).t() @ pre.reshape(T * F, P) if acc else None  # [H, P]
    out = torch.empty((F, H * D, P), device=dev, dtype=f32)  # (the eligibility state-major: [F, H, D, P])
    pre_f = pre.transpose(0, 1)  # [F, T, P]
    if zero:
        torch.bmm(nu, pre_f, out=out)
    else:
        g0 = torch.empty((H, P), device=dev, dtype=f32) if acc else empty
        e = eps if eps.dtype == f32 else eps.to(f32)
        _start[(cdiv(P, SP), cdiv(H, SI))](e, *e.stride(), out, psi, mu, g0, F, H, P,
                                                         D=D, ACC=acc, BI=SI, BP=SP)
        out.baddbmm_(nu, pre_f)  # (+ sum_t nu_t pre_t: a product over the steps per batch element)
        if g is not None:
            g += g0
    out_v = out.view(F, H, D, P).transpose(2, 3)  # ([F, H, P, D], a view: nothing copied)
    return out_v if dt == f32 else out_v.to(dt), (g.to(dt) if g is not None else None)


__all__ = ["walk"]
