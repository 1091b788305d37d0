"""End-to-end training step of SpikingJelly's model zoo with flexdsl's LIF, with SpikingJelly's
LIFNode and with a zero-cost neuron (the identity: the ceiling any neuron implementation can
reach), same run, same card: eager, torch.compile (default) and torch.compile(mode=
"reduce-overhead"), float32 and bfloat16 autocast, NCHW or channels_last.

    python bench/e2e_gpu.py                       # everything, one case after another (one GPU)
    python bench/e2e_gpu.py --archs sew_resnet18 --modes eager default
    python bench/e2e_gpu.py --archs spiking_vgg11_bn --dtypes bf16 --profile --variants
    python bench/e2e_gpu.py --plan h100 --jobs 8 --deadline 200   # the card's run: see below
    python bench/e2e_gpu.py --smoke               # CPU, tiny sizes: checks the script (CI)

Cases (as bench/../shared's e2e harness measured the issue's numbers): SEW-ResNet-18 (ADD,
detach_reset) on [T=4, B=16, 3, 224, 224], spiking VGG-11-BN on [T=4, B=64, 3, 32, 32], 10
classes; `lif_stack`: 16 LIF layers in a row on [4, 16, 64, 32, 32] (the neuron alone, compiled
against eager); `mlp8`: 8 x (Linear(4096) -> LIF) on [T=32, B=64, 4096] spikes at 20 % (flexdsl: its
feed-forward layers, `flexdsl.feedforward("lif", 4096, 4096)`, the synapse and the neuron in one
module that keeps its 0/1 input as bits). A step is `reset_net; zero_grad; forward under autocast; cross-entropy of the
time mean (lif_stack: the mean); backward; SGD(momentum) step`; the table gives the median of
`--steps` timed steps after `--warmup` steps (which include compiling), the peak memory of a
step (in the summary: above the resident model, input and last gradients, as bench/memopt_gpu.py
defines it) and the time the warm-up took (mostly compiling). flexdsl's LIF runs on its Triton kernels
(`backend="auto"` on CUDA). Libraries: `flexdsl`, `sj` (LIFNode, its default torch backend), `memopt`
(SpikingJelly 2.0.0's `memopt.optimize_memory` applied to the `sj` network, `--memopt-level`, its
targets as in its paper's setting: the ResNet's BasicBlocks, the VGG's convolutions and LIF nodes, the
MLP's linear layers and LIF nodes; the search's time reported as `search_s`), `flexdsl-bits`
(`flexdsl.save_spikes_as_bits(net, recompute=--bits-recompute)` on the flexdsl network: the
memory-first form) and `zero` (nn.Identity in every neuron's place: what the rest of the network costs).

`--jobs N` runs every case in a process of its own, N compiling at a time, in two phases:
all cases build and warm up (compile) in parallel, then each is timed alone, one after
another, on an idle machine (the others wait, their compiled models kept). A case not warm by
`--deadline` seconds is stopped and reported as such, and so is one whose timing takes over
`--case-timeout` seconds. `--plan h100` is the list of cases measured for bench/RESULTS.md.

`--profile` prints the top CUDA kernels of one eager step per case (torch.profiler), grouped
into convolution, batch norm, the neuron and the rest; `--variants` repeats the cases (in each
of `--modes`) with remedies: `channels_last` weights, `cudnn.benchmark`, and the adaptive
average pool in float32 (the cause of spiking VGG's slow bfloat16 step: see bench/RESULTS.md),
e.g. `--archs sew_resnet18 --libs flexdsl sj zero --modes reduce-overhead --variants
channels_last --jobs 6`.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
import types

import torch

MODES = ("eager", "default", "reduce-overhead")
VARIANTS = {"": (False, False, False), "channels_last": (True, False, False), "cudnn.benchmark": (False, True, False),
            "channels_last+cudnn.benchmark": (True, True, False), "avgpool in fp32": (False, False, True)}


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

    def zero(**kw):  # the ceiling: no neuron at all
        return torch.nn.Identity()

    return {"sj": sj_lif, "memopt": sj_lif, "flexdsl": fx_lif, "flexdsl-bits": fx_lif, "zero": zero}[lib]


def build(arch: str, lib: str, dev: str, smoke: bool, channels_last: bool, pool_fp32: bool = False):
    from spikingjelly.activation_based import functional
    from spikingjelly.activation_based.model import sew_resnet, spiking_vgg

    torch.manual_seed(0)
    node = node_factory(lib)
    if arch == "sew_resnet18":
        net = sew_resnet.sew_resnet18(spiking_neuron=node, cnf="ADD", detach_reset=True, num_classes=10)
        x = torch.rand(2, 2, 3, 32, 32) if smoke else torch.rand(4, 16, 3, 224, 224)
    elif arch == "spiking_vgg11_bn":
        net = spiking_vgg.spiking_vgg11_bn(spiking_neuron=node, num_classes=10, detach_reset=True)
        x = torch.rand(2, 2, 3, 32, 32) if smoke else torch.rand(4, 64, 3, 32, 32)
    elif arch == "mlp8":  # 8 x (Linear(4096) -> LIF), T = 32, batch 64
        n = 64 if smoke else 4096
        if lib.startswith("flexdsl"):
            import flexdsl
            net = torch.nn.Sequential(*[flexdsl.feedforward("lif", n, n) for _ in range(8)])
        else:
            from spikingjelly.activation_based import layer
            net = torch.nn.Sequential(*[m for _ in range(8) for m in (layer.Linear(n, n), node(detach_reset=True))])
        x = (torch.rand(2, 2, n) if smoke else torch.rand(32, 64, n)) < 0.2
        x = x.float()
    else:  # lif_stack: the neuron alone, 16 layers
        net = torch.nn.Sequential(*[node(detach_reset=True) for _ in range(16)])
        x = (torch.rand(2, 2, 8, 4, 4) if smoke else torch.rand(4, 16, 64, 32, 32)) * 2.5
    functional.set_step_mode(net, "m")
    net = net.to(dev)
    if channels_last:
        net = net.to(memory_format=torch.channels_last)
    if pool_fp32 and hasattr(net, "avgpool"):
        # the remedy for bfloat16: the adaptive average pool (and so its backward, which adds up
        # the gradients of the 7x7 outputs of a 1x1 map with atomics) in float32
        net.avgpool.register_forward_pre_hook(lambda mod, args: (args[0].float(),))
    x = x.to(dev)
    if arch == "lif_stack":  # (no weights: the gradient is the input's)
        x.requires_grad_(True)
    return net, x


def optimize(net, x, arch: str, lib: str, a) -> tuple[torch.nn.Module, float]:
    """The `memopt` and `flexdsl-bits` libraries' network (and the seconds its search took)."""
    t0 = time.perf_counter()
    if lib == "memopt":
        from spikingjelly.activation_based import functional, layer, neuron
        from spikingjelly.activation_based.memopt import optimize_memory
        from spikingjelly.activation_based.model import sew_resnet
        targets = {"sew_resnet18": (sew_resnet.BasicBlock,), "spiking_vgg11_bn": (layer.Conv2d, neuron.LIFNode),
                   "mlp8": (layer.Linear, neuron.LIFNode)}.get(arch, (neuron.LIFNode,))

        def example(m, x=x):
            functional.reset_net(m)
            return m(x)
        net = optimize_memory(net, targets, example, level=a.memopt_level)
    elif lib == "flexdsl-bits":
        import flexdsl
        flexdsl.save_spikes_as_bits(net, recompute=None if a.bits_recompute == "none" else a.bits_recompute)
    else:
        return net, 0.0
    sync(a.device)
    return net, time.perf_counter() - t0


