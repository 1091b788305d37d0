"""e-prop on CUDA (float32: the layer's scan and the traces' kernel) against the CPU in float64, for what the
twelfth session changed: a learnable initial value (`v = v_reset`) streamed in calls, a one-lane call (hidden 1,
batch 1), a reused input buffer, a call of no steps. Relative error of every gradient, one line each.

    python3 bench/eprop_cuda_check.py          (a CUDA GPU; `bash bench/gpu_session.sh eprop_check`)
"""
from __future__ import annotations

import torch

import flexdsl


def grads(model, kw, hidden, batch, cuts, dev, dtype, reuse=False):
    torch.manual_seed(0)
    m = flexdsl.recurrent(model, 4, hidden, learning="eprop", **kw).to(dev, dtype)
    with torch.no_grad():
        m.W_in.copy_(torch.rand(hidden, 4) * 1.5)
        m.W_rec.copy_(torch.randn(*m.W_rec.shape) * 0.5)
        m.bias.copy_(torch.rand(hidden) * 0.6)
    x = torch.rand(24, batch, 4, generator=torch.Generator().manual_seed(5), dtype=torch.float64).to(dev, dtype)
    r = torch.randn(24, batch, hidden, generator=torch.Generator().manual_seed(6), dtype=torch.float64).to(dev, dtype)
    buf = torch.empty_like(x[: max(b - a for a, b in cuts)])
    for a, b in cuts:
        xin = buf[: b - a].copy_(x[a:b]) if reuse else x[a:b]
        out = m(xin)
        out = out[0] if isinstance(out, tuple) else out
        (out * r[a:b]).sum().backward()
    g = {n: p.grad for n, p in m.named_parameters() if p.grad is not None}
    return {k: v.double().cpu() for k, v in g.items()}


CASES = [("lif", dict(learnable=["v_reset"], v_reset=-0.3), 64, 8, [(0, 24)]),
         ("lif", dict(learnable=["v_reset"], v_reset=-0.3), 64, 8, [(0, 1), (1, 9), (9, 24)]),
         ("izhikevich", dict(learnable=True), 32, 4, [(0, 5), (5, 24)]),
         ("lif", {}, 1, 1, [(0, 24)]),
         ("alif", {}, 1, 1, [(0, 7), (7, 24)]),
         ("alif", {}, 64, 8, [(0, 7), (7, 24)]),
         ("lif", {}, 64, 8, [(0, 12), (12, 12), (12, 24)])]
worst = 0.0
for model, kw, hidden, batch, cuts in CASES:
    ref = grads(model, kw, hidden, batch, cuts, "cpu", torch.float64)
    for reuse in (False, True):
        got = grads(model, kw, hidden, batch, cuts, "cuda", torch.float32, reuse)
        errs = {k: float((got[k] - ref[k]).abs().max() / ref[k].abs().max().clamp_min(1e-30)) for k in ref}
        worst = max(worst, *errs.values())
        print(f"{model:11s} H={hidden:3d} B={batch} cuts={cuts} reuse={reuse}: "
              + ", ".join(f"{k} {v:.1e}" for k, v in errs.items()), flush=True)
print(f"worst relative error, CUDA float32 vs CPU float64: {worst:.2e} ({'ok' if worst < 1e-3 else 'BAD'})")
