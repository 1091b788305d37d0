"""flexdsl Triton kernels on a GPU, against SpikingJelly 2.0.0 measured in the same run.

    python bench/bench_gpu.py check     # versions, correctness of every library model on CUDA,
                                        # torch.compile(fullgraph) + CUDA graphs, copy bandwidth,
                                        # a launch-shape sweep for LIF
    python bench/bench_gpu.py full      # the measurements of bench/RESULTS.md

Timings: median of triton.testing.do_bench (CUDA events), ms. Bandwidth: inference counts
read x + write spikes (2 passes of T*N*itemsize), training the 6 passes of the LIF kernels
(forward: x, spikes, saved h; backward: grad spikes, saved h, grad x).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import flexdsl  # noqa: E402
from flexdsl.backends.triton import LAUNCHES  # noqa: E402
from flexdsl.backends.triton.glue import Grads  # noqa: E402


class tb:  # noqa: N801 - this script's names for the Triton program of a model
    LAUNCHES = LAUNCHES

    @staticmethod
    def get_model(compiled):
        return compiled.program("triton")

dev = "cuda"
ROWS: list[str] = []


def bench(fn, rep=200, warmup=25):
    import triton.testing

    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def row(name, ms, nbytes=None, extra=""):
    bw = f"{nbytes / (ms * 1e-3) / 1e9:8.1f} GB/s" if nbytes else " " * 13
    line = f"{name:46s} {ms:9.3f} ms {bw} {extra}"
    print(line, flush=True)
    ROWS.append(line)


def section(f):
    def run(*a, **k):
        print(f"\n== {f.__name__}", flush=True)
        try:
            return f(*a, **k)
        except Exception:
            traceback.print_exc()
            print(f"!! {f.__name__} failed", flush=True)

    return run


@section
def versions():
    import sympy
    import triton

    print("torch", torch.__version__, "triton", triton.__version__, "sympy", sympy.__version__,
          "device", torch.cuda.get_device_name(), "SMs", torch.cuda.get_device_properties(0).multi_processor_count)
    try:
        import spikingjelly

        print("spikingjelly", getattr(spikingjelly, "__version__", "?"))
    except Exception as e:  # noqa: BLE001
        print("spikingjelly missing", e)


@section
def copy_bw():
    a = torch.rand(2**28, device=dev)
    b = torch.empty_like(a)
    ms = bench(lambda: b.copy_(a))
    row("copy (read+write), 1 GiB fp32", ms, 2 * a.numel() * 4)
    return 2 * a.numel() * 4 / (ms * 1e-3) / 1e9


@section
def check_models():
    torch.manual_seed(0)
    scale = {"adex": 3000.0, "hodgkin_huxley": 60.0, "izhikevich_2003": 40.0, "lif_ode": 4.0, "norse_lif": 300.0,
             "resonate_fire": 300.0}
    bad = []
    for name in flexdsl.library():
        T, N = 16, 1003
        x = (torch.rand(T, N, device=dev) * scale.get(name, 3.0))
        res = {}
        for backend in ("triton", "torch"):
            m = flexdsl.load(name, backend=backend).to(dev)
            xx = x.clone().requires_grad_(True)
            outs = m(xx)
            outs = outs if isinstance(outs, tuple) else (outs,)
            g = torch.autograd.grad(sum((o * torch.linspace(-1, 1, o.numel(), device=dev).reshape(o.shape)).sum()
                                        for o in outs), [xx])[0]
            res[backend] = (outs, g)
        (o1, g1), (o2, g2) = res["triton"], res["torch"]
        outs_decl = [o for o, _ in flexdsl.load(name).compiled.checked.outputs]
        mism = max([(a != b).float().mean().item() for a, b, o in zip(o1, o2, outs_decl) if o == "spike"] or [0.0])
        aerr = max([((a - b).norm() / b.norm().clamp_min(1e-30)).item()
                    for a, b, o in zip(o1, o2, outs_decl) if o != "spike"] or [0.0])
        gerr = ((g1 - g2).norm() / g2.norm().clamp_min(1e-30)).item()
        ok = mism < 0.01 and gerr < 1e-3 and aerr < 1e-4
        print(f"  {name:20s} spike mismatch {mism:.2e}  analog outputs rel err {aerr:.2e}  grad rel err {gerr:.2e}  "
              f"{'ok' if ok else 'BAD'}")
        if not ok:
            bad.append(name)
    for dtype in (torch.float16, torch.bfloat16):
        m = flexdsl.load("lif", backend="triton").to(dev)
        x = torch.rand(8, 4099, device=dev, dtype=dtype) * 3
        out = m(x.requires_grad_(True))
        out.float().sum().backward()
        print(f"  lif {dtype}: out {out.dtype}, v {m.v.dtype}, grad {x.grad.dtype}")
    print("launches", dict(tb.LAUNCHES), "BAD:", bad)


@section
def check_compile():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), flexdsl.load("lif", backend="triton"),
                              torch.nn.Linear(64, 64), flexdsl.load("plif", backend="triton")).to(dev)
    x = torch.rand(8, 32, 64, device=dev)
    ref = net(x)
    ref.sum().backward()
    gref = net[0].weight.grad.clone()
    for mode in ("default", "reduce-overhead"):
        torch._dynamo.reset()
        for m in net:
            if hasattr(m, "reset"):
                m.reset()
        net.zero_grad()
        c = torch.compile(net, fullgraph=True, mode=mode)
        for _ in range(3):
            for m in net:
                if hasattr(m, "reset"):
                    m.reset()
            net.zero_grad()
            out = c(x)
            out.sum().backward()
        print(f"  torch.compile(fullgraph=True, mode={mode}): out equal {torch.equal(out, ref)}, "
              f"grad err {(net[0].weight.grad - gref).abs().max().item():.2e}")


def lif_kernels(tm, x, g, train):
    """The kernels alone (no autograd, no module): forward (+ backward)."""
    pv = [2.0, 1.0, 0.0]
    if not train:
        return lambda: tm.fwd_impl([x], [], [], [0.0], pv, [False] * 4, False, False)
    T, N = x.shape

    call = tm.call([x], [0.0], pv, [False] * 4, False, False)
    grads = Grads([g], [None], [None])

    def f():
        res = tm.fwd_impl([x], [], [], [0.0], pv, [False] * 4, False, True)
        tm.bwd(call, [], res[2], [None] * 3, [None], grads, [True, False])

    return f


@section
def sweep(T=32, N=4194304):
    m = flexdsl.load("lif", backend="triton")
    tm = tb.get_model(m.compiled)
    x = torch.rand(T, N, device=dev) * 1.5
    g = torch.rand_like(x)
    for block, warps in [(256, 4), (512, 4), (1024, 4), (1024, 8), (2048, 8), (4096, 8)]:
        tm.block, tm.warps = block, warps
        fi = bench(lif_kernels(tm, x, g, False))
        ft = bench(lif_kernels(tm, x, g, True))
        row(f"LIF T={T} kernels BLOCK={block} warps={warps} infer", fi, 2 * T * N * 4)
        row(f"LIF T={T} kernels BLOCK={block} warps={warps} train", ft, 6 * T * N * 4)


def sj_lif(x, xg, g, dtype=torch.float32):
    from spikingjelly.activation_based import functional, neuron, surrogate

    mod = neuron.LIFNode(tau=2.0, surrogate_function=surrogate.Sigmoid(alpha=4.0), step_mode="m").to(dev)

    def inf():
        functional.reset_net(mod)
        with torch.no_grad():
            return mod(x)

    def train():
        functional.reset_net(mod)
        xg.grad = None
        mod(xg).backward(g)

    return inf, train


def fx_model(name, x, xg, g, **kw):
    m = flexdsl.load(name, backend="triton", **kw).to(dev)

    def inf():
        m.reset()
        with torch.no_grad():
            return m(x)

    def train():
        m.reset()
        xg.grad = None
        out = m(xg)
        (out[0] if isinstance(out, tuple) else out).backward(g)

    return m, inf, train


@section
def lif_main(copy_gbs):
    N = 4194304
    summary = []
    for T in (8, 32, 128):
        torch.manual_seed(0)
        x = torch.rand(T, N, device=dev) * 1.5
        xg = x.clone().requires_grad_(True)
        g = torch.rand_like(x)
        ib, tbytes = 2 * T * N * 4, 6 * T * N * 4
        m, inf, train = fx_model("lif", x, xg, g)
        inf(), train()
        tm = tb.get_model(m.compiled)
        # correctness vs SpikingJelly
        s_inf, s_train = sj_lif(x, xg, g)
        ref = s_inf()
        s_train()
        gref = xg.grad.clone()
        out = inf()
        train()
        print(f"  T={T}: spikes mismatch vs SJ {(out != ref).float().mean().item():.2e}, "
              f"grad rel err {((xg.grad - gref).norm() / gref.norm()).item():.2e}")
        a = bench(inf)
        b = bench(train)
        c = bench(lif_kernels(tm, x, g, False))
        d = bench(lif_kernels(tm, x, g, True))
        e = bench(s_inf)
        f = bench(s_train)
        row(f"flexdsl LIF fp32 T={T} infer (module, no_grad)", a, ib)
        row(f"flexdsl LIF fp32 T={T} train (module fwd+bwd)", b, tbytes)
        row(f"flexdsl LIF fp32 T={T} infer kernel", c, ib, f"{ib / (c * 1e-3) / 1e9 / copy_gbs * 100:.0f}% of copy")
        row(f"flexdsl LIF fp32 T={T} train kernels", d, tbytes,
            f"{tbytes / (d * 1e-3) / 1e9 / copy_gbs * 100:.0f}% of 6-pass floor")
        row(f"SpikingJelly LIFNode fp32 T={T} infer", e, ib)
        row(f"SpikingJelly LIFNode fp32 T={T} train", f, tbytes, f"flexdsl {f / b:.2f}x faster")
        summary.append((T, a, b, c, d, e, f))
        del x, xg, g
        torch.cuda.empty_cache()
    # bf16
    T = 32
    x = (torch.rand(T, N, device=dev) * 1.5).to(torch.bfloat16)
    xg = x.clone().requires_grad_(True)
    g = torch.rand_like(x)
    m, inf, train = fx_model("lif", x, xg, g)
    inf(), train()
    tm = tb.get_model(m.compiled)
    a, b = bench(inf), bench(train)
    c, d = bench(lif_kernels(tm, x, g, False)), bench(lif_kernels(tm, x, g, True))
    fp = [s for s in summary if s[0] == 32][0]
    row(f"flexdsl LIF bf16 T={T} infer (module)", a, T * N * 4, f"{fp[1] / a:.2f}x vs fp32")
    row(f"flexdsl LIF bf16 T={T} train (module)", b, 3 * T * N * 4, f"{fp[2] / b:.2f}x vs fp32")
    row(f"flexdsl LIF bf16 T={T} infer kernel", c, T * N * 4, f"{fp[3] / c:.2f}x vs fp32")
    row(f"flexdsl LIF bf16 T={T} train kernels", d, 3 * T * N * 4, f"{fp[4] / d:.2f}x vs fp32")
    try:
        s_inf, s_train = sj_lif(x, xg, g)
        s_inf(), s_train()
        row(f"SpikingJelly LIFNode bf16 T={T} infer", bench(s_inf, rep=100), T * N * 4)
        row(f"SpikingJelly LIFNode bf16 T={T} train", bench(s_train, rep=100), 3 * T * N * 4)
    except Exception as e:  # noqa: BLE001
        print("  SJ bf16 failed:", e)


@section
def small_overhead():
    T, N = 8, 4096
    x = torch.rand(T, N, device=dev) * 1.5
    xg = x.clone().requires_grad_(True)
    g = torch.rand_like(x)
    m, inf, train = fx_model("lif", x, xg, g)
    inf(), train()
    tm = tb.get_model(m.compiled)
    s_inf, s_train = sj_lif(x, xg, g)
    s_inf(), s_train()
    torch.cuda.synchronize()
    for name, fn in [("flexdsl infer", inf), ("flexdsl train", train), ("flexdsl kernels infer", lif_kernels(tm, x, g, False)),
                     ("SJ infer", s_inf), ("SJ train", s_train)]:
        n = 200
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        row(f"call overhead, T=8 N=4096: {name} (host us/call)", (time.perf_counter() - t0) / n * 1e3, None,
            f"{(time.perf_counter() - t0) / n * 1e6:.1f} us")


@section
def multi_state():
    from spikingjelly.activation_based import functional, neuron, surrogate

    T, N = 32, 4194304
    torch.manual_seed(0)
    x = torch.rand(T, N, device=dev) * 1.5
    xg = x.clone().requires_grad_(True)
    g = torch.rand_like(x)
    sj = neuron.IzhikevichNode(surrogate_function=surrogate.Sigmoid(alpha=4.0), step_mode="m").to(dev)

    def s_inf():
        functional.reset_net(sj)
        with torch.no_grad():
            return sj(x)

    def s_train():
        functional.reset_net(sj)
        xg.grad = None
        sj(xg).backward(g)

    s_inf(), s_train()
    m, inf, train = fx_model("izhikevich", x, xg, g)
    inf(), train()
    tm = tb.get_model(m.compiled)
    ref = s_inf()
    print(f"  izhikevich spikes mismatch vs SJ {(inf() != ref).float().mean().item():.2e}; saved {tm.saved}")
    k = len(tm.saved) + len(tm.reread)
    row("flexdsl Izhikevich fp32 T=32 infer", bench(inf), 2 * T * N * 4)
    row("flexdsl Izhikevich fp32 T=32 train", bench(train), (4 + 2 * len(tm.saved) + len(tm.reread)) * T * N * 4,
        f"{4 + 2 * len(tm.saved) + len(tm.reread)} passes")
    row("SpikingJelly IzhikevichNode fp32 T=32 infer", bench(s_inf), 2 * T * N * 4)
    row("SpikingJelly IzhikevichNode fp32 T=32 train", bench(s_train), None)
    del m
    xh = torch.rand(T, N, device=dev) * 60
    xhg = xh.clone().requires_grad_(True)
    m, inf, train = fx_model("hodgkin_huxley", xh, xhg, g)
    inf(), train()
    tm = tb.get_model(m.compiled)
    p = 4 + 2 * len(tm.saved) + len(tm.reread)  # in, out(spike), g_spike, g_in + saves (2 each) + rereads
    row("flexdsl Hodgkin-Huxley fp32 T=32 infer (2 outputs)", bench(inf), 3 * T * N * 4, "x + spike + v")
    row("flexdsl Hodgkin-Huxley fp32 T=32 train", bench(train), (p + 1) * T * N * 4, f"{p + 1} passes, saved {tm.saved}")
    k = k


@section
def open_neuromorphic():
    from spikingjelly.activation_based import functional, neuron, surrogate

    T, B = 500, 16
    for n in (4096, 8192, 16384):
        torch.manual_seed(0)
        x = torch.rand(T, B, n, device=dev)
        for impl in ("flexdsl", "spikingjelly"):
            lin = torch.nn.Linear(n, n).to(dev)
            if impl == "flexdsl":
                lif = flexdsl.load("lif", backend="triton").to(dev)
            else:
                lif = neuron.LIFNode(tau=2.0, surrogate_function=surrogate.Sigmoid(alpha=4.0), step_mode="m").to(dev)
            net = torch.nn.Sequential(lin, lif)

            def step(net=net, x=x):
                functional.reset_net(net)
                net.zero_grad(set_to_none=True)
                net(x).sum().backward()

            step()
            torch.cuda.synchronize()
            ms = bench(step, rep=300 if n < 16384 else 600, warmup=50)
            row(f"OpenNeuromorphic Linear({n})+LIF B=16 T=500 {impl}", ms)
            del net, lin, lif
            torch.cuda.empty_cache()


BUILD_CODE = r"""
import os, sys, time, torch
torch.zeros(1, device="cuda"); torch.cuda.synchronize()    # CUDA context outside the timing
import flexdsl
T = int(sys.argv[1])
x = torch.rand(T, 65536, device="cuda", requires_grad=True)
t0 = time.perf_counter()
m = flexdsl.load("lif", backend="triton")
m.compiled.program("triton")
t1 = time.perf_counter()
m(x).sum().backward(); torch.cuda.synchronize()
t2 = time.perf_counter()
print(f"{(t1 - t0) * 1e3:.1f} {(t2 - t1) * 1e3:.1f}")
"""


@section
def build_time():
    import tempfile

    for T in (4, 16, 64, 256, 512):
        d = tempfile.mkdtemp()
        env = dict(os.environ, FLEXDSL_CACHE_DIR=d + "/fx", TRITON_CACHE_DIR=d + "/tr")
        for kind in ("cold (empty caches)", "warm disk caches, new process"):
            out = subprocess.run([sys.executable, "-c", BUILD_CODE, str(T)], capture_output=True, text=True, env=env)
            if out.returncode != 0:
                print(out.stderr[-2000:])
                continue
            a, b = (float(v) for v in out.stdout.split()[-2:])
            row(f"build T={T:3d} {kind}: load+kernels source", a, None, f"first fwd+bwd (Triton JIT/load) {b:.1f} ms")


def main():
    what = sys.argv[1] if len(sys.argv) > 1 else "check"
    versions()
    gbs = copy_bw() or 3000.0
    if what == "check":
        check_models()
        check_compile()
        sweep()
    elif what == "build":
        build_time()
    elif what == "lif":
        lif_main(gbs)
        small_overhead()
    else:
        check_models()
        lif_main(gbs)
        small_overhead()
        multi_state()
        open_neuromorphic()
        build_time()
    print("\n== summary")
    for r in ROWS:
        print(r)


if __name__ == "__main__":
    main()
