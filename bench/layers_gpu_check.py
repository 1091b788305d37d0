"""The layer level on a GPU against the same layers on the CPU (float64, torch backend): `.layer` files
(feed-forward with fixed delays of every kind, recurrent with custom names) and `flexdsl.feedforward`,
outputs and gradients, then the time of a feed-forward step with and without delays (same run).

    python3 bench/layers_gpu_check.py          (a CUDA GPU; `bash bench/gpu_session.sh layers`)
"""

from __future__ import annotations

import copy
import statistics
import time

import torch

import flexdsl

F, H, T, B, D = 64, 48, 40, 16, 6
KINDS = {"none": None, "uniform": None, "axonal": (F,), "synaptic": (H, F), "dendritic": (H,)}


def _text(kind: str) -> str:
    line = "" if kind == "none" else ("        delay 4\n" if kind == "uniform" else f"        delay {kind} max {D}\n")
    return f"layer L:\n    neuron lif\n    size {H}\n    input s size {F}\n    synapses W from s to x:\n{line}        bias b\n"


def _run(m, x):
    x = x.clone().requires_grad_(True)
    y = m(x)
    g = torch.linspace(-1, 1, y.numel(), device=y.device, dtype=y.dtype).reshape(y.shape)
    gx, gw = torch.autograd.grad((y * g).sum(), [x, m.W])
    return y.detach(), gx, gw


def check() -> None:
    torch.manual_seed(0)
    x = (torch.rand(T, B, F) < 0.3).double()
    for kind, shape in KINDS.items():
        d = torch.randint(0, D + 1, shape) if shape else None
        kw = {"delays": {"W": d}} if d is not None else {}
        ref = flexdsl.loads(_text(kind), backend="torch", **kw).double()
        gpu = copy.deepcopy(ref).float().cuda()
        gpu.neuron.backend = "auto"
        a = _run(ref, x)
        b = _run(gpu, x.float().cuda())
        spikes = (a[0] != b[0].double().cpu()).float().mean().item()
        rel = [((p.double().cpu() - q).norm() / q.norm().clamp_min(1e-30)).item() for p, q in zip(b[1:], a[1:])]
        print(f"  {kind:10s} spike mismatch {spikes:.2e}  d/dx rel {rel[0]:.1e}  d/dW rel {rel[1]:.1e}  "
              f"{'ok' if spikes < 1e-3 and max(rel) < 1e-3 else 'BAD'}")
    for line in ("synaptic learnable linear", "synaptic learnable gauss"):  # (the sparse kernel; the convolution)
        ref = flexdsl.loads(_text("synaptic").replace(f"max {D}", f"max {D} learnable " + line.split()[-1]),
                            backend="torch").double()
        gpu = copy.deepcopy(ref).float().cuda()
        gpu.neuron.backend = "auto"
        torch.backends.cudnn.allow_tf32 = False
        a, b = _run(ref, x), _run(gpu, x.float().cuda())
        torch.backends.cudnn.allow_tf32 = True
        spikes = (a[0] != b[0].double().cpu()).float().mean().item()
        rel = [((p.double().cpu() - q).norm() / q.norm().clamp_min(1e-30)).item() for p, q in zip(b[1:], a[1:])]
        print(f"  {line:26s} spike mismatch {spikes:.2e}  d/dx rel {rel[0]:.1e}  d/dW rel {rel[1]:.1e}  "
              f"{'ok' if spikes < 1e-3 and max(rel) < 1e-3 else 'BAD'}")
    r = flexdsl.loads("layer R:\n    neuron lif\n    size 48\n    input u size 64\n    synapses A from u to x:\n"
                      "        bias c\n    synapses B from spike to x\n", backend="torch").double()
    g = copy.deepcopy(r).float().cuda()
    g.backend = "auto"
    ya, yb = r(x), g(x.float().cuda())
    print(f"  recurrent file layer: spike mismatch {(ya != yb.double().cpu()).float().mean().item():.2e}")


def timing() -> None:
    torch.manual_seed(1)
    x = (torch.rand(100, 256, 700, device="cuda") < 0.05).float()
    rows = []
    for kind in ("none", "uniform", "axonal", "synaptic", "dendritic", "synaptic learnable linear",
                 "synaptic learnable gauss", "axonal learnable linear"):
        txt = _text(kind.split()[0]).replace(f"size {H}", "size 256").replace(f"size {F}", "size 700")
        txt = txt.replace(f"max {D}", "max 25" + (kind[kind.index(" "):] if " " in kind else ""))
        shape = {"axonal": (700,), "synaptic": (256, 700), "dendritic": (256,)}.get(kind)
        kw = {"delays": {"W": torch.randint(0, 26, shape)}} if shape else {}
        m = flexdsl.loads(txt, **kw).cuda()
        ts = []
        for i in range(12):
            m.reset()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            m(x).sum().backward()
            torch.cuda.synchronize()
            if i >= 2:
                ts.append((time.perf_counter() - t0) * 1e3)
        rows.append((kind, statistics.median(ts)))
    base = rows[0][1]
    print("| delays (700 -> 256 LIF, T=100, B=256, max 25) | fwd+bwd ms (median of 10) | vs none |")
    print("| --- | --- | --- |")
    for kind, ms in rows:
        print(f"| {kind} | {ms:.2f} | {ms / base:.2f}x |")


if __name__ == "__main__":
    print("device", torch.cuda.get_device_name(), "torch", torch.__version__)
    check()
    timing()
