"""torch.compile (Inductor) against eager flexdsl on a GPU, with the ops Inductor traces into
(`flexdsl/backends/triton/inductor.py`: `triton_op`s, the kernels launched by Inductor's code)
and with the opaque custom ops (FLEXDSL_TRITON_INDUCTOR=0's path), in one process:
1. lif, izhikevich, a noisy LIF (which keeps the custom ops) and LIF on channels_last input:
   compiled (default mode) outputs and gradients against eager, recompiles over 3 calls, and
   whether the compiled calls went through flexdsl's launcher (`LAUNCHES`) or Inductor's code;
2. the step (reset, forward, mean, backward) of 16 LIF layers on [4, 16, 64, 32, 32] fp32:
   median of 30 synchronized steps, eager / default (custom ops) / default / reduce-overhead.

    python3 bench/compile_ops_gpu.py            (a CUDA GPU)
    python3 bench/compile_ops_gpu.py --models   (instead of 1. and 2.: every library model, compiled vs eager)
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch
from torch._dynamo.utils import counters

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import flexdsl  # noqa: E402
from flexdsl.backends.triton import inductor  # noqa: E402
from flexdsl.backends.triton.kernel import LAUNCHES  # noqa: E402

from noisy_models import NLIF  # noqa: E402

DEV = "cuda"


def fwd_bwd(m, x, w, **kw):
    torch.manual_seed(1)
    m.reset()
    for p in m.parameters():
        p.grad = None
    x = x.detach().clone().requires_grad_(True)
    out = m(x, **kw)
    out = out[0] if isinstance(out, tuple) else out
    (out * w).sum().backward()
    named = getattr(m, "_orig_mod", m).named_parameters()  # (a compiled module's names carry `_orig_mod.`)
    return out.detach(), x.grad, {n: p.grad for n, p in named if p.grad is not None}


def rel(a, b) -> float:
    if a is None or b is None:
        return 0.0 if a is b else float("inf")
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30)).item()


def check(name: str, make, x, new: bool, kw: dict) -> dict:
    inductor.ENABLED[0] = new
    torch.manual_seed(0)
    w = torch.randn_like(x)
    m = make()
    ref = fwd_bwd(m, x, w, **kw)
    torch._dynamo.reset()
    cm = torch.compile(m)
    fwd_bwd(cm, x, w, **kw)
    counters.clear()
    LAUNCHES.clear()
    worst, spikes_equal = 0.0, True
    for _ in range(3):
        out, gx, gp = fwd_bwd(cm, x, w, **kw)
        spikes_equal &= torch.equal(out, ref[0])
        worst = max(worst, rel(gx, ref[1]), *(rel(gp.get(k), v) for k, v in ref[2].items()))
    return {"case": name, "path": "triton_op" if new else "custom op", "out_equal": spikes_equal,
            "grad_rel": worst, "recompiles": counters["stats"]["unique_graphs"],
            "flexdsl_launches": sum(LAUNCHES.values()), "spiked": ref[0].mean().item()}


def dynamic_shapes() -> dict:
    """One compiled LIF called with three shapes (Dynamo marks the sizes dynamic at the second):
    each call against eager, and the number of graphs compiled."""
    inductor.ENABLED[0] = True
    torch._dynamo.reset()
    m = flexdsl.load("lif", learnable="tau").to(DEV)
    cm = torch.compile(m)
    counters.clear()
    worst, equal = 0.0, True
    for shape in ((4, 2, 8, 8), (6, 3, 8, 8), (5, 7, 8, 8), (9, 3, 8, 8)):
        x = torch.rand(*shape, device=DEV) * 2.5
        w = torch.randn_like(x)
        ref, got = fwd_bwd(m, x, w), fwd_bwd(cm, x, w)
        equal &= torch.equal(ref[0], got[0])
        worst = max(worst, rel(got[1], ref[1]), *(rel(got[2].get(k), v) for k, v in ref[2].items()))
    return {"case": "lif learnable tau, 4 shapes", "path": "triton_op", "out_equal": equal, "grad_rel": worst,
            "recompiles": counters["stats"]["unique_graphs"], "flexdsl_launches": ""}


SCALE = {"adex": 1500.0, "hodgkin_huxley": 20.0, "morris_lecar": 100.0, "izhikevich_2003": 20.0, "izhikevich": 20.0,
         "lif_ode": 3.0, "lif_refractory": 3.0, "eif": 3.0, "qif": 3.0}


def every_model() -> list[dict]:
    """Every library model compiled (default mode, the triton_ops) against eager on [8, 4, 16, 16, 16]:
    outputs equal, the input's gradient and the learnable params' to rounding."""
    rows = []
    inductor.ENABLED[0] = True
    for path in sorted((Path(flexdsl.__file__).resolve().parent.parent / "neurons").glob("*.neuron")):
        name = path.stem
        try:
            x = torch.rand(8, 4, 16, 16, 16, generator=torch.Generator().manual_seed(2)).to(DEV) * SCALE.get(name, 2.5)
            torch._dynamo.reset()
            r = check(name, lambda name=name: flexdsl.load(name).to(DEV), x, True, {})
        except Exception as e:  # (report and go on)
            r = {"case": name, "path": "triton_op", "error": repr(e)[-300:]}
        print(r, flush=True)
        rows.append(r)
    return rows


def stack_step(model, net, x):
    def step():
        for m in net:
            m.reset()
        x.grad = None
        model(x).mean().backward()
    return step


def timed(step, n: int = 30) -> float:
    for _ in range(5):
        step()
    ts = []
    for _ in range(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        step()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3


def top_kernels(step, label: str) -> None:
    """The CUDA kernels of 3 steps, by total time (what a compiled step adds to the eager one)."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            step()
        torch.cuda.synchronize()
    print(f"\n--- {label}: 3 steps")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60))