def make_step(net, model, opt, x, y, bf16: bool, dev: str, arch: str):
    from spikingjelly.activation_based import functional

    def step():
        functional.reset_net(net)
        opt.zero_grad(set_to_none=True)
        x.grad = None
        with torch.autocast(dev, dtype=torch.bfloat16, enabled=bf16):
            out = model(x)
            if arch == "lif_stack":
                loss = out.float().mean()
            else:
                loss = torch.nn.functional.cross_entropy(out.mean(0).float(), y)
        loss.backward()
        opt.step()
        return loss

    return step


def sync(dev: str) -> None:
    if dev == "cuda":
        torch.cuda.synchronize()


class Case:
    """One measured case: built and warmed up (compiled) by `prepare`, timed by `time`."""

    def __init__(self, arch: str, lib: str, dtype: str, mode: str, variant: str, a) -> None:
        self.arch, self.lib, self.dtype, self.mode, self.variant, self.a = arch, lib, dtype, mode, variant, a

    def prepare(self) -> None:
        a, dev = self.a, self.a.device
        cl, cb, pf = VARIANTS[self.variant]
        torch.backends.cudnn.benchmark = cb
        torch._dynamo.reset()
        net, x = build(self.arch, self.lib, dev, a.smoke, cl, pf)
        net, self.search = optimize(net, x, self.arch, self.lib, a)
        y = torch.randint(0, 10, (x.shape[1],), device=dev)
        params = list(net.parameters())
        opt = torch.optim.SGD(params, lr=1e-3, momentum=0.9) if params else _NoOpt()
        model = net if self.mode == "eager" else torch.compile(net, mode=None if self.mode == "default" else self.mode)
        self.step = make_step(net, model, opt, x, y, self.dtype == "bf16", dev, self.arch)
        t0 = time.perf_counter()
        self.first_loss = float(self.step().detach())  # (same seed, same weights: the cases' first losses agree)
        for _ in range(a.warmup - 1):
            self.step()
        sync(dev)
        self.warm = time.perf_counter() - t0
        if dev == "cuda" and self.mode != "reduce-overhead":
            torch.cuda.empty_cache()  # (while other cases compile and wait: the memory of a step only)

    def time(self) -> dict:
        a, dev = self.a, self.a.device
        for _ in range(2 if a.jobs else 0):  # (after waiting: the allocator's blocks back, clocks up)
            self.step()
        sync(dev)
        base = 0
        if dev == "cuda":
            base = torch.cuda.memory_allocated()  # (the resident model, input and last step's gradients)
            torch.cuda.reset_peak_memory_stats()
        ts = []
        for _ in range(a.steps):
            t = time.perf_counter()
            self.step()
            sync(dev)
            ts.append(time.perf_counter() - t)
        peak = torch.cuda.max_memory_allocated() / 2**30 if dev == "cuda" else float("nan")
        above = peak - base / 2**30  # (as bench/memopt_gpu.py defines a step's peak)
        cl, cb, pf = VARIANTS[self.variant]
        res = {"arch": self.arch, "lib": self.lib, "dtype": self.dtype, "mode": self.mode, "variant": self.variant,
               "ms": statistics.median(ts) * 1e3, "min_ms": min(ts) * 1e3, "peak_gib": peak, "warmup_s": self.warm,
               "first_loss": self.first_loss, "channels_last": cl, "cudnn_benchmark": cb, "pool_fp32": pf,
               "search_s": self.search, "peak_above_gib": above}
        if a.profile and self.mode == "eager" and not self.variant and self.arch != "lif_stack":
            res["profile"] = profile(self.step, dev)
        return res


