# ruff: noqa: E702 - the shared harness, kept verbatim (its one-line statements included)
"""Pair STDP on one GPU: SpikingJelly's STDPLearner (multi-step) against the two-GEMM floor, same run.

Run on the device: python3 bench/plasticity_gpu.py [--n 4096] [--t 100] [--b 32]
Case: Linear(N -> N, no bias) into a LIF layer (tau 2, threshold 1, hard reset), input spikes
Bernoulli(0.05) [T, B, N]; one learning window = the forward of the layer under no_grad, then the
pair-STDP weight change of the whole window with the weights held fixed (SpikingJelly's multi-step
semantics: traces tr <- tr - tr/tau + s, updated before they are used; dW summed over batch and time):

    dW = f(W) * (sum_t  post[t]^T tr_pre[t]  -  tr_post[t]^T pre[t])      (f_pre = f_post = f = identity,
                                                                         SpikingJelly's default: multiplicative)

- SpikingJelly: `learning.STDPLearner(step_mode="m", synapse=fc, sn=lif, tau_pre, tau_post)`,
  forward, then `learner.step(on_grad=False)` (a Python loop over T of `stdp_linear_step`).
- floor: the traces by a scan, then the two products as two GEMMs over T*B (cuBLAS, fp32 and bf16
  operands); what any implementation must at least do.
- flexdsl: whichever plasticity API the project documents (edit `flexdsl_window`).
Each is checked against the float64 formula (relative error of dW) and timed: median of 10 after 2
warm-ups, synchronized.

In this repository: `bash bench/gpu_session.sh plasticity` (the shared plasticity harness,
its definitions unchanged, with `flexdsl_window` filled in: a `flexdsl.feedforward("lif", n, n, rule="stdp_sj")`
layer, window semantics; its `last_dw` is the window's dW, the weight put back after each run so that every run
sees the same weights), plus `--online`: the same layer with `plasticity="online"` (the weights change every
step) against the same layer without a rule, fwd under no_grad, same run; and the floor of the two products at
the card's bfloat16 rate (two GEMMs of [N, T*B] x [T*B, N], cuBLAS bf16, timed alone)."""
import argparse
import statistics
import time

import torch
from torch import nn

dev = "cuda"
TAU_PRE, TAU_POST = 2.0, 2.0


def inputs(n, t, b):
    g = torch.Generator(device=dev).manual_seed(0)
    x = (torch.rand(t, b, n, device=dev, generator=g) < 0.05).float()
    fc = nn.Linear(n, n, bias=False).to(dev)
    with torch.no_grad():
        fc.weight.normal_(0.0, 1.5 / (0.05 * n) ** 0.5, generator=g)  # input current std ~1.5
    return x, fc


def lif_forward(fc, x):
    """The layer's spikes (the same LIF for every implementation, so dW is comparable)."""
    cur = fc(x)
    v = torch.zeros_like(cur[0]); out = []
    for t in range(x.shape[0]):
        v = v + (cur[t] - v) / 2.0
        s = (v >= 1.0).float()
        v = v * (1 - s)
        out.append(s)
    return torch.stack(out)


def traces(s, tau):
    tr = torch.zeros_like(s[0]); out = []
    for t in range(s.shape[0]):
        tr = tr - tr / tau + s[t]
        out.append(tr)
    return torch.stack(out)


def reference_dw(x, post, w):
    x64, p64 = x.double(), post.double()
    tp, tq = traces(x64, TAU_PRE), traces(p64, TAU_POST)
    n_in, n_out = x.shape[-1], post.shape[-1]
    return w.double() * (p64.reshape(-1, n_out).T @ tp.reshape(-1, n_in) - tq.reshape(-1, n_out).T @ x64.reshape(-1, n_in))


def _tensorboard_stub():
    """SpikingJelly's monitor imports torch.utils.tensorboard (for a writer the learners do not use);
    where tensorboard is not installed, an empty stand-in lets the learner import."""
    import sys
    import types
    try:
        import torch.utils.tensorboard  # noqa: F401
    except ImportError:
        stub = types.ModuleType("torch.utils.tensorboard")
        stub.SummaryWriter = object
        sys.modules["torch.utils.tensorboard"] = stub