def log_ttir_failures() -> None:
    """Print the scalar arguments of a kernel whose mutation analysis fails (Inductor then
    assumes every tensor argument is mutated, and clones it)."""
    from torch._higher_order_ops import triton_kernel_wrap as tkw
    orig = tkw.generate_ttir

    def wrapped(kernel, kwargs, *a, **k):
        try:
            return orig(kernel, kwargs, *a, **k)
        except Exception:
            print("TTIR failure", getattr(kernel, "__name__", kernel),
                  {n: v for n, v in kwargs.items() if not isinstance(v, torch.Tensor)}, flush=True)
            raise
    tkw.generate_ttir = wrapped


def stack_times() -> list[tuple[str, float]]:
    net = torch.nn.Sequential(*[flexdsl.load("lif", detach_reset=True) for _ in range(16)]).to(DEV)
    x = (torch.rand(4, 16, 64, 32, 32, device=DEV) * 2.5).requires_grad_(True)
    rows = [("eager", timed(stack_step(net, net, x)))]
    for label, mode, new in (("default (custom ops)", "default", False), ("default (triton_op)", "default", True),
                             ("reduce-overhead (triton_op)", "reduce-overhead", True),
                             ("eager again", None, True)):
        inductor.ENABLED[0] = new
        torch._dynamo.reset()
        model = net if mode is None else torch.compile(net, mode=mode)
        rows.append((label, timed(stack_step(model, net, x))))
        if mode == "default" or mode is None:
            top_kernels(stack_step(model, net, x), label)
    return rows


def table(rows: list[dict], times: list[tuple[str, float]]) -> None:
    print("\n| case | path | outputs equal | grads max rel diff | recompiles | flexdsl launches | error |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['path']} | {r.get('out_equal', '')} | {r.get('grad_rel', float('nan')):.2e} | "
              f"{r.get('recompiles', '')} | {r.get('flexdsl_launches', '')} | {r.get('error', '')} |")
    if times:
        print(f"\n16 LIF layers, [4, 16, 64, 32, 32] fp32, step (reset, forward, mean, backward), "
              f"{torch.cuda.get_device_name()}")
        print("| mode | ms (median of 30) |\n|---|---|")
        for label, ms in times:
            print(f"| {label} | {ms:.2f} |")


def cases() -> list[dict]:
    x5 = torch.rand(8, 4, 16, 16, 16, device=DEV)
    cl = (torch.rand(8, 4, 16, 16, 16, device=DEV).permute(0, 1, 3, 4, 2).contiguous().permute(0, 1, 4, 2, 3))
    todo = [("lif", lambda: flexdsl.load("lif").to(DEV), x5 * 2.5),
            ("izhikevich", lambda: flexdsl.load("izhikevich").to(DEV), x5 * 20.0),
            ("noisy lif", lambda: flexdsl.loads(NLIF).to(DEV), x5 * 1.5),
            ("lif channels_last", lambda: flexdsl.load("lif").to(DEV), cl * 2.5),
            ("lif bf16", lambda: flexdsl.load("lif").to(DEV), (x5 * 2.5).bfloat16()),
            ("lif learnable tau", lambda: flexdsl.load("lif", learnable="tau").to(DEV), x5 * 2.5),
            ("plif", lambda: flexdsl.load("plif").to(DEV), x5 * 2.5)]
    rows = []
    for name, make, x in todo:
        for new in (False, True):
            try:
                r = check(name, make, x, new, {"seed": 7} if "noisy" in name else {})
            except Exception as e:  # (report and go on: the table says which case failed)
                r = {"case": name, "path": "triton_op" if new else "custom op", "error": repr(e)[:300]}
            print(r, flush=True)
            rows.append(r)
    return rows


def main() -> None:
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    log_ttir_failures()
    rows = every_model() if "--models" in sys.argv else cases()
    try:
        rows.append(dynamic_shapes())
    except Exception as e:
        rows.append({"case": "lif learnable tau, 4 shapes", "path": "triton_op", "error": repr(e)[:300]})
    print(rows[-1], flush=True)
    table(rows, [] if "--models" in sys.argv else stack_times())


if __name__ == "__main__":
    main()
