"""Extra GPU facts (the `extra` step of bench/gpu_session.sh): (1) LIF bf16 vs fp32 training at
T=8 repeated (anomaly check), (2) peak activation memory of one LIF layer's fwd+bwd, flexdsl vs
SpikingJelly, (3) host overhead per call at small N. Run on the device with flexdsl and
SpikingJelly 2.0.0 importable.

    python bench/extra_gpu.py
"""

import torch
import triton.testing as tt
from spikingjelly.activation_based import functional, neuron, surrogate

import flexdsl

dev = "cuda"
sg = surrogate.Sigmoid(alpha=4.0)
N = 1 << 22


def bench(f):
    return tt.do_bench(f, warmup=50, rep=300, return_mode="median")


def train_fn(m, x, g):
    xg = x.clone().requires_grad_(True)

    def f():
        functional.reset_net(m)
        xg.grad = None
        m(xg).backward(g)
    return f


def lif_flexdsl():
    return flexdsl.load("lif", backend="triton").to(dev)


def lif_sj():
    return neuron.LIFNode(surrogate_function=sg, step_mode="m").to(dev)


for rep in range(2):
    for T in (8, 16, 32):
        row = []
        for dt in (torch.float32, torch.bfloat16):
            x = (torch.rand(T, N, device=dev) * 1.5).to(dt)
            g = torch.rand_like(x)
            fx = lif_flexdsl()
            sj = lif_sj()
            row.append((bench(train_fn(fx, x, g)), bench(train_fn(sj, x, g))))
        (f32, s32), (f16, s16) = row
        print(f"rep {rep} T={T:3d} train fp32 flexdsl {f32:.3f} ms (SJ {s32:.3f}) | bf16 flexdsl {f16:.3f} ms (SJ {s16:.3f}) "
              f"| bf16 speed-up over fp32 {f32/f16:.2f}x", flush=True)

# peak memory of fwd+bwd beyond the input and its gradient
for T in (32, 128):
    for name, mk in (("flexdsl", lif_flexdsl), ("SJ", lif_sj)):
        m = mk()
        x = torch.rand(T, 1 << 20, device=dev, requires_grad=True)
        g = torch.rand_like(x)
        functional.reset_net(m)
        m(x).backward(g)
        torch.cuda.synchronize()
        x.grad = None
        functional.reset_net(m)
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        y = m(x)
        fwd_peak = torch.cuda.max_memory_allocated() - base
        y.backward(g)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        xb = x.numel() * 4
        print(f"memory T={T:3d} {name:8s}: forward keeps {fwd_peak/xb:.2f}x input, fwd+bwd peak {peak/xb:.2f}x input",
              flush=True)
        del y, x, g

# host overhead: tiny N, GPU idle
for name, mk in (("flexdsl", lif_flexdsl), ("SJ", lif_sj)):
    m = mk()
    x = torch.rand(8, 4096, device=dev)
    g = torch.rand_like(x)

    def inf(m=m, x=x):
        functional.reset_net(m)
        with torch.no_grad():
            m(x)
    print(f"host {name:8s}: infer {bench(inf)*1e3:.0f} us, train {bench(train_fn(m, x, g))*1e3:.0f} us", flush=True)
