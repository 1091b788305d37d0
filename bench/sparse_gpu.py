"""Sparse inputs (issue 35): a feed-forward Linear -> LIF layer whose input spikes at a low rate,
`flexdsl.feedforward(..., sparse_input=True)` against the same layer dense (`sparse_input=False`),
and SpikingJelly's `nn.Linear` + `LIFNode` (multi-step, torch backend), in the same run.

    python bench/sparse_gpu.py [--rates 0.01,0.02,0.05,0.1,0.2] [--shapes 4096x4096x32x64,700x256x100x256]

Shapes are NIxHxTxB. Per shape and rate: inference forward (no_grad) of dense, sparse fused (one
kernel), sparse unfused (sparse product, then the neuron's kernel; FLEXDSL_SPARSE_FUSED=0),
sparse "always" (no count read back) and SpikingJelly; training step (forward + backward of sum(spikes * g)) dense vs sparse. Times are
`triton.testing.do_bench` medians (ms; L2 flushed before each run). Accuracy: spikes that differ
between sparse and dense, and the membrane potential against a float64 run of the dense layer.
"""

from __future__ import annotations

import argparse
import os

import torch
from triton.testing import do_bench

import flexdsl


def make(ni: int, h: int, sparse: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    m = flexdsl.feedforward("lif", ni, h, sparse_input=sparse).cuda()
    with torch.no_grad():
        m.W.mul_(8.0)  # (a firing layer: the neuron's step matters)
    return m


def spikes(T: int, B: int, ni: int, rate: float) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(1)
    return (torch.rand((T, B, ni), device="cuda", generator=g) < rate).float()


def timed(fn) -> float:
    return do_bench(fn, warmup=10, rep=60, return_mode="median")


def sj_layer(ni: int, h: int, w: torch.Tensor) -> torch.nn.Module | None:
    try:
        from spikingjelly.activation_based import layer, neuron
    except ImportError:
        return None
    lin = layer.Linear(ni, h, step_mode="m").cuda()
    with torch.no_grad():
        lin.weight.copy_(w)
        lin.bias.zero_()
    return torch.nn.Sequential(lin, neuron.LIFNode(tau=2.0, step_mode="m", v_reset=0.0)).cuda()


def run(ni: int, h: int, T: int, B: int, rates: list[float]) -> list[tuple]:
    dense, sparse = make(ni, h, False), make(ni, h, True)
    sj = sj_layer(ni, h, dense.W.detach())
    rows = []
    for rate in rates:
        x = spikes(T, B, ni, rate)

        def fwd(m, x=x):
            def f():
                m.reset()
                with torch.no_grad():
                    return m(x)
            return f

        t_dense = timed(fwd(dense))
        t_fused = timed(fwd(sparse))
        path = sparse.sparse_report()["W"][0]
        sparse.sparse_input = "always"
        t_always = timed(fwd(sparse))
        sparse.sparse_input = True
        os.environ["FLEXDSL_SPARSE_FUSED"] = "0"
        t_unfused = timed(fwd(sparse))
        del os.environ["FLEXDSL_SPARSE_FUSED"]
        t_sj = float("nan")
        if sj is not None:
            from spikingjelly.activation_based import functional

            def f_sj(x=x):
                functional.reset_net(sj)
                with torch.no_grad():
                    return sj(x)
            t_sj = timed(f_sj)
        g = torch.randn((T, B, h), device="cuda")

        def train(m, x=x, g=g):
            def f():
                m.reset()
                m.zero_grad(set_to_none=True)
                (m(x) * g).sum().backward()
            return f
        t_tr_dense = timed(train(dense))
        t_tr_sparse = timed(train(sparse))
        # accuracy: sparse (fused) vs dense, and vs float64
        dense.reset()
        sparse.reset()
        with torch.no_grad():
            sd, ss = dense(x), sparse(x)
        vd, vs = dense.neuron.v.clone(), sparse.neuron.v.clone()
        ref = make(ni, h, False).double()
        with torch.no_grad():
            ref.W.copy_(dense.W.double())
            ref.bias.copy_(dense.bias.double())
            sr = ref(x.double())
        diff = int((ss != sd).sum().item())
        diff64 = int((ss.double() != sr).sum().item())
        dv = (vs.double() - ref.neuron.v).abs().max().item()
        dvd = (vd.double() - ref.neuron.v).abs().max().item()
        rows.append((f"{ni}x{h} T{T} B{B}", rate, path, t_dense, t_fused, t_unfused, t_sj, t_dense / t_fused,
                     t_tr_dense, t_tr_sparse, diff, diff64, dv, dvd, float(sd.mean().item()), t_always))
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rates", default="0.01,0.02,0.05,0.1,0.2")
    ap.add_argument("--shapes", default="4096x4096x32x64,700x256x100x256")
    a = ap.parse_args()
    rates = [float(r) for r in a.rates.split(",")]
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "flexdsl", flexdsl.__version__)
    rows = []
    for sh in a.shapes.split(","):
        ni, h, T, B = (int(v) for v in sh.split("x"))
        rows += run(ni, h, T, B, rates)
    print("\n| layer | rate | path | dense ms | sparse fused ms | sparse unfused ms | SpikingJelly ms | dense/fused "
          "| train dense ms | train sparse ms | spikes != dense | spikes != f64 | max|v-v64| sparse | dense | out rate "
          "| sparse \"always\" ms |")
    print("|" + " --- |" * 16)
    for r in rows:
        print(f"| {r[0]} | {r[1]:.0%} | {r[2]} | {r[3]:.3f} | {r[4]:.3f} | {r[5]:.3f} | {r[6]:.3f} | {r[7]:.2f}x | "
              f"{r[8]:.3f} | {r[9]:.3f} | {r[10]} | {r[11]} | {r[12]:.1e} | {r[13]:.1e} | {r[14]:.3f} | {r[15]:.3f} |")


if __name__ == "__main__":
    main()
