"""torch.compile on the CPU: flexdsl eager and compiled against a hand-written PyTorch loop of the
same network, eager and compiled, training steps at 1 and 2 threads, and each compiled variant's
cold compile in a fresh process.

    python bench/cpu_compile.py [--T 100 --B 32 --F 700 --H 256 --C 20] [--threads 1 2] [--repeat 15]
                                [--cold flexdsl|all|none] [--models rec ff]

Models (float32, x = [T, B, F] Bernoulli(0.05) spikes, labels of C classes):
- rec: the recurrent SHD-like model, `flexdsl.recurrent("lif", F, H)` -> Linear(H, C);
- ff: Linear(F, H) -> LIF -> Linear(H, C) (`flexdsl.load("lif")`).
The hand-written loop is plain PyTorch with flexdsl's `lif` semantics (tau = 2, v_reset = 0,
threshold 1, hard reset through which the gradient flows, the spike's surrogate sigmoid(4): an
autograd Function Dynamo traces), with the same initial weights as the flexdsl network.

A training step: reset, zero_grad, forward, cross-entropy of the time mean of the readout,
backward, SGD step (lr 1e-3). "compiled" is `torch.compile(net)` (default mode; loss, backward and
optimizer outside). Each thread count runs in its own process (Inductor fixes a kernel's thread
count when it compiles it), with every variant of a model timed in turn within each repetition (a
busy machine slows them alike; the order rotates, so that no variant always follows the same one); the
table gives medians, and each ratio as the ratio of the medians and (in parentheses) as the median of
the ratios within a repetition (paired: what drifts between repetitions, another job's load, cancels).
The cold compile is the first training
step of a compiled network in a new process with empty flexdsl and Inductor caches (what a user
waits for). The warm processes share the default Inductor cache, so the hand loop's compile there
may be a cache hit. The first training step's loss is checked to agree across the four variants.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("flexdsl eager", "flexdsl compiled", "hand eager", "hand compiled")

CHILD = r"""
import json, statistics, sys, time
import torch
from torch import nn
sys.path.insert(0, sys.argv[1])
import flexdsl

cfg = json.loads(sys.argv[2])
T, B, F, H, C = cfg["T"], cfg["B"], cfg["F"], cfg["H"], cfg["C"]
torch.set_num_threads(cfg["threads"])


class Spike(torch.autograd.Function):
    # heaviside(u >= 0); backward: sigmoid(4u)'s derivative (SpikingJelly's Sigmoid(alpha=4), flexdsl's lif)
    @staticmethod
    def forward(ctx, u):
        ctx.save_for_backward(u)
        return (u >= 0).to(u.dtype)

    @staticmethod
    def backward(ctx, g):
        (u,) = ctx.saved_tensors
        s = torch.sigmoid(4.0 * u)
        return g * 4.0 * s * (1.0 - s)


def lif_step(v, x):
    # flexdsl's lif: v1 = v + (x - (v - v_reset)) / tau; spike = v1 >= v_th; v = spike*v_reset + v1*(1 - spike)
    v1 = v + (x - v) / 2.0
    s = Spike.apply(v1 - 1.0)
    return s, v1 * (1.0 - s)


class HandLIF(nn.Module):
    def forward(self, x):
        v = torch.zeros_like(x[0])
        out = []
        for t in range(x.shape[0]):
            s, v = lif_step(v, x[t])
            out.append(s)
        return torch.stack(out)


class HandRec(nn.Module):
    def __init__(self, rec):
        super().__init__()
        self.W_in = nn.Parameter(rec.W_in.detach().clone())
        self.W_rec = nn.Parameter(rec.W_rec.detach().clone())
        self.bias = nn.Parameter(rec.bias.detach().clone())

    def forward(self, x):
        ix = torch.nn.functional.linear(x, self.W_in, self.bias)
        s = torch.zeros_like(ix[0])
        v = torch.zeros_like(ix[0])
        out = []
        for t in range(x.shape[0]):
            s, v = lif_step(v, torch.addmm(ix[t], s, self.W_rec.t()))
            out.append(s)
        return torch.stack(out)


def build(model, seed=0):
    torch.manual_seed(seed)
    if model == "rec":
        layer = flexdsl.recurrent("lif", F, H)
        flex = nn.Sequential(layer, nn.Linear(H, C))
        hand = nn.Sequential(HandRec(layer), nn.Linear(H, C))
    else:
        flex = nn.Sequential(nn.Linear(F, H), flexdsl.load("lif"), nn.Linear(H, C))
        hand = nn.Sequential(nn.Linear(F, H), HandLIF(), nn.Linear(H, C))
    hand.load_state_dict(flex.state_dict(), strict=False)  # (the Linears; HandRec copied the layer's weights)
    return flex, hand


def reset(net):
    for m in net.modules():
        if hasattr(m, "reset") and m is not net:
            m.reset()


gen = torch.Generator().manual_seed(1)
X = (torch.rand(T, B, F, generator=gen) < 0.05).float()
Y = torch.randint(0, C, (B,), generator=gen)


def make_step(net, fn):
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)

    def step():
        reset(net)
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(fn(X).mean(0), Y)
        loss.backward()
        opt.step()
        return loss.detach()
    return step


def variants(model):
    fe, he = build(model)
    fc, hc = build(model)
    return {"flexdsl eager": make_step(fe, fe), "flexdsl compiled": make_step(fc, torch.compile(fc)),
            "hand eager": make_step(he, he), "hand compiled": make_step(hc, torch.compile(hc))}


