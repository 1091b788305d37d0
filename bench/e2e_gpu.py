"""End-to-end training step of SpikingJelly's model zoo with flexdsl's LIF and with
SpikingJelly's LIFNode, same run, same card: eager, torch.compile (default) and
torch.compile(mode="reduce-overhead"), float32 and bfloat16 autocast.

    python bench/e2e_gpu.py                       # everything (on one GPU)
    python bench/e2e_gpu.py --archs sew_resnet18 --modes eager default
    python bench/e2e_gpu.py --archs spiking_vgg11_bn --dtypes bf16 --profile --variants
    python bench/e2e_gpu.py --smoke               # CPU, tiny sizes: checks the script (CI)

Cases (as bench/../shared's e2e harness measured the issue's numbers): SEW-ResNet-18 (ADD,
detach_reset) on [T=4, B=16, 3, 224, 224], spiking VGG-11-BN on [T=4, B=64, 3, 32, 32], 10
classes. A step is `reset_net; zero_grad; forward under autocast; cross-entropy of the time
mean; backward; SGD(momentum) step`; the table gives the median of `--steps` timed steps after
`--warmup` steps (which include compiling), the peak memory of a step and the time the warm-up
took (mostly compiling). flexdsl's LIF runs on its Triton kernels (`backend="auto"` on CUDA).

`--profile` prints the top CUDA kernels of one eager step per case (torch.profiler), grouped
into convolution, batch norm, the neuron and the rest; `--variants` repeats the eager step
with remedies: `channels_last` weights, `cudnn.benchmark`, and the adaptive average pool in
float32 (the cause of spiking VGG's slow bfloat16 step: see bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import types

import torch


def _stub_torchvision() -> None:
    """SpikingJelly's zoo imports one helper of torchvision to download weights (never used
    here): a stand-in where torchvision is missing (the CPU smoke run)."""
    try:
        import torchvision  # noqa: F401
    except ImportError:
        mod = types.ModuleType("torchvision._internally_replaced_utils")
        mod.load_state_dict_from_url = None
        sys.modules.setdefault("torchvision", types.ModuleType("torchvision"))
        sys.modules["torchvision._internally_replaced_utils"] = mod


def node_factory(lib: str):
    from spikingjelly.activation_based import neuron, surrogate

    import flexdsl

    def sj_lif(**kw):
        return neuron.LIFNode(tau=2.0, surrogate_function=surrogate.Sigmoid(alpha=4.0),
                              detach_reset=kw.get("detach_reset", False), step_mode="m")

    def fx_lif(**kw):
        return flexdsl.load("lif", detach_reset=kw.get("detach_reset", False), step_mode="m")

    return sj_lif if lib == "sj" else fx_lif


def build(arch: str, lib: str, dev: str, smoke: bool, channels_last: bool, pool_fp32: bool = False):
    from spikingjelly.activation_based import functional
    from spikingjelly.activation_based.model import sew_resnet, spiking_vgg

    torch.manual_seed(0)
    node = node_factory(lib)
    if arch == "sew_resnet18":
        net = sew_resnet.sew_resnet18(spiking_neuron=node, cnf="ADD", detach_reset=True, num_classes=10)
        x = torch.rand(2, 2, 3, 32, 32) if smoke else torch.rand(4, 16, 3, 224, 224)
    else:
        net = spiking_vgg.spiking_vgg11_bn(spiking_neuron=node, num_classes=10, detach_reset=True)
        x = torch.rand(2, 2, 3, 32, 32) if smoke else torch.rand(4, 64, 3, 32, 32)
    functional.set_step_mode(net, "m")
    net = net.to(dev)
    if channels_last:
        net = net.to(memory_format=torch.channels_last)
    if pool_fp32 and hasattr(net, "avgpool"):
        # the remedy for bfloat16: the adaptive average pool (and so its backward, which adds up
        # the gradients of the 7x7 outputs of a 1x1 map with atomics) in float32
        net.avgpool.register_forward_pre_hook(lambda mod, args: (args[0].float(),))
    return net, x.to(dev)


def make_step(net, model, opt, x, y, bf16: bool, dev: str):
    from spikingjelly.activation_based import functional

    def step():
        functional.reset_net(net)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=bf16):
            out = model(x).mean(0)
            loss = torch.nn.functional.cross_entropy(out.float(), y)
        loss.backward()
        opt.step()
        return loss

    return step


def sync(dev: str) -> None:
    if dev == "cuda":
        torch.cuda.synchronize()


def measure(arch, lib, bf16, mode, a, channels_last=False, cudnn_benchmark=False, pool_fp32=False) -> dict:
    dev = a.device
    torch.backends.cudnn.benchmark = cudnn_benchmark
    torch._dynamo.reset()
    net, x = build(arch, lib, dev, a.smoke, channels_last, pool_fp32)
    y = torch.randint(0, 10, (x.shape[1],), device=dev)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)
    model = net if mode == "eager" else torch.compile(net, mode=None if mode == "default" else mode)
    step = make_step(net, model, opt, x, y, bf16, dev)
    t0 = time.perf_counter()
    first_loss = float(step().detach())  # (same seed, same weights: the cases' first losses agree)
    for _ in range(a.warmup - 1):
        step()
    sync(dev)
    warm = time.perf_counter() - t0
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    ts = []
    for _ in range(a.steps):
        t = time.perf_counter()
        step()
        sync(dev)
        ts.append(time.perf_counter() - t)
    peak = torch.cuda.max_memory_allocated() / 2**30 if dev == "cuda" else float("nan")
    res = {"arch": arch, "lib": lib, "dtype": "bf16" if bf16 else "fp32", "mode": mode, "ms": statistics.median(ts) * 1e3,
           "peak_gib": peak, "warmup_s": warm, "first_loss": first_loss, "channels_last": channels_last, "cudnn_benchmark": cudnn_benchmark,
           "pool_fp32": pool_fp32}
    if a.profile and mode == "eager" and not (channels_last or cudnn_benchmark or pool_fp32):
        res["profile"] = profile(step, dev)
    del net, opt, model, step
    if dev == "cuda":
        torch.cuda.empty_cache()
    return res


def _group(name: str) -> str:
    n = name.lower()
    if "nchw" in n or "nhwc" in n or "transpose" in n or "permute" in n:
        return "layout transforms"
    if "norm" in n or "bn_" in n or "welford" in n:
        return "batch norm"
    if "flexdsl" in n or "fwd_kernel" in n or "bwd_kernel" in n or "bwd_rc_kernel" in n:
        return "neuron (flexdsl)"
    if any(k in n for k in ("conv", "cudnn", "implicit_gemm", "xmma", "sm80_", "sm90_", "cutlass", "wgrad", "dgrad",
                            "fprop", "gemm")):
        return "convolution / matmul"
    return "other (elementwise: SJ's neuron, pooling, optimizer...)"


def profile(step, dev: str) -> dict:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
    with prof(activities=acts) as p:
        for _ in range(3):
            step()
        sync(dev)
    groups: dict[str, float] = {}
    top = []
    for e in p.key_averages():
        t = getattr(e, "self_device_time_total", 0.0) if dev == "cuda" else e.self_cpu_time_total
        if t <= 0 or (dev == "cuda" and getattr(e, "device_type", None) is not None
                      and str(e.device_type).endswith("CPU")):
            continue
        g = _group(e.key)
        groups[g] = groups.get(g, 0.0) + t / 3e3  # ms per step
        top.append((t / 3e3, e.key[:90], g))
    top.sort(reverse=True)
    return {"groups_ms": groups, "top": top[:12]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--archs", nargs="+", default=["sew_resnet18", "spiking_vgg11_bn"])
    ap.add_argument("--dtypes", nargs="+", help="fp32, bf16 (default both; --smoke: fp32)")
    ap.add_argument("--modes", nargs="+", help="eager, default, reduce-overhead (default all; --smoke: eager)")
    ap.add_argument("--libs", nargs="+", default=["sj", "flexdsl"])
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="top CUDA kernels of one eager step, grouped")
    ap.add_argument("--variants", nargs="*", default=None, metavar="V",
                    help="eager runs of remedies: 'channels_last', 'cudnn.benchmark', 'channels_last+cudnn.benchmark', "
                         "'avgpool in fp32' (--variants alone: all)")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny sizes, 2 steps: the script runs")
    ap.add_argument("--json", help="also write every result here, one JSON object a line")
    a = ap.parse_args()
    if a.smoke:
        a.device, a.steps, a.warmup = "cpu", 1, 1
    else:
        a.device = "cuda"
    a.dtypes = a.dtypes or (["fp32"] if a.smoke else ["fp32", "bf16"])
    a.modes = a.modes or (["eager"] if a.smoke else ["eager", "default", "reduce-overhead"])
    all_variants = ["channels_last", "cudnn.benchmark", "channels_last+cudnn.benchmark", "avgpool in fp32"]
    a.variants = [] if a.variants is None else (a.variants or all_variants)
    _stub_torchvision()
    name = torch.cuda.get_device_name() if a.device == "cuda" else "CPU"
    print(f"device {name}, torch {torch.__version__}", flush=True)
    rows = []
    out = open(a.json, "w") if a.json else None  # noqa: SIM115
    variants = {"channels_last": (True, False, False), "cudnn.benchmark": (False, True, False),
                "channels_last+cudnn.benchmark": (True, True, False), "avgpool in fp32": (False, False, True)}
    for arch in a.archs:  # (modes outermost: the cheap eager numbers of every case come first)
        cases = [(dt, lib, mode, "") for mode in a.modes for dt in a.dtypes for lib in a.libs]
        cases += [(dt, lib, "eager", v) for v in a.variants for dt in a.dtypes for lib in a.libs]
        for dt, lib, mode, variant in cases:
            cl, cb, pf = variants[variant] if variant else (False, False, False)
            try:
                r = measure(arch, lib, dt == "bf16", mode, a, cl, cb, pf)
            except Exception as e:  # noqa: BLE001 - a case that fails is reported, the others run
                print(f"{arch} {dt} {lib} {mode} {variant}: failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
                continue
            rows.append(r)
            print(f"{arch:17s} {dt} {lib:7s} {mode:15s} {variant}: {r['ms']:8.2f} ms  peak {r['peak_gib']:.2f} GiB  "
                  f"warm-up {r['warmup_s']:.1f} s  first loss {r['first_loss']:.5f}", flush=True)
            if "profile" in r:
                p = r["profile"]
                print("    per step (ms): " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(p["groups_ms"].items())))
                for t, k, g in p["top"]:
                    print(f"      {t:7.3f} ms  [{g}] {k}")
            if out:
                out.write(json.dumps(r) + "\n")
                out.flush()
    # the summary: per arch and dtype, each library's modes and the best
    print("\n| arch | dtype | library | eager | compile default | reduce-overhead | best | flexdsl best vs SJ best |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for arch in a.archs:
        for dt in a.dtypes:
            best = {}
            for lib in a.libs:
                ms = {r["mode"]: r["ms"] for r in rows if r["arch"] == arch and r["dtype"] == dt and r["lib"] == lib
                      and not (r["channels_last"] or r["cudnn_benchmark"] or r["pool_fp32"])}
                if not ms:
                    continue
                best[lib] = min(ms.values())
                cells = [f"{ms[m]:.2f}" if m in ms else "-" for m in ("eager", "default", "reduce-overhead")]
                ratio = f"{best['sj'] / best['flexdsl']:.2f}x" if lib == "flexdsl" and "sj" in best else ""
                print(f"| {arch} | {dt} | {lib} | {' | '.join(cells)} | {best[lib]:.2f} | {ratio} |")


if __name__ == "__main__":
    main()