class _NoOpt:
    def zero_grad(self, set_to_none: bool = True) -> None:
        pass

    def step(self) -> None:
        pass


def measure(arch, lib, bf16, mode, a, channels_last=False, cudnn_benchmark=False, pool_fp32=False) -> dict:
    """One case, built, warmed up and timed in this process."""
    variant = next(k for k, v in VARIANTS.items() if v == (channels_last, cudnn_benchmark, pool_fp32))
    case = Case(arch, lib, "bf16" if bf16 else "fp32", mode, variant, a)
    case.prepare()
    res = case.time()
    del case
    if a.device == "cuda":
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


# ------------------------------------------------------------------ the cases
def plan_h100() -> list[tuple[str, str, str, str, str]]:
    """The H100 run of bench/RESULTS.md, in order of priority: (arch, lib, dtype, mode, variant).
    SEW-ResNet-18 in every mode for flexdsl (compiled against eager), SpikingJelly's eager and
    best (reduce-overhead) modes, the zero-cost network under CUDA graphs (the ceiling); the
    neuron alone (`lif_stack`); the same under channels_last; the VGG's flexdsl modes."""
    cases = []
    for dt in ("fp32", "bf16"):
        cases += [("sew_resnet18", "flexdsl", dt, m, "") for m in MODES]
        cases += [("sew_resnet18", "sj", dt, m, "") for m in ("eager", "reduce-overhead")]
        cases += [("sew_resnet18", "zero", dt, "reduce-overhead", "")]
    cases += [("lif_stack", "flexdsl", "fp32", m, "") for m in MODES]
    cases += [("lif_stack", "sj", "fp32", m, "") for m in ("eager", "default")]
    for dt in ("fp32", "bf16"):
        cases += [("sew_resnet18", lib, dt, "reduce-overhead", "channels_last") for lib in ("flexdsl", "sj", "zero")]
    cases += [("spiking_vgg11_bn", "flexdsl", "fp32", m, "") for m in MODES]
    cases += [("spiking_vgg11_bn", "flexdsl", "bf16", m, "avgpool in fp32") for m in ("eager", "default")]
    return cases