if cfg["mode"] == "cold":  # one variant: its first step in this fresh process
    model, name = cfg["model"], cfg["variant"]
    net, hand = build(model)
    if name.startswith("hand"):
        net = hand
    elif name.startswith("relu"):  # Inductor's own cold compile of the network around the neuron
        net = nn.Sequential(nn.Linear(F, H), nn.ReLU(), nn.Linear(H, C))
    t0 = time.perf_counter()
    step = make_step(net, torch.compile(net))
    step()
    print(json.dumps({"cold": time.perf_counter() - t0}))
    sys.exit(0)

res = {}
for model in cfg["models"]:
    steps = variants(model)
    losses = {k: float(s()) for k, s in steps.items()}  # (the first steps: compiles)
    # the same network: the first step's loss (same weights, same data) agrees in all four (float32 sums in
    # another order may differ in the last bits)
    ref = losses["flexdsl eager"]
    assert all(abs(v - ref) <= 1e-5 * abs(ref) for v in losses.values()), losses
    for _ in range(2):
        for s in steps.values():
            s()
    times = {k: [] for k in steps}
    names = list(steps)
    for r in range(cfg["repeat"]):
        for k in names[r % 4:] + names[:r % 4]:  # (each repetition starts with the next variant)
            s = steps[k]
            t0 = time.perf_counter()
            s()
            times[k].append(time.perf_counter() - t0)
    fe, fc, hc = times["flexdsl eager"], times["flexdsl compiled"], times["hand compiled"]
    res[model] = {"ms": {k: statistics.median(v) * 1e3 for k, v in times.items()},
                  "paired": [statistics.median(a / b for a, b in zip(fe, fc)),
                             statistics.median(a / b for a, b in zip(hc, fc))],
                  "spread": {k: [min(v) * 1e3, max(v) * 1e3] for k, v in times.items()}, "first_loss": losses}
print(json.dumps(res))
"""


def child(cfg: dict, env: dict | None = None) -> dict:
    r = subprocess.run([sys.executable, "-c", CHILD, str(ROOT), json.dumps(cfg)], capture_output=True, text=True,
                       env=env, timeout=7200)
    if r.returncode != 0:
        raise SystemExit(f"child {cfg} failed:\n{r.stderr[-4000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def cold(cfg: dict, model: str, variant: str) -> float:
    with tempfile.TemporaryDirectory(prefix="flexdsl-cold-") as tmp:
        env = {**os.environ, "FLEXDSL_CACHE_DIR": f"{tmp}/flexdsl", "TORCHINDUCTOR_CACHE_DIR": f"{tmp}/inductor",
               "TRITON_CACHE_DIR": f"{tmp}/triton"}
        return child({**cfg, "mode": "cold", "model": model, "variant": variant, "threads": 2}, env)["cold"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--T", type=int, default=100)
    ap.add_argument("--B", type=int, default=32)
    ap.add_argument("--F", type=int, default=700)
    ap.add_argument("--H", type=int, default=256)
    ap.add_argument("--C", type=int, default=20)
    ap.add_argument("--threads", type=int, nargs="*", default=[1, 2], help="thread counts timed (none: only the cold compiles)")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--models", nargs="+", default=["rec", "ff"], choices=["rec", "ff"])
    ap.add_argument("--cold", default="flexdsl", choices=["flexdsl", "all", "none"],
                    help="which compiled variants' cold compile to measure (the hand loop's takes minutes)")
    a = ap.parse_args()
    import torch

    cfg = {"T": a.T, "B": a.B, "F": a.F, "H": a.H, "C": a.C, "repeat": a.repeat, "models": a.models}
    print(f"torch {torch.__version__}, {os.cpu_count()} CPU cores; T={a.T}, B={a.B}, F={a.F}, H={a.H}, C={a.C}, "
          f"float32; training step medians of {a.repeat} interleaved repetitions", flush=True)
    names = {"rec": f"recurrent LIF {a.F}->{a.H} -> Linear({a.H},{a.C})",
             "ff": f"Linear({a.F},{a.H}) -> LIF -> Linear({a.H},{a.C})"}
    print("| model | threads | flexdsl eager ms | flexdsl compiled ms | hand eager ms | hand compiled ms | "
          "compiled / eager flexdsl | compiled flexdsl vs compiled hand |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |", flush=True)
    for th in a.threads:
        load = os.getloadavg()[0]
        res = child({**cfg, "mode": "time", "threads": th})
        for model in a.models:
            ms = res[model]["ms"]
            fe, fc, he, hc = (ms[v] for v in VARIANTS)
            pe, ph = res[model]["paired"]
            print(f"| {names[model]} | {th} | {fe:.1f} | {fc:.1f} | {he:.1f} | {hc:.1f} | {fe / fc:.2f}x ({pe:.2f}x) | "
                  f"{hc / fc:.2f}x ({ph:.2f}x) |", flush=True)
        print(f"  (threads {th}: load average {load:.1f} before, {os.getloadavg()[0]:.1f} after; min-max ms {json.dumps({m: res[m]['spread'] for m in a.models})}; first losses "
              f"{json.dumps({m: res[m]['first_loss'] for m in a.models})})", flush=True)
    if a.cold != "none":
        print(f"cold compile, first training step in a fresh process with empty caches (2 threads; load average "
              f"{os.getloadavg()[0]:.1f}):")
        print("| model | variant | cold compile + first step |\n| --- | --- | ---: |")
        rows = [(m, v) for m in a.models for v in ("flexdsl compiled", "hand compiled") if a.cold == "all" or
                v.startswith("flexdsl")] + [("ff", "relu compiled (the same network with a ReLU: Inductor's own)")]
        for model, v in rows:
            name = names[model] if not v.startswith("relu") else f"Linear({a.F},{a.H}) -> ReLU -> Linear({a.H},{a.C})"
            print(f"| {name} | {v} | {cold(cfg, model, v):.1f} s |", flush=True)
        print(f"(load average after: {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
