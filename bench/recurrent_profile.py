"""Where the time of a recurrent layer goes on a GPU (issue 20's largest case): per-kernel times
from torch.profiler, the persistent kernel's cost per step, the input product's pieces, launch
settings, and the grid barrier alone.

    python3 bench/recurrent_profile.py                 # CUDA only
    python3 bench/recurrent_profile.py --cases 1024x250x256 --settings 0

Layer and input as in bench/recurrent_gpu.py (Linear(700 -> H) into H recurrent LIF neurons,
x = 8 x Bernoulli(0.05) spikes). Times: torch.profiler's CUDA kernel totals (mean of 3 calls), and
module calls timed like the harness (median, synchronized).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from recurrent_gpu import IN, bench, flexdsl_layer, make_step  # noqa: E402


def kernel_table(fn, n: int = 3, top: int = 8) -> list[tuple[str, float, int]]:
    """(kernel name, mean us per call, launches per call), the largest first."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    tot: dict[str, float] = defaultdict(float)
    cnt: dict[str, int] = defaultdict(int)
    for e in p.events():
        if e.device_type.name == "CUDA":
            tot[e.name[:70]] += e.device_time / n  # us
            cnt[e.name[:70]] += 1
    rows = sorted(((k, v, cnt[k] // n) for k, v in tot.items()), key=lambda r: -r[1])
    return rows[:top]


def layer_call(model, H, T, B, dtype, train, connectivity="all"):
    return make_step(flexdsl_layer(model, connectivity), H, T, B, "cuda", dtype, train)


def timeline(H, T, B, dtype="fp32", train=False):
    """One call's events in time order (us from the call's start): the CUDA kernels, the host's
    synchronisations and the long host operations, and the call's wall time without the profiler."""
    import time

    from torch.profiler import ProfilerActivity, profile

    step = layer_call("lif", H, T, B, dtype, train)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    walls = []
    for _ in range(10):
        t = time.perf_counter()
        step()
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t) * 1e6)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        step()
        torch.cuda.synchronize()
    ev = sorted(p.events(), key=lambda e: e.time_range.start)
    t0 = ev[0].time_range.start
    print(f"timeline lif {dtype} {'train' if train else 'infer'} H={H} T={T} B={B}: wall {sorted(walls)[5]:.0f} us "
          f"(median of 10, no profiler)", flush=True)
    keep = ("Synchronize", "item", "local_scalar", "equal", "LaunchKernel", "Memcpy", "to_bf16", "split3",
            "_rec_", "run")
    for e in ev:
        dur = e.time_range.end - e.time_range.start
        cuda = e.device_type.name == "CUDA"
        if cuda or (dur > 20 and any(k in e.name for k in keep)) or dur > 150:
            print(f"  {e.time_range.start - t0:9.0f} {dur:8.0f}  {'GPU' if cuda else 'cpu'}  {e.name[:80]}", flush=True)


def host(H, T, B, dtype="fp32", train=False, calls=30):
    """The host's share of a call: the time until the call returns with the GPU idle at its start
    (median), and where it goes (cProfile of `calls` calls, cumulative and own time)."""
    import cProfile
    import io
    import pstats
    import time

    step = layer_call("lif", H, T, B, dtype, train)
    for _ in range(3):
        step()
    ts = []
    for _ in range(calls):
        torch.cuda.synchronize()
        t = time.perf_counter()
        step()
        ts.append((time.perf_counter() - t) * 1e6)
        torch.cuda.synchronize()
    print(f"host lif {dtype} {'train' if train else 'infer'} H={H} T={T} B={B}: {sorted(ts)[calls // 2]:.0f} us until "
          f"the call returns (median of {calls})", flush=True)
    pr = cProfile.Profile()
    for _ in range(calls):
        torch.cuda.synchronize()
        pr.enable()
        step()
        pr.disable()
    torch.cuda.synchronize()
    for key, n in (("cumulative", 45), ("tottime", 25)):
        out = io.StringIO()
        pstats.Stats(pr, stream=out).sort_stats(key).print_stats(n)
        lines = [ln for ln in out.getvalue().splitlines() if ln.strip()][3:]
        print("\n".join("    " + ln[:150] for ln in lines), flush=True)


def milestones(H, T, B, dtype="fp32", train=False, calls=30):
    """Host time (us from the call's start, median of `calls` synchronized calls, no profiler) at
    which each stage of a layer call begins and ends: where the host's share of a call goes."""
    import time
    from collections import defaultdict

    from flexdsl.backends import layercall
    from flexdsl.backends import recurrent as scans
    from flexdsl.backends.triton import kernel, products
    from flexdsl.backends.triton import recurrent as trec
    from flexdsl.runtime import recurrent as rrec

    marks: list[tuple[str, float]] = []

    def wrap(owner, name, label):
        fn = getattr(owner, name)

        def inner(*a, **k):
            marks.append((label + ">", time.perf_counter()))
            try:
                return fn(*a, **k)
            finally:
                marks.append((label + "<", time.perf_counter()))
        setattr(owner, name, inner)
        return owner, name, fn

    undo = [wrap(products, "to_bf16", "to_bf16"), wrap(products, "split3", "split3"),
            wrap(products, "split3_mm", "split3_mm"), wrap(scans._Guess, "launch", "guess"),
            wrap(scans._Guess, "confirmed", "confirmed"), wrap(layercall, "forward", "_forward"),
            wrap(trec.TritonRecurrentProgram, "forward", "prog.forward"), wrap(kernel.Launcher, "__call__", "launch"),
            wrap(rrec.RecurrentModule, "forward", "module"),
            wrap(scans, "scan", "scan")]
    step = layer_call("lif", H, T, B, dtype, train)
    for _ in range(3):
        step()
    at: dict[str, list[float]] = defaultdict(list)
    for _ in range(calls):
        torch.cuda.synchronize()
        marks.clear()
        t0 = time.perf_counter()
        step()
        marks.append(("returned", time.perf_counter()))
        torch.cuda.synchronize()
        marks.append(("synchronized", time.perf_counter()))
        seen: dict[str, int] = defaultdict(int)
        for name, t in marks:
            seen[name] += 1
            at[f"{name}#{seen[name]}"].append((t - t0) * 1e6)
    for owner, name, fn in undo:
        setattr(owner, name, fn)
    print(f"milestones lif {dtype} {'train' if train else 'infer'} H={H} T={T} B={B} (us from the call's start, "
          f"median of {calls})", flush=True)
    for name, ts in sorted(at.items(), key=lambda kv: sorted(kv[1])[len(kv[1]) // 2]):
        print(f"  {sorted(ts)[len(ts) // 2]:8.0f}  {name}", flush=True)


def compiled_check():
    """The layer under torch.compile (fullgraph) on CUDA equals eager: spike and analog inputs,
    float32, training (spikes equal; weight gradients within 1e-4 relative: the compiled op passes
    the params as tensors, so a model's constants such as exp(-1/200) are computed in the kernel in
    float32 rather than on the host, and 50 steps of BPTT carry that rounding)."""
    import flexdsl

    print("torch.compile (fullgraph) vs eager, recurrent layers on CUDA:", flush=True)
    for model, x_kind in (("lif", "spikes"), ("alif", "spikes"), ("lif", "analog")):
        torch.manual_seed(0)
        m = flexdsl.recurrent(model, IN, 256).cuda()
        with torch.no_grad():  # (rates of about 0.1-0.3: a check that can fail)
            m.W_in.mul_({"lif": 3.0, "alif": 40.0}[model] * (1 if x_kind == "spikes" else 4))
            m.W_rec.mul_(3.0)
        x = ((torch.rand(50, 32, IN, device="cuda") < 0.05).float() * 8 if x_kind == "spikes"
             else torch.rand(50, 32, IN, device="cuda"))
        g = torch.randn(50, 32, 256, device="cuda")
        res = []
        for fn in (m, torch.compile(m, fullgraph=True)):
            m.reset()
            m.zero_grad()
            out = fn(x)
            (out * g).sum().backward()
            res.append((out.detach().clone(), [p.grad.clone() for p in (m.W_in, m.W_rec, m.bias)]))
        same = torch.equal(res[0][0], res[1][0])
        rel = max(float((a - b).norm() / b.norm()) for a, b in zip(res[1][1], res[0][1]))
        print(f"  {model} {x_kind}: spikes {'equal' if same else 'DIFFER'} (rate {float(res[0][0].mean()):.3f}), "
              f"grads rel {rel:.1e} {'ok' if same and rel < 1e-4 else 'MISMATCH'}", flush=True)


def profile_cases(cases):
    print("per-kernel CUDA time (us per call, launches per call)", flush=True)
    for model, dtype, train, conn in (("lif", "fp32", False, "all"), ("lif", "fp32", True, "all")):
        for H, T, B in cases:
            for t in (T,):
                rows = kernel_table(layer_call(model, H, t, B, dtype, train, conn))
                total = sum(r[1] for r in rows)
                print(f"  {model} {dtype} {'train' if train else 'infer'} {conn:10s} H={H} T={t} B={B}: "
                      f"top kernels {total / 1e3:.3f} ms", flush=True)
                for name, us, c in rows:
                    print(f"      {us:9.1f} us  x{c:<3d} {name}", flush=True)


def input_product_pieces(H, T, B):
    """The pieces of the fused float32 input product, each alone (do_bench, ms)."""
    from triton.testing import do_bench

    from flexdsl.backends.exact import exact_bf16 as _exact_bf16
    from flexdsl.backends.layercall import bf16_products as _bf16_products
    from flexdsl.backends.layercall import split3

    x = (torch.rand(T, B, IN, device="cuda") < 0.05).float() * 8
    w_in = torch.randn(H, IN, device="cuda") / IN ** 0.5
    b = torch.randn(H, device="cuda")
    xb = x.bfloat16()
    x2 = xb.reshape(-1, IN)
    parts = [p.t() for p in reversed(split3(w_in))]
    res = {
        "exact_bf16 check (x -> bf16, equal)": do_bench(lambda: _exact_bf16(x)),
        "3 bf16 products, fp32 out (addmm)": do_bench(lambda: _bf16_products([(x2, p) for p in parts], init=b)),
        "one bf16 product, fp32 out": do_bench(lambda: torch.mm(x2, parts[0], out_dtype=torch.float32)),
        "one bf16 product, bf16 out": do_bench(lambda: torch.mm(x2, parts[0])),
        "fp32 linear (cuBLAS, no TF32)": do_bench(lambda: torch.nn.functional.linear(x, w_in, b)),
        "x.to(bf16) alone": do_bench(lambda: x.to(torch.bfloat16)),
    }
    print(f"input product pieces H={H} T={T} B={B} (ms):", flush=True)
    for k, v in res.items():
        print(f"  {v:8.3f}  {k}", flush=True)


def product_kernel(H, T, B):
    """The fused input product (`backends/triton/products.py`) against the float64 product, and its
    launch settings (ms)."""
    from triton.testing import do_bench

    from flexdsl.backends.layercall import split3
    from flexdsl.backends.triton import products

    torch.manual_seed(0)
    x = (torch.rand(T * B, IN, device="cuda") < 0.05).float() * 8
    w_in = torch.randn(H, IN, device="cuda") / IN ** 0.5
    b = torch.randn(H, device="cuda")
    xb = products.to_bf16_exact(x)
    parts = torch.stack(split3(w_in))
    exact = x[:4096].double() @ w_in.double().t() + b.double()
    got = products.split3_mm(xb, parts, b)[:4096].double()
    bound = 2 * IN * 2.0 ** -24 * (x[:4096].double().abs() @ w_in.double().abs().t() + b.double().abs())
    f32 = torch.nn.functional.linear(x[:4096], w_in, b).double()
    print(f"fused input product H={H} M={T * B}: max |err| {float((got - exact).abs().max()):.2e} "
          f"(float32 linear {float((f32 - exact).abs().max()):.2e}), within the float32 bound: "
          f"{bool(((got - exact).abs() <= bound).all())}", flush=True)
    print(f"  to_bf16_exact {do_bench(lambda: products.to_bf16_exact(x)):.3f} ms", flush=True)
    row, best = [], None
    for tile, warps, stages in (("", "", ""), ("128x128x64", "8", "2"), ("128x128x64", "4", "3"),
                                ("128x128x32", "8", "4"), ("128x128x32", "8", "3"), ("128x64x64", "4", "3"),
                                ("64x128x64", "4", "3"), ("128x256x32", "8", "3"), ("256x128x32", "8", "3"),
                                ("128x64x64", "4", "4"), ("64x64x64", "4", "4")):
        for k, v in (("FLEXDSL_PRODUCT_TILE", tile), ("FLEXDSL_PRODUCT_WARPS", warps),
                     ("FLEXDSL_PRODUCT_STAGES", stages)):
            os.environ[k] = v
        try:
            ms = do_bench(lambda: products.split3_mm(xb, parts, b))
            row.append(f"{tile or 'default'}/{warps or '-'}/{stages or '-'} {ms:.3f}")
            if best is None or ms < best[0]:
                best = (ms, tile, warps, stages)
        except Exception as e:  # noqa: BLE001
            row.append(f"{tile}/{warps}/{stages} failed {type(e).__name__}: {str(e)[:60]}")
    for k in ("FLEXDSL_PRODUCT_TILE", "FLEXDSL_PRODUCT_WARPS", "FLEXDSL_PRODUCT_STAGES"):
        os.environ.pop(k, None)
    print("  split3_mm (tile/warps/stages ms): " + " | ".join(row), flush=True)
    if best is not None:
        _, tile, warps, stages = best
        print(f"BEST_PRODUCT FLEXDSL_PRODUCT_TILE={tile} FLEXDSL_PRODUCT_WARPS={warps} "
              f"FLEXDSL_PRODUCT_STAGES={stages}", flush=True)


DEFAULT_KNOBS = ("FLEXDSL_RECURRENT_TILE=32x64x64;FLEXDSL_RECURRENT_TILE=128x32x64;"
                 "FLEXDSL_RECURRENT_TILE=64x32x32;FLEXDSL_RECURRENT_TILE=64x32x128;"
                 "FLEXDSL_RECURRENT_WARPS=8;FLEXDSL_RECURRENT_STAGES=3")


def settings(cases, reps, knobs_arg: str = DEFAULT_KNOBS):
    """Each launch setting (`A=1,B=2;C=3`: `;` between settings) against the default, LIF fp32
    inference: the call (median, synchronized, ms) and the scan kernel alone (profiler, ms)."""
    knobs = [{}] + [dict(kv.split("=", 1) for kv in k.split(",")) for k in knobs_arg.split(";") if k]
    print("launch settings: LIF fp32 inference, call ms (median) / scan kernel ms", flush=True)
    for H, T, B in cases:
        print(f"  H={H} T={T} B={B}:", flush=True)
        for k in knobs:
            os.environ.update(k)
            try:
                ms = bench(flexdsl_layer("lif"), H, T, B, "cuda", "fp32", False, reps, 2)
                scan = sum(us for name, us, _ in kernel_table(layer_call("lif", H, T, B, "fp32", False), top=20)
                           if name.startswith("_rec_fwd")) / 1e3
                print(f"    {ms:6.3f} / {scan:6.3f}  {k or 'default'}", flush=True)
            except Exception as e:  # noqa: BLE001
                print(f"    failed {type(e).__name__}: {str(e)[:200]}  {k}", flush=True)
            for n in k:
                os.environ.pop(n)


def barrier_alone(T: int = 250):
    """A persistent kernel of P programs doing nothing but T grid barriers (us per step): polling
    with atomics (as the layer's kernel does) or with acquire loads."""
    import triton
    import triton.language as tl
    from triton.testing import do_bench

    @triton.jit
    def bar_atomic(bar, T, NPROG):
        for step in range(0, T):
            tl.debug_barrier()
            tl.atomic_add(bar, 1, sem="release", scope="gpu")
            seen = tl.atomic_add(bar, 0, sem="acquire", scope="gpu")
            while seen < (step + 1) * NPROG:
                seen = tl.atomic_add(bar, 0, sem="acquire", scope="gpu")
            tl.debug_barrier()

    @triton.jit
    def bar_load(bar, T, NPROG):
        for step in range(0, T):
            tl.debug_barrier()
            tl.atomic_add(bar, 1, sem="release", scope="gpu")
            seen = tl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [bar],
                                             dtype=tl.int32, is_pure=False, pack=1)
            while seen < (step + 1) * NPROG:
                seen = tl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [bar],
                                                 dtype=tl.int32, is_pure=False, pack=1)
            tl.debug_barrier()

    print(f"grid barrier alone, T={T} (us per step):", flush=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for P in (16, 32, 64, 128, sms):
        row = []
        for name, k in (("atomic poll", bar_atomic), ("acquire-load poll", bar_load)):
            try:
                def go(k=k, P=P):
                    bar = torch.zeros(1, dtype=torch.int32, device="cuda")
                    k[(P,)](bar, T, P, num_warps=4)
                ms = do_bench(go, warmup=5, rep=50)
                row.append(f"{name} {ms * 1e3 / T:6.2f}")
            except Exception as e:  # noqa: BLE001
                row.append(f"{name} failed {type(e).__name__}: {str(e)[:80]}")
        print(f"  P={P:4d}: " + " | ".join(row), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="1024x250x256")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--steps", default="product,profile")
    ap.add_argument("--knobs", default=DEFAULT_KNOBS, help="the settings step's settings: A=1,B=2;C=3")
    a = ap.parse_args()
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    cases = [tuple(int(v) for v in c.split("x")) for c in a.cases.split(",")]
    per_case = {"product": product_kernel, "pieces": input_product_pieces, "host": host, "timeline": timeline,
                "milestones": milestones}
    once = {"barrier": barrier_alone, "compile": compiled_check, "profile": lambda: profile_cases(cases),
            "settings": lambda: settings(cases, a.reps, a.knobs)}
    for step in a.steps.split(","):
        if step in per_case:
            for H, T, B in cases:
                per_case[step](H, T, B)
        elif step in once:
            once[step]()
        else:
            raise SystemExit(f"unknown step {step!r}: one of {', '.join([*per_case, *once])}")


if __name__ == "__main__":
    main()
