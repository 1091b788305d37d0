"""Online STDP in one kernel (`backends/triton/plastic.py`) on one GPU: checked against the
step-by-step loop (the same layer with FLEXDSL_PLASTIC_FUSED=0) and both against float64, then timed
over the kernel's tile choices, beside the same layer without a rule (same run).

Run on the device: python3 bench/plastic_online_gpu.py [--n 4096] [--t 100] [--b 32] [--sweep]
Case (bench/plasticity_gpu.py's): Linear(N -> N, no bias) into flexdsl's lif, input spikes
Bernoulli(0.05) [T, B, N], rule stdp_sj online (W changes every step, the next step reads it),
under no_grad; median of 10 after 2 warm-ups, synchronized."""
import argparse
import os
import sys
import time
from pathlib import Path

import torch

import flexdsl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plasticity_gpu import bench  # noqa: E402 - the shared harness's timing (median of 10 after 2 warm-ups)


def host_breakdown(run, m):
    """The host's time in each part of one call (no synchronization inside: what delays the launch)."""
    import collections

    from flexdsl.backends.triton import kernel as K
    from flexdsl.runtime import plastic as RP
    from flexdsl.runtime import rule as RR
    spent = collections.Counter()

    def timed(owner, name, label):
        f = getattr(owner, name)

        def g(*a, **k):
            t0 = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                spent[label] += time.perf_counter() - t0
        setattr(owner, name, g)
        return f
    saved = [(RR.Rule, "product_stepper", timed(RR.Rule, "product_stepper", "rule.product_stepper")),
             (RP, "exact_in_tf32", timed(RP, "exact_in_tf32", "exact_in_tf32")),
             (RP, "plastic_kernel", timed(RP, "plastic_kernel", "plastic_kernel (program lookup)")),
             (K.Launcher, "__call__", timed(K.Launcher, "__call__", "kernel launch")),
             (type(m.neuron), "_call_params", timed(type(m.neuron), "_call_params", "neuron._call_params")),
             (type(m.neuron), "_states_for", timed(type(m.neuron), "_states_for", "neuron._states_for"))]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(5):
        run()
    total = (time.perf_counter() - t0) / 5
    torch.cuda.synchronize()
    for owner, name, f in saved:
        setattr(owner, name, f)
    print(f"host time of a call (5 calls queued back to back): {total * 1e3:.2f} ms", flush=True)
    for k, v in spent.most_common():
        print(f"  {k:34s} {v / 5 * 1e3:7.3f} ms", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--t", type=int, default=100)
    ap.add_argument("--b", type=int, default=32)
    ap.add_argument("--sweep", action="store_true")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = "cuda"
    print(f"device {torch.cuda.get_device_name()} torch {torch.__version__}; N={a.n} T={a.t} B={a.b}", flush=True)
    g = torch.Generator(device=dev).manual_seed(0)
    x = (torch.rand(a.t, a.b, a.n, device=dev, generator=g) < 0.05).float()
    torch.manual_seed(0)
    m = flexdsl.feedforward("lif", a.n, a.n, bias=False, rule="stdp_sj", plasticity="online").to(dev)
    with torch.no_grad():
        m.W.mul_(4.0)  # (a layer that spikes: ~10 % at this input)
    w0 = m.W.detach().clone()

    def run(mod=m, xx=x, w=w0):
        with torch.no_grad():
            mod.reset()
            mod.W.copy_(w.to(mod.W.dtype))
            return mod(xx)

    # -- the same call three ways: the kernel, the loop, the loop in float64
    out = {}
    for label, fused, dtype in (("kernel fp32", "1", torch.float32), ("loop fp32", "0", torch.float32),
                                ("loop fp64", "0", torch.float64)):
        os.environ["FLEXDSL_PLASTIC_FUSED"] = fused
        try:
            mm = m if dtype == torch.float32 else flexdsl.feedforward("lif", a.n, a.n, bias=False, rule="stdp_sj",
                                                                     plasticity="online").to(dev, dtype)
            s = run(mm, x.to(dtype))
            out[label] = (s.double(), mm.W.detach().double().clone())
            if dtype == torch.float64:
                mm64 = mm
        except Exception as e:  # noqa: BLE001
            print(f"{label}: failed {type(e).__name__}: {str(e)[:300]}", flush=True)
    if "loop fp64" not in out:
        out["loop fp64"] = out["loop fp32"]
        print("(no float64 loop: both against the float32 loop)")
    os.environ.pop("FLEXDSL_PLASTIC_FUSED")
    ref_s, ref_w = out["loop fp64"]
    print(f"output rate {ref_s.mean().item():.3f}", flush=True)
    for label in ("kernel fp32", "loop fp32"):
        s, w = out[label]
        first = (s != ref_s).any(dim=(1, 2)).nonzero()
        print(f"{label:12s} vs fp64: spike mismatch {(s != ref_s).double().mean().item():.2e} "
              f"(first step {first[0].item() if len(first) else '-'}), "
              f"W rel err {((w - ref_w).norm() / (ref_w - w0.double()).norm()).item():.2e} of the change", flush=True)
    s, w = out["kernel fp32"]
    s2, w2 = out["loop fp32"]
    print(f"kernel vs loop fp32: spike mismatch {(s != s2).double().mean().item():.2e}", flush=True)
    # a closed loop: one float32 rounding can flip a spike at the threshold (either way's rounding), after
    # which the runs part; before the first flip each is float32-accurate
    flips = [(lab, (out[lab][0] != ref_s).any(dim=(1, 2)).nonzero()) for lab in ("kernel fp32", "loop fp32")]
    first = min([f[0].item() for _, f in flips if len(f)], default=None)
    if first is not None and first > 1 and "loop fp64" in out and out["loop fp64"] is not out["loop fp32"]:
        got = {}
        for label, fused, dtype in (("kernel fp32", "1", torch.float32), ("loop fp64", "0", torch.float64)):
            os.environ["FLEXDSL_PLASTIC_FUSED"] = fused
            mm = m if dtype == torch.float32 else mm64
            run(mm, x[:first].to(dtype))
            got[label] = (mm.W.detach().double().clone(), mm.neuron._states["v"].double().clone())
        os.environ.pop("FLEXDSL_PLASTIC_FUSED")
        (wk, vk), (wr, vr) = got["kernel fp32"], got["loop fp64"]
        print(f"the first {first} steps (before the first flip): kernel W rel err "
              f"{((wk - wr).norm() / (wr - w0.double()).norm()).item():.2e} of the change, "
              f"v max abs err {(vk - vr).abs().max().item():.2e}", flush=True)

    # -- timing
    static = flexdsl.feedforward("lif", a.n, a.n, bias=False).to(dev)
    with torch.no_grad():
        static.W.copy_(w0)

    def run_static():
        with torch.no_grad():
            static.reset()
            return static(x)
    t_static = bench(run_static)
    rows = []
    configs = [{}]
    if a.sweep:  # (launch settings around the default: BM rows x BN columns a block, warps, pipelined loads)
        configs += [{"STAGES": 2}, {"STAGES": 4}, {"STAGES": 5}, {"BN": 64}, {"BN": 64, "STAGES": 4},
                    {"BN": 16, "STAGES": 6}, {"WARPS": 4}, {"BM": 64}, {"BM": 64, "WARPS": 4}, {"BN": 64, "WARPS": 16}]
    keys = ("BM", "BN", "WARPS", "SPLIT", "STAGES", "PRECISION")
    for cfg in configs:
        for k in keys:
            os.environ.pop("FLEXDSL_PLASTIC_" + k, None)
        for k, v in cfg.items():
            os.environ["FLEXDSL_PLASTIC_" + k] = str(v)
        label = " ".join(f"{k}={v}" for k, v in cfg.items()) or "default"
        try:
            ms = bench(run)
        except Exception as e:  # noqa: BLE001
            print(f"{label}: failed {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        rows.append((ms, label))
        print(f"online kernel {label}: {ms:8.2f} ms  ({ms / t_static:.2f}x static)", flush=True)
    for k in keys:
        os.environ.pop("FLEXDSL_PLASTIC_" + k, None)
    os.environ["FLEXDSL_PLASTIC_FUSED"] = "0"
    t_loop = bench(run)
    os.environ.pop("FLEXDSL_PLASTIC_FUSED")
    # where one call's time goes (default tiles)
    from torch.profiler import ProfilerActivity, profile
    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        run()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8, max_name_column_width=50))
    t0 = time.perf_counter()
    run()
    t_cpu = time.perf_counter() - t0
    torch.cuda.synchronize()
    print(f"one call: {t_cpu * 1e3:.2f} ms on the host until it returns (the kernel queued)", flush=True)
    host_breakdown(run, m)
    best = min(rows)
    print("\n| case | ms | x static |\n| --- | --- | --- |")
    print(f"| flexdsl layer, no rule | {t_static:.2f} | 1.00 |")
    print(f"| online stdp_sj, step-by-step loop | {t_loop:.2f} | {t_loop / t_static:.2f} |")
    print(f"| online stdp_sj, one kernel (default tiles) | {rows[0][0]:.2f} | {rows[0][0] / t_static:.2f} |")
    print(f"| online stdp_sj, one kernel (best: {best[1]}) | {best[0]:.2f} | "
          f"{best[0] / t_static:.2f} |")


if __name__ == "__main__":
    main()
