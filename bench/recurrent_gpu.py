"""Recurrent spiking layers, SHD-shaped: flexdsl's compiled recurrent layer against the peers'
step loops, measured in the same run on the same device.

    python3 bench/recurrent_gpu.py                      # CUDA: check, then the table (LIF and ALIF, fp32/bf16)
    python3 bench/recurrent_gpu.py --device cpu --cases 256x100x32 --models lif --dtypes fp32
    python3 bench/recurrent_gpu.py --smoke              # tiny shapes on the CPU (what CI runs)

Layer: Linear(700 -> H) into H recurrent neurons, all-to-all, fed back from the previous step's
spikes; T steps, batch B; x = 8 x Bernoulli(0.05) input spikes; loss = sum of spikes weighted by a
fixed random tensor. Training = reset, forward, backward; inference = forward under no_grad.
Median of --reps timed runs after warm-ups, synchronized (the harness that measured the peers in
issue 20: the shared recurrent harness). bf16 = torch.autocast(bfloat16) for everyone.
Peers: snnTorch RLeaky(all_to_all=True, reset_mechanism="zero") and SpikingJelly
LinearRecurrentContainer(LIFNode) (LIF only), and a hand-written torch loop (LIF; LSNN for ALIF).
flexdsl: `flexdsl.recurrent(model, 700, H)` (Triton on CUDA, the CPU kernels on the CPU).
Breakdown: the same layer with one-to-one recurrent weights (no recurrent product) and the input
product alone (as the layer makes it: in float32 on CUDA the fused exact product of
backends/triton/products.py, else Linear) give the shares of the recurrent product, the neuron
(with the host's work) and the input product; the
floor is the larger of the arithmetic at the measured matmul rate, the bytes at the measured copy
bandwidth, and the 2T dependent steps at 1.5 us each (a grid barrier and an L2 round trip).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

IN = 700
CASES = [(256, 100, 64), (512, 100, 64), (1024, 250, 256)]  # (H, T, B)


class _Spike(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u):
        ctx.save_for_backward(u)
        return (u >= 0).to(u.dtype)

    @staticmethod
    def backward(ctx, g):
        (u,) = ctx.saved_tensors
        sg = torch.sigmoid(4 * u)
        return g * 4 * sg * (1 - sg)


class _Pseudo(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u):
        ctx.save_for_backward(u)
        return (u >= 0).to(u.dtype)

    @staticmethod
    def backward(ctx, g):
        (u,) = ctx.saved_tensors
        return g * 0.3 * torch.clamp(1 - u.abs(), min=0)


class HandLIF(nn.Module):
    """What a user writes: Linear(700, H) for every step in one GEMM, then the loop."""

    def __init__(self, H):
        super().__init__()
        self.fc, self.rec = nn.Linear(IN, H), nn.Linear(H, H)

    def forward(self, x):
        cur = self.fc(x)
        v = torch.zeros_like(cur[0])
        s = torch.zeros_like(cur[0])
        out = []
        for t in range(x.shape[0]):
            h = v + (cur[t] + self.rec(s) - v) * 0.5
            s = _Spike.apply(h - 1.0)
            v = h * (1 - s)
            out.append(s)
        return torch.stack(out)


class HandLSNN(nn.Module):
    """The LSNN / e-prop ALIF loop by hand (flexdsl's `alif`: tau_m 20, tau_a 200, beta 1.8)."""

    def __init__(self, H):
        super().__init__()
        self.fc, self.rec = nn.Linear(IN, H), nn.Linear(H, H, bias=False)
        self.alpha, self.rho = math.exp(-1 / 20), math.exp(-1 / 200)

    def forward(self, x):
        cur = self.fc(x)
        v = torch.zeros_like(cur[0])
        a = torch.zeros_like(cur[0])
        z = torch.zeros_like(cur[0])
        out = []
        for t in range(x.shape[0]):
            v = self.alpha * v + (1 - self.alpha) * (cur[t] + self.rec(z))
            a = self.rho * a
            z = _Pseudo.apply(v - 1.0 - 1.8 * a)
            v = v - z
            a = a + z
            out.append(z)
        return torch.stack(out)


def snntorch_layer(H):
    import snntorch as snn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(IN, H)
            self.lif = snn.RLeaky(beta=0.5, linear_features=H, all_to_all=True, reset_mechanism="zero")

        def forward(self, x):
            spk, mem = self.lif.init_rleaky()
            out = []
            cur = self.fc(x)
            for t in range(x.shape[0]):
                spk, mem = self.lif(cur[t], spk, mem)
                out.append(spk)
            return torch.stack(out)

    return Net()


def sj_layer(H):
    from spikingjelly.activation_based import functional, layer, neuron

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(IN, H)
            self.rc = layer.LinearRecurrentContainer(neuron.LIFNode(tau=2.0), H, H, step_mode="m")

        def forward(self, x):
            functional.reset_net(self)
            return self.rc(self.fc(x))

    return Net()


def flexdsl_layer(model, connectivity="all"):
    import flexdsl

    return lambda H: flexdsl.recurrent(model, IN, H, connectivity=connectivity)


def sync(dev):
    if dev == "cuda":
        torch.cuda.synchronize()


def make_step(make, H, T, B, dev, dtype, train):
    """One timed unit of the layer `make(H)`: reset, then forward (+ backward when training) on
    the case's input spikes, under autocast for bf16."""
    torch.manual_seed(0)
    net = make(H).to(dev)
    x = (torch.rand(T, B, IN, device=dev) < 0.05).float() * 8
    w = torch.randn(T, B, H, device=dev)
    ac = torch.autocast(dev, dtype=torch.bfloat16) if dtype == "bf16" else torch.autocast(dev, enabled=False)

    def step():
        if hasattr(net, "reset"):
            net.reset()
        if train:
            for p in net.parameters():
                p.grad = None
            with ac:
                out = net(x)
            (out.float() * w).sum().backward()
        else:
            with torch.no_grad(), ac:
                net(x)

    return step


def bench(make, H, T, B, dev, dtype, train, reps, warm):
    step = make_step(make, H, T, B, dev, dtype, train)
    for _ in range(warm):
        step()
    sync(dev)
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        step()
        sync(dev)
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3


def input_product(H, T, B, dev, dtype, train, reps, warm):
    """The input product over all steps alone, as flexdsl's layer makes it (and its weight
    gradient): in float32 on CUDA the one-pass bfloat16 conversion of the spike input and the fused
    product of its three exact parts (backends/triton/products.py; training adds dW_in as three
    bfloat16 products), else Linear(700 -> H)."""
    fc = nn.Linear(IN, H).to(dev)
    if dev == "cuda" and dtype == "fp32":
        return bench(lambda _: _Fused(fc), H, T, B, dev, dtype, train, reps, warm)
    return bench(lambda _: _Only(fc), H, T, B, dev, dtype, train, reps, warm)


class _FusedProduct(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, b):
        from flexdsl.backends.triton import products

        xb = products.to_bf16_exact(x).reshape(-1, x.shape[-1])
        ctx.save_for_backward(xb)
        return products.split3_mm(xb, w, b).reshape(*x.shape[:-1], w.shape[0])

    @staticmethod
    def backward(ctx, g):
        try:
            from flexdsl.backends.layercall import weight_grad
        except ImportError:  # (a checkout from before the layer level: `bench/gpu_session.sh recurrent_old`)
            from flexdsl.backends.recurrent import weight_grad

        (xb,) = ctx.saved_tensors
        g2 = g.reshape(-1, g.shape[-1])
        return None, weight_grad(g2, xb, True), g2.sum(0)


class _Fused(nn.Module):
    def __init__(self, fc):
        super().__init__()
        self.fc = fc

    def forward(self, x):
        return _FusedProduct.apply(x, self.fc.weight, self.fc.bias)


class _Only(nn.Module):
    def __init__(self, fc):
        super().__init__()
        self.fc = fc

    def forward(self, x):
        return self.fc(x)


def ceilings(dev):
    """(fp32 matmul TFLOP/s, bf16 matmul TFLOP/s, copy GB/s) measured here."""
    if dev != "cuda":
        return None
    n = 8192
    a = torch.randn(n, n, device=dev)
    ab = a.bfloat16()
    out = {}
    for name, m in (("fp32", a), ("bf16", ab)):
        for _ in range(2):
            m @ m
        sync(dev)
        t = time.perf_counter()
        for _ in range(5):
            m @ m
        sync(dev)
        out[name] = 2 * n ** 3 * 5 / (time.perf_counter() - t) / 1e12
    big = torch.empty(256 * 1024 * 1024, device=dev)
    big2 = torch.empty_like(big)
    big2.copy_(big)
    sync(dev)
    t = time.perf_counter()
    for _ in range(5):
        big2.copy_(big)
    sync(dev)
    out["gbs"] = 2 * big.numel() * 4 * 5 / (time.perf_counter() - t) / 1e9
    del a, ab, big, big2
    return out


def floor_ms(H, T, B, dtype, train, ceil):
    """The physical floor of a case (ms): arithmetic, bytes and the serial chain of steps."""
    if ceil is None:
        return float("nan"), "-"
    rate = ceil["bf16"] if dtype == "bf16" else ceil["fp32"]
    rec_rate = ceil["bf16"] / (3 if dtype == "fp32" else 1)  # spikes exact in bf16: 3 products of W's parts
    flop_in = 2 * T * B * IN * H * (2 if train else 1)
    flop_rec = 2 * T * B * H * H * (1 + (3 if train else 0))  # fwd; bwd: gI W (6 split products ~ 2x) + dW
    esize = 2 if dtype == "bf16" else 4
    bytes_ = T * B * (IN + H * (6 if train else 2)) * esize
    t_math = (flop_in / rate + flop_rec / rec_rate) / 1e9
    t_mem = bytes_ / ceil["gbs"] / 1e6
    t_chain = 2 * T * 1.5e-3 if train else T * 1.5e-3
    parts = {"math": t_math, "bytes": t_mem, "chain": t_chain}
    best = max(parts, key=parts.get)
    return parts[best], best


def check(dev):
    """flexdsl's kernels against its torch scan in float64 on this device (same weights): spikes
    equal step by step (a rounding flip near the threshold changes a recurrent net from there on:
    the first differing step is printed), weight gradients within 1e-4 relative."""
    import flexdsl

    print("check: Triton scan (fp32) vs torch scan (float64), same weights", flush=True)
    ok = True
    cases = [("lif", 256, 20, 64, {}, 6.0), ("alif", 512, 20, 64, {}, 120.0), ("lif", 1024, 10, 256, {}, 6.0),
             ("norse_lif", 96, 15, 8, {"detach_reset": True}, 3000.0), ("lif", 300, 12, 5, {"connectivity": "one_to_one"}, 6.0),
             ("li", 200, 12, 16, {}, 3.0), ("lif", 130, 12, 40, {"mask": torch.rand(130, 130) < 0.3}, 6.0),
             ("izhikevich", 64, 12, 33, {}, 200.0)]
    for model, H, T, B, opts, scale in cases:
        torch.manual_seed(0)
        m = flexdsl.recurrent(model, 64, H, **opts).to(dev)
        with torch.no_grad():
            m.W_in.mul_(scale)
            m.W_rec.mul_(3.0)
        x = torch.rand(T, B, 64, device=dev)
        g = torch.randn(T, B, H, device=dev)
        res = {}
        for be, dt in (("torch", torch.float64), ("triton", torch.float32)):
            mm = m.to(dt)
            mm.backend = be
            mm.reset()
            mm.zero_grad()
            out = mm(x.to(dt))
            (out * g.to(dt)).sum().backward()
            res[be] = (out.detach().double(), mm.W_rec.grad.double().clone(), mm.W_in.grad.double().clone())
        s_ref, s = res["torch"][0], res["triton"][0]
        bad = ((s_ref - s).abs() > (1e-4 if model == "li" else 0)).any(-1).any(-1).nonzero()
        t0 = int(bad[0]) if len(bad) else T
        gw = float((res["triton"][1] - res["torch"][1]).norm() / res["torch"][1].norm())
        gi = float((res["triton"][2] - res["torch"][2]).norm() / res["torch"][2].norm())
        good = t0 < T or (gw < 1e-4 and gi < 1e-4)
        ok &= good
        note = "" if t0 == T else " (a spike flipped by rounding changes the net from there; the exact check decides)"
        print(f"  {model:10s} {str(opts)[:28]:28s} H={H:5d} T={T} B={B}: rate {float(s_ref.mean()):.3f}, equal up to "
              f"step {t0}/{T}, dW_rec rel {gw:.1e}, dW_in rel {gi:.1e} {'ok' if good else 'MISMATCH'}{note}", flush=True)
    return ok


def exact_check(dev):
    """The IF neuron (v += x, spike at v >= 1, v = 0) with weights on a grid of 2^-7 and 0/8 input
    spikes: every current and membrane is exact in float32, so the kernels' spikes must equal the
    float64 torch scan's at every step, whatever the grid, tiles and barrier; gradients within 1e-5.
    And the same call twice gives the same bits (a race would not)."""
    import flexdsl

    print("exact check: IF with dyadic weights, Triton fp32 vs torch float64; determinism", flush=True)
    ok = True
    for H, T, B in ((1024, 30, 256), (512, 40, 64), (256, 60, 64), (96, 30, 7), (16, 40, 1)):
        torch.manual_seed(1)
        m = flexdsl.recurrent("if", IN, H).to(dev)
        with torch.no_grad():
            m.W_in.copy_(torch.randint(-8, 9, m.W_in.shape) / 128)
            m.W_rec.copy_(torch.randint(-16, 17, m.W_rec.shape) / 128)
            m.bias.copy_(torch.randint(-8, 9, m.bias.shape) / 128)
        x = (torch.rand(T, B, IN, device=dev) < 0.05).float() * 8
        g = torch.randn(T, B, H, device=dev)
        res = []
        for be, dt in (("torch", torch.float64), ("triton", torch.float32), ("triton", torch.float32)):
            mm = m.to(dt)
            mm.backend = be
            mm.reset()
            mm.zero_grad()
            out = mm(x.to(dt))
            (out * g.to(dt)).sum().backward()
            res.append((out.detach().double().clone(), mm.W_rec.grad.double().clone(), mm.W_in.grad.double().clone(),
                        mm.bias.grad.double().clone()))
        same = torch.equal(res[0][0], res[1][0])
        rels = [float((a - b).norm() / b.norm()) for a, b in zip(res[1][1:], res[0][1:])]
        det = all(torch.equal(a, b) for a, b in zip(res[1], res[2]))
        good = same and max(rels) < 5e-5 and det  # (float32 sums of up to 10^5 terms vs float64)
        ok &= good
        print(f"  H={H:5d} T={T} B={B}: rate {float(res[0][0].mean()):.3f}, spikes {'equal' if same else 'DIFFER'}, grads "
              f"rel {max(rels):.1e}, repeat {'bitwise equal' if det else 'DIFFERS'} {'ok' if good else 'MISMATCH'}",
              flush=True)
    return ok


KNOBS = ("FLEXDSL_RECURRENT_BK", "FLEXDSL_RECURRENT_STAGES", "FLEXDSL_RECURRENT_WARPS", "FLEXDSL_RECURRENT_PRODUCTS",
         "FLEXDSL_RECURRENT_TILE")


def sweep(dev, cases, reps):
    """flexdsl's fp32 LIF training step under launch settings (K block, pipelining depth, warps,
    products outside the kernels, tile); returns the fastest on the last case."""
    import os

    print("sweep: fp32 LIF training, ms (BK/stages/warps/products/tile)", flush=True)
    settings = [("", "", "", "", ""), ("128", "", "", "", ""), ("32", "", "", "", ""), ("", "2", "", "", ""),
                ("", "4", "", "", ""), ("128", "4", "", "", ""), ("", "", "", "fp32", ""), ("", "", "8", "", ""),
                ("", "", "", "", "32x64x64")]
    best = None
    for H, T, B in cases:
        out = []
        for st in settings:
            for k, v in zip(KNOBS, st):
                os.environ[k] = v
            try:
                ms = bench(flexdsl_layer("lif"), H, T, B, dev, "fp32", True, reps, 2)
                out.append(f"{'/'.join(v or '-' for v in st)} {ms:.2f}")
                if best is None or ms < best[0]:
                    best = (ms, st)
            except Exception as e:  # noqa: BLE001
                out.append(f"{'/'.join(v or '-' for v in st)} failed {type(e).__name__}: {str(e)[:80]}")
        for k in KNOBS:
            os.environ.pop(k, None)
        print(f"  H={H} T={T} B={B}: " + " | ".join(out), flush=True)
    return best


def graph_check(dev) -> bool:
    """Inference calls replayed from CUDA graphs (small layers, no gradient) against the same calls
    run eagerly (FLEXDSL_RECURRENT_GRAPHS=0): equal bits over a sequence of calls that change what a
    stale graph would get wrong: continuing feedback (no reset), weights changed in place, a
    weight replaced, a float parameter changed, per-neuron parameter tensors, an analog input (its
    check fails: the call runs eagerly, checked), shapes changing, inference mode and back."""
    import copy
    import os

    import flexdsl

    print("graph check: replayed inference calls vs eager calls, bit for bit", flush=True)
    ok_all = True
    cases = [("lif", {}), ("alif", {}), ("lif", {"connectivity": "one_to_one"}), ("lif", {"in_features": None}),
             ("lif", {"param_shapes": {"tau": (96,)}})]
    for model, opts in cases:
        torch.manual_seed(3)
        opts = dict(opts)
        F = opts.pop("in_features", 40)
        a = flexdsl.recurrent(model, F, 96, **opts).to(dev)
        b = copy.deepcopy(a)
        xs = [(torch.rand(20, 8, F if F else 96, device=dev) < 0.3).float() * 12 for _ in range(3)]

        def calls(m, graphs, xs=xs):
            from flexdsl.backends import recurrent as scans

            for p in scans._PROGRAMS.values():  # (a program that met an analog input checks first)
                p.__dict__.pop("check_first", None)
            os.environ["FLEXDSL_RECURRENT_GRAPHS"] = "1" if graphs else "0"
            outs = []
            with torch.no_grad():
                for i in range(14):
                    if i in (0, 6):
                        m.reset()
                    if i == 8:
                        m.W_rec.mul_(1.25)
                    if i == 10:
                        m.W_rec = torch.nn.Parameter(m.W_rec.detach() * 0.9)
                    if i == 11 and hasattr(m.neuron, "tau") and not isinstance(m.neuron.tau, torch.Tensor):
                        m.neuron.tau = 7.0
                    x = xs[i % 3] if i != 12 else xs[0] * 0.37  # (an analog input)
                    if i == 13:
                        x = xs[1][:, :4]  # (another batch size)
                        m.reset()
                    with torch.inference_mode() if i in (4, 5) else torch.no_grad():
                        outs.append(m(x).clone())
            os.environ.pop("FLEXDSL_RECURRENT_GRAPHS")
            return outs

        from flexdsl.backends import recurrent as scans

        made = sum(p.__dict__.get("_graphs_made", 0) for p in scans._PROGRAMS.values())
        try:
            got, want = calls(a, True), calls(b, False)
        except Exception as e:  # noqa: BLE001
            print(f"  {model:6s} {str(opts)[:30]:30s} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
            ok_all = False
            continue
        used = sum(p.__dict__.get("_graphs_made", 0) for p in scans._PROGRAMS.values()) - made
        same = all(torch.equal(g, w) for g, w in zip(got, want))
        rate = float(torch.stack([g.float().mean() for g in got[:12]]).mean())
        print(f"  {model:6s} {str(opts)[:30]:30s} rate {rate:.3f}, graphs made {used}, "
              f"{'equal bits' if same else 'DIFFERENT'}", flush=True)
        ok_all &= same and used > 0
    # a capture beside a thread that pins host memory and copies (a DataLoader's): neither fails
    import threading

    stop, errors = threading.Event(), []

    def pinner():
        k = 0
        try:
            while not stop.is_set():
                k += 1
                torch.empty((1 << 16) + 4096 * (k % 97), pin_memory=True).to(dev, non_blocking=True)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    th = threading.Thread(target=pinner)
    th.start()
    try:
        m = flexdsl.recurrent("lif", 33, 48).to(dev)
        with torch.no_grad():
            for _ in range(4):
                m.reset()
                m((torch.rand(9, 5, 33, device=dev) < 0.3).float())
    except Exception as e:  # noqa: BLE001
        errors.append(e)
    stop.set()
    th.join()
    print(f"  capture beside a pinning thread: {'ok' if not errors else 'FAILED ' + repr(errors[0])[:200]}", flush=True)
    return ok_all and not errors


def autocast_check(dev) -> bool:
    """Inference under autocast to bfloat16 (the input product in flexdsl's kernel on padded rows,
    `products.mm_bf16`) against the same call with torch's product (FLEXDSL_RECURRENT_PRODUCTS=fp32):
    the input products within one bfloat16 unit, the layers' spikes (nearly) all equal."""
    import os

    import flexdsl
    from flexdsl.backends.triton.products import mm_bf16

    print("autocast check: bf16 inference, the padded-row input product vs torch's", flush=True)
    ok = True
    for model, H, T, B in (("lif", 1024, 30, 256), ("alif", 256, 40, 64)):
        torch.manual_seed(2)
        m = flexdsl.recurrent(model, IN, H).to(dev)
        x = (torch.rand(T, B, IN, device=dev) < 0.05).float() * 8
        with torch.no_grad(), torch.autocast(dev, dtype=torch.bfloat16):
            ref_in = torch.nn.functional.linear(x, m.W_in, m.bias).float()
        got_in = mm_bf16(x.reshape(-1, IN), m.W_in, m.bias).float().reshape(ref_in.shape)
        within = bool(((got_in - ref_in).abs() <= ref_in.abs() * 2.0 ** -8 + 1e-6).all())
        outs = []
        for products in ("", "fp32"):
            os.environ["FLEXDSL_RECURRENT_PRODUCTS"] = products
            m.reset()
            with torch.no_grad(), torch.autocast(dev, dtype=torch.bfloat16):
                outs.append(m(x).float())
        os.environ.pop("FLEXDSL_RECURRENT_PRODUCTS")
        same = float((outs[0] == outs[1]).float().mean())
        good = within and same > 0.99
        ok &= good
        print(f"  {model:5s} H={H:5d} T={T} B={B}: input products {'within one bf16 unit' if within else 'DIFFER'}, "
              f"spikes equal {same:.4f} (rate {float(outs[1].mean()):.3f}) {'ok' if good else 'MISMATCH'}", flush=True)
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--cases", default=",".join(f"{h}x{t}x{b}" for h, t, b in CASES), help="HxTxB,...")
    ap.add_argument("--models", default="lif,alif")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--modes", default="train,infer")
    ap.add_argument("--peers", default="hand,snntorch,spikingjelly")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--peer-reps", type=int, default=5)
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--no-breakdown", action="store_true")
    ap.add_argument("--sweep", default="", help="HxTxB,...: time launch settings on these cases first")
    ap.add_argument("--tune", action="store_true", help="run the table with the sweep's fastest settings")
    ap.add_argument("--check-only", action="store_true")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU, one repetition")
    a = ap.parse_args()
    if a.smoke:
        a.device, a.cases, a.reps, a.peer_reps, a.no_check, a.modes = "cpu", "16x4x2", 1, 1, True, "train,infer"
    if a.threads:
        torch.set_num_threads(a.threads)
    dev = a.device
    name = torch.cuda.get_device_name() if dev == "cuda" else f"CPU ({torch.get_num_threads()} threads)"
    print(f"device {name}, torch {torch.__version__}", flush=True)
    if dev == "cuda" and not a.no_check and not (graph_check(dev) & exact_check(dev) & check(dev) &
                                                  autocast_check(dev)):
        print("CHECK FAILED", flush=True)
    if a.check_only:
        return
    from flexdsl.backends import recurrent as scans

    for p in scans._PROGRAMS.values():  # (the checks' analog inputs made them check first: not the table's)
        p.__dict__.pop("check_first", None)
    ceil = ceilings(dev)
    if ceil:
        print(f"measured: fp32 matmul {ceil['fp32']:.0f} TFLOP/s, bf16 {ceil['bf16']:.0f} TFLOP/s, copy "
              f"{ceil['gbs']:.0f} GB/s", flush=True)
    cases = [tuple(int(v) for v in c.split("x")) for c in a.cases.split(",")]
    if a.sweep:
        import os

        best = sweep(dev, [tuple(int(v) for v in c.split("x")) for c in a.sweep.split(",")], a.reps)
        if best is not None and a.tune:
            chosen = {k: v for k, v in zip(KNOBS, best[1]) if v and k != "FLEXDSL_RECURRENT_TILE"}
            os.environ.update(chosen)
            print(f"the table below runs with {chosen or 'the defaults'}", flush=True)
    peers_of = {"lif": {"hand": HandLIF, "snntorch": snntorch_layer, "spikingjelly": sj_layer},
                "alif": {"hand": HandLSNN}}
    rows = []
    for model in a.models.split(","):
        for dtype in a.dtypes.split(","):
            for mode in a.modes.split(","):
                train = mode == "train"
                for H, T, B in cases:
                    row = {}
                    for label, make in peers_of[model].items():
                        if label not in a.peers.split(","):
                            continue
                        try:
                            row[label] = bench(make, H, T, B, dev, dtype, train, a.peer_reps, 1)
                        except Exception as e:  # noqa: BLE001
                            print(f"  {label} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
                    row["flexdsl"] = bench(flexdsl_layer(model), H, T, B, dev, dtype, train, a.reps, 2)
                    if not a.no_breakdown:
                        row["o2o"] = bench(flexdsl_layer(model, "one_to_one"), H, T, B, dev, dtype, train, a.reps, 2)
                        row["in"] = input_product(H, T, B, dev, dtype, train, a.reps, 2)
                    peers = {k: v for k, v in row.items() if k not in ("flexdsl", "o2o", "in")}
                    best = min(peers.values()) if peers else float("nan")
                    fl, why = floor_ms(H, T, B, dtype, train, ceil)
                    txt = "  ".join(f"{k} {v:8.2f}" for k, v in row.items())
                    line = (f"{model:4s} {dtype} {mode:5s} H={H:5d} T={T:4d} B={B:4d}  {txt}  ms | speedup vs fastest "
                            f"peer {best / row['flexdsl']:6.1f}x")
                    if "o2o" in row:
                        f = row["flexdsl"]
                        line += (f" | shares: recurrent product {max(f - row['o2o'], 0) / f:4.0%}, neuron "
                                 f"{max(row['o2o'] - row['in'], 0) / f:4.0%}, input product {row['in'] / f:4.0%}")
                    if fl == fl:
                        line += f" | floor {fl:.2f} ms ({why})"
                    print(line, flush=True)
                    rows.append(line)
    print("\nsummary")
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