def cases_from_args(a) -> list[tuple[str, str, str, str, str]]:
    if a.plan == "h100":
        return plan_h100()
    # (modes outermost: the cheap eager numbers of every case come first)
    out = []
    for arch in a.archs:
        out += [(arch, lib, dt, mode, "") for mode in a.modes for dt in a.dtypes for lib in a.libs]
        out += [(arch, lib, dt, mode, v) for v in a.variants for mode in a.modes for dt in a.dtypes for lib in a.libs]
    return out


def report(r: dict) -> None:
    print(f"{r['arch']:17s} {r['dtype']} {r['lib']:7s} {r['mode']:15s} {r['variant']}: {r['ms']:8.2f} ms "
          f"(min {r['min_ms']:.2f})  peak {r['peak_gib']:.2f} GiB  warm-up {r['warmup_s']:.1f} s  "
          f"first loss {r['first_loss']:.5f}" + (f"  search {r['search_s']:.1f} s" if r.get("search_s") else ""),
          flush=True)
    if "profile" in r:
        p = r["profile"]
        print("    per step (ms): " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(p["groups_ms"].items())))
        for t, k, g in p["top"]:
            print(f"      {t:7.3f} ms  [{g}] {k}")


def summary(rows: list[dict]) -> None:
    """Per arch, dtype and layout: each library's modes, its best, flexdsl's best against
    SpikingJelly's and the share of the zero-cost network in flexdsl's best step."""
    print("\n| arch | dtype | layout | library | eager | compile default | reduce-overhead | best | "
          "flexdsl best vs SJ best | zero-cost / flexdsl best | eager step's peak above resident, GiB (vs SJ) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    keys = []
    for r in rows:
        k = (r["arch"], r["dtype"], r["variant"])
        if k not in keys:
            keys.append(k)
    for arch, dt, variant in keys:
        best, peaks = {}, {}
        for lib in ("sj", "memopt", "flexdsl", "flexdsl-bits", "zero"):
            mine = [r for r in rows if (r["arch"], r["dtype"], r["variant"], r["lib"]) == (arch, dt, variant, lib)]
            ms = {r["mode"]: r["ms"] for r in mine}
            if not ms:
                continue
            best[lib] = min(ms.values())
            peaks[lib] = next((r["peak_above_gib"] for r in mine if r["mode"] == "eager"), float("nan"))
            cells = [f"{ms[m]:.2f}" if m in ms else "-" for m in MODES]
            ratio = f"{best['sj'] / best['flexdsl']:.2f}x" if lib == "flexdsl" and "sj" in best else ""
            share = f"{best['zero'] / best['flexdsl']:.2f}" if lib == "zero" and "flexdsl" in best else ""
            peak = f"{peaks[lib]:.3f}" + (f" ({peaks[lib] / peaks['sj']:.2f}x)" if "sj" in peaks and lib != "sj" else "")
            print(f"| {arch} | {dt} | {variant or 'NCHW'} | {lib} | {' | '.join(cells)} | {best[lib]:.2f} | {ratio} | "
                  f"{share} | {peak} |")


# ------------------------------------------------------------------ one process per case
def child(spec: str, a) -> None:
    """A case in a process of its own: build and warm up, say READY, wait for GO, time, say
    RESULT (lines of JSON on stdout; everything else goes to stderr)."""
    out = sys.stdout
    sys.stdout = sys.stderr
    case = Case(*json.loads(spec), a)
    try:
        case.prepare()
    except Exception as e:  # noqa: BLE001 - reported by the parent
        out.write(json.dumps({"failed": f"{type(e).__name__}: {str(e)[:400]}"}) + "\n")
        out.flush()
        return
    out.write(json.dumps({"ready": case.warm}) + "\n")
    out.flush()
    if sys.stdin.readline().strip() != "GO":
        return
    try:
        res = case.time()
    except Exception as e:  # noqa: BLE001
        res = {"failed": f"{type(e).__name__}: {str(e)[:400]}"}
    out.write(json.dumps({"result": res}) + "\n")
    out.flush()


class Worker:
    """The parent's handle of a case's process: its stdout lines in a queue."""

    def __init__(self, case: tuple, argv: list[str], env: dict) -> None:
        self.case = case
        self.proc = subprocess.Popen([sys.executable, __file__, "--child", json.dumps(case), *argv],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.lines: queue.Queue = queue.Queue()
        self.state = "compiling"
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.lines.put(json.loads(line))
        self.lines.put(None)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()


def run_parallel(cases: list[tuple], a, argv: list[str]) -> list[dict]:
    t0 = time.perf_counter()
    env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": str(max(1, (os.cpu_count() or 2) // (2 * a.jobs)))}
    todo = list(cases)
    workers: list[Worker] = []
    # phase 1: build and warm up, `jobs` compiling at a time; a case after the same one in default
    # mode starts once that one is warm (its graphs then come from Inductor's caches)
    while True:
        for w in workers:
            if w.state == "compiling":
                try:
                    msg = w.lines.get_nowait()
                except queue.Empty:
                    continue
                if msg is None or "failed" in msg:
                    w.state = "failed"
                    why = "exited" if msg is None else msg["failed"]
                    print(f"{' '.join(w.case)}: failed while warming up: {why}", flush=True)
                else:
                    w.state, w.warm = "ready", msg["ready"]
        compiling = [w for w in workers if w.state == "compiling"]
        started = {w.case for w in workers}
        warm = {w.case for w in workers if w.state == "ready"}
        for c in list(todo):
            if len(compiling) >= a.jobs:
                break
            twin = (*c[:3], "default", c[4])
            if c[3] == "reduce-overhead" and twin in cases and twin not in warm and \
                    any(w.case == twin and w.state == "compiling" for w in workers):
                continue
            todo.remove(c)
            w = Worker(c, argv, env)
            workers.append(w)
            compiling.append(w)
            started.add(c)
        if (not todo and not compiling) or time.perf_counter() - t0 > a.deadline:
            break
        time.sleep(0.2)
    for w in workers:
        if w.state == "compiling":
            w.state = "late"
            w.stop()
            print(f"{' '.join(w.case)}: not warm within {a.deadline:.0f} s (stopped)", flush=True)
    for c in todo:
        print(f"{' '.join(c)}: not started within {a.deadline:.0f} s", flush=True)
    print(f"phase 1 (building and compiling, in parallel): {time.perf_counter() - t0:.0f} s", flush=True)
    # phase 2: one case at a time on the idle machine, in the plan's order
    rows = []
    for c in cases:
        w = next((w for w in workers if w.case == c and w.state == "ready"), None)
        if w is None:
            continue
        assert w.proc.stdin is not None
        w.proc.stdin.write("GO\n")
        w.proc.stdin.flush()
        try:
            msg = w.lines.get(timeout=a.case_timeout)
        except queue.Empty:
            msg = {"failed": f"timing took over {a.case_timeout:.0f} s"}
        w.stop()
        if msg is None or "failed" in msg:
            print(f"{' '.join(c)}: failed while timing: {'exited' if msg is None else msg['failed']}", flush=True)
            continue
        rows.append(msg["result"])
        report(msg["result"])
    for w in workers:
        w.stop()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--archs", nargs="+", default=["sew_resnet18", "spiking_vgg11_bn"],
                    help="sew_resnet18, spiking_vgg11_bn, lif_stack, mlp8")
    ap.add_argument("--dtypes", nargs="+", help="fp32, bf16 (default both; --smoke: fp32)")
    ap.add_argument("--modes", nargs="+", help="eager, default, reduce-overhead (default all; --smoke: eager)")
    ap.add_argument("--libs", nargs="+", default=["sj", "flexdsl"],
                    help="sj, memopt, flexdsl, flexdsl-bits, zero (the identity)")
    ap.add_argument("--memopt-level", type=int, default=4, help="memopt.optimize_memory's level (1-4)")
    ap.add_argument("--bits-recompute", default="norm", choices=["none", "norm", "product"],
                    help="flexdsl-bits: save_spikes_as_bits(recompute=...)")
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="top CUDA kernels of one eager step, grouped")
    ap.add_argument("--variants", nargs="*", default=None, metavar="V",
                    help="runs of remedies, in each of --modes: 'channels_last', 'cudnn.benchmark', "
                         "'channels_last+cudnn.benchmark', 'avgpool in fp32' (--variants alone: all)")
    ap.add_argument("--plan", choices=["h100"], help="the list of cases of bench/RESULTS.md's run")
    ap.add_argument("--jobs", type=int, default=0, help="a process per case, this many compiling at a time")
    ap.add_argument("--deadline", type=float, default=240.0, help="seconds for building and compiling (--jobs)")
    ap.add_argument("--case-timeout", type=float, default=60.0, help="seconds for timing one case (--jobs)")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny sizes, 1 step: the script runs")
    ap.add_argument("--json", help="also write every result here, one JSON object a line")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.smoke:
        a.device, a.steps, a.warmup = "cpu", 1, 1
    else:
        a.device = "cuda"
    a.dtypes = a.dtypes or (["fp32"] if a.smoke else ["fp32", "bf16"])
    a.modes = a.modes or (["eager"] if a.smoke else list(MODES))
    all_variants = [v for v in VARIANTS if v]
    a.variants = [] if a.variants is None else (a.variants or all_variants)
    _stub_torchvision()
    if a.child:
        a.jobs = 1
        child(a.child, a)
        return
    name = torch.cuda.get_device_name() if a.device == "cuda" else "CPU"
    print(f"device {name}, torch {torch.__version__}, {os.cpu_count()} CPUs", flush=True)
    cases = cases_from_args(a)
    out = open(a.json, "w") if a.json else None  # noqa: SIM115
    if a.jobs:
        rows = run_parallel(cases, a, sys.argv[1:])  # (a case's process takes the same options)
    else:
        rows = []
        for arch, lib, dt, mode, variant in cases:
            cl, cb, pf = VARIANTS[variant]
            try:
                r = measure(arch, lib, dt == "bf16", mode, a, cl, cb, pf)
            except Exception as e:  # noqa: BLE001 - a case that fails is reported, the others run
                print(f"{arch} {dt} {lib} {mode} {variant}: failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
                continue
            rows.append(r)
            report(r)
    if out:
        for r in rows:
            out.write(json.dumps(r) + "\n")
        out.close()
    summary(rows)


if __name__ == "__main__":
    main()