def sj_window(fc, x):
    _tensorboard_stub()
    from spikingjelly.activation_based import learning, neuron
    lif = neuron.LIFNode(tau=2.0, v_threshold=1.0, v_reset=0.0, step_mode="m")
    net = nn.Sequential(fc, lif)
    learner = learning.STDPLearner(step_mode="m", synapse=fc, sn=lif, tau_pre=TAU_PRE, tau_post=TAU_POST)

    def run():
        lif.reset(); learner.reset()
        with torch.no_grad():
            net(x)
        return learner.step(on_grad=False)
    return run


def floor_window(fc, x, dtype):
    def run():
        with torch.no_grad():
            post = lif_forward(fc, x)
            tp, tq = traces(x, TAU_PRE), traces(post, TAU_POST)
            n = x.shape[-1]
            a, b, c, d = (z.reshape(-1, n).to(dtype) for z in (post, tp, tq, x))
            return fc.weight * ((a.T @ b).float() - (c.T @ d).float())
    return run


def flexdsl_window(fc, x):
    """A flexdsl layer Linear -> LIF with SpikingJelly's pair STDP (`rule stdp_sj`, window semantics)."""
    import flexdsl
    n = x.shape[-1]
    m = flexdsl.feedforward("lif", n, n, bias=False, rule="stdp_sj").to(dev)
    with torch.no_grad():
        m.W.copy_(fc.weight)
    w0 = fc.weight.detach().clone()

    def run():
        with torch.no_grad():
            m.reset()
            m(x)
            dw = m.last_dw("W")
            m.W.copy_(w0)
        return dw
    return run


def online_rows(fc, x):
    """Online STDP (`plasticity="online"`) on the same layer against the layer without a rule."""
    import flexdsl
    n = x.shape[-1]
    rows = []
    for label, kw in (("flexdsl layer, no rule", {}), ("flexdsl layer, online stdp_sj", {"rule": "stdp_sj",
                                                                                         "plasticity": "online"}),
                      ("flexdsl layer, window stdp_sj", {"rule": "stdp_sj"})):
        m = flexdsl.feedforward("lif", n, n, bias=False, **kw).to(dev)
        w0 = fc.weight.detach().clone()

        def run(m=m, w0=w0):
            with torch.no_grad():
                m.reset()
                m.W.copy_(w0)
                return m(x)
        rows.append((label, bench(run)))
    return rows


def floor_products(x):
    """The two products of the window at the card's bfloat16 rate (cuBLAS), operands prepared."""
    n = x.shape[-1]
    a = x.reshape(-1, n).to(torch.bfloat16).T.contiguous()
    b = x.reshape(-1, n).to(torch.bfloat16)

    def run():
        return a @ b, a @ b
    return bench(run)


def bench(run):
    for _ in range(2):
        run()
    torch.cuda.synchronize()
    ts = []
    for _ in range(10):
        t0 = time.perf_counter(); run(); torch.cuda.synchronize(); ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--t", type=int, default=100)
    ap.add_argument("--b", type=int, default=32)
    ap.add_argument("--online", action="store_true")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"device {torch.cuda.get_device_name()} torch {torch.__version__}; N={a.n} T={a.t} B={a.b}", flush=True)
    x, fc = inputs(a.n, a.t, a.b)
    with torch.no_grad():
        post = lif_forward(fc, x)
    ref = reference_dw(x, post, fc.weight.detach())
    print(f"input rate {x.mean().item():.3f}, output rate {post.mean().item():.3f}", flush=True)
    rows = [("spikingjelly STDPLearner", lambda: sj_window(fc, x)),
            ("floor fp32 (scan + 2 GEMMs)", lambda: floor_window(fc, x, torch.float32)),
            ("floor bf16 operands", lambda: floor_window(fc, x, torch.bfloat16)),
            ("flexdsl", lambda: flexdsl_window(fc, x))]
    for label, make in rows:
        try:
            run = make()
            if run is None:
                print(f"{label:30s} n/a (no API)", flush=True)
                continue
            dw = run()
            err = ((dw.double() - ref).norm() / ref.norm()).item()
            ms = bench(run)
            print(f"{label:30s} {ms:9.2f} ms   dW rel err vs float64 {err:.2e}", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"{label:30s} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
    print(f"{'floor: 2 bf16 GEMMs alone':30s} {floor_products(x):9.2f} ms", flush=True)
    if a.online:
        for label, ms in online_rows(fc, x):
            print(f"{label:30s} {ms:9.2f} ms", flush=True)


if __name__ == "__main__":
    main()
