"""Verify flexdsl's Triton backend on a GPU against SpikingJelly 2.0 in the same run (the
`harness` step of bench/gpu_session.sh; the anchors of bench/RESULTS.md were measured with it).
Run on the device with flexdsl and SpikingJelly 2.0.0 importable (carry their wheels).
Prints one line per case: ms for SJ and flexdsl, the ratio, and % of copy bandwidth.

    python bench/flexdsl_gpu.py
"""

import time

import torch
import triton.testing as tt
from spikingjelly.activation_based import functional, neuron, surrogate

import flexdsl

dev = "cuda"


def bench(f):
    return tt.do_bench(f, warmup=25, rep=200, return_mode="median")


a = torch.empty(2**28, device=dev)
b = torch.empty_like(a)
copy_bw = 2 * a.numel() * 4 / (bench(lambda a=a, b=b: b.copy_(a)) * 1e-3) / 1e9
del a, b
print(f"device {torch.cuda.get_device_name()}  copy {copy_bw:.0f} GB/s  torch {torch.__version__}")


def build(name):
    t0 = time.time()
    m = flexdsl.load(name, backend="triton", step_mode="m").to(dev)
    return m, time.time() - t0


def case(label, sj, fx, x, g, inf_bytes, train_bytes):
    xg = x.clone().requires_grad_(True)

    def run(mod, grad):
        def f():
            functional.reset_net(mod)
            if grad:
                xg.grad = None
                out = mod(xg)
                (out[0] if isinstance(out, tuple) else out).backward(g)
            else:
                with torch.no_grad():
                    mod(x)
        return f

    # correctness first
    functional.reset_net(sj)
    functional.reset_net(fx)
    with torch.no_grad():
        s_ref, s = sj(x), fx(x)
    s = s[0] if isinstance(s, tuple) else s
    mism = (s_ref != s).float().mean().item()
    for grad, nbytes, kind in ((False, inf_bytes, "infer"), (True, train_bytes, "train")):
        t_sj, t_fx = bench(run(sj, grad)), bench(run(fx, grad))
        print(f"{label:22s} {kind:5s} SJ {t_sj:8.3f} ms  flexdsl {t_fx:8.3f} ms  speedup {t_sj/t_fx:5.2f}x  "
              f"flexdsl {nbytes/(t_fx*1e-3)/1e9/copy_bw:5.0%} of copy", flush=True)
    print(f"{label:22s} spike mismatch fraction {mism:.2e}")


sg = surrogate.Sigmoid(alpha=4.0)
N = 1 << 22
for name, sj_cls in (("lif", neuron.LIFNode), ("izhikevich", neuron.IzhikevichNode)):
    fx, t_build = build(name)
    print(f"{name}: load {t_build:.2f} s")
    for T in (8, 32, 128):
        for dt in (torch.float32, torch.bfloat16):
            es = torch.tensor([], dtype=dt).element_size()
            x = (torch.rand(T, N, device=dev) * 1.5).to(dt)
            g = torch.rand_like(x)
            sj = sj_cls(surrogate_function=sg, step_mode="m").to(dev)
            t0 = time.time()
            functional.reset_net(fx)
            fx(x)
            torch.cuda.synchronize()
            first = time.time() - t0
            case(f"{name} T={T} {str(dt)[6:]}", sj, fx, x, g, 2 * T * N * es, 6 * T * N * es)
            print(f"  first call at this T/dtype: {first:.2f} s")
            del x, g
