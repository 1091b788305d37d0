"""Host time (µs a call, queued without waiting; small sizes so that the GPU keeps up) of the dense
relaxed synaptic delays' pieces on one GPU: the kernels' launchers (block-load / pointer), the autograd
Function forward+backward, the gauss taps, a whole learnable-delay layer's current forward+backward.

    python3 bench/delays_host_probe.py
"""
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import flexdsl  # noqa: E402
import flexdsl.backends.triton.dense_delays as dl  # noqa: E402
from flexdsl.runtime.delays import gauss_coef, tap_weights  # noqa: E402


def host_us(f, reps=300):
    for _ in range(20):
        f()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        f()
    t = (time.perf_counter() - t0) / reps * 1e6
    torch.cuda.synchronize()
    return t


def main():
    D, T, N, J, I = 24, 10, 8, 64, 64
    h = torch.rand(D + T, N, J, device="cuda")
    W = torch.randn(D + 1, J, I, device="cuda")
    Wt = W.transpose(1, 2).contiguous()
    g = torch.randn(T, N, I, device="cuda")
    hr, Wr = h.clone().requires_grad_(), W.clone().requires_grad_()
    d = (torch.rand(I, J, device="cuda") * D).requires_grad_()
    w = torch.randn(I, J, device="cuda", requires_grad=True)
    rows = []
    c = gauss_coef(12.27, D, torch.float32)
    for tma in (True, False):
        dl.TMA = tma
        tag = "block loads" if tma else "pointers"
        rows.append((f"conv_forward ({tag})", host_us(lambda: dl.conv_forward(h, Wt, D))))
        rows.append((f"conv_history_grad ({tag})", host_us(lambda: dl.conv_history_grad(g, W, D + T, D))))
        rows.append((f"conv_weight_parts ({tag})", host_us(lambda: dl.conv_weight_parts(h, g, D + 1, D))))
        rows.append((f"DenseDelays fwd+bwd ({tag})",
                     host_us(lambda: torch.autograd.grad(dl.delay_conv(hr, Wr), [hr, Wr], g), reps=100)))
        rows.append((f"GaussDelays fwd+bwd ({tag})",
                     host_us(lambda: torch.autograd.grad(dl.delay_gauss(hr, w, d, c, D), [hr, w, d], g), reps=100)))
    dl.TMA = True
    rows.append(("Wt transpose copy", host_us(lambda: W.transpose(1, 2).contiguous())))
    rows.append(("an empty launch (torch.empty + fill_)", host_us(lambda: torch.empty(16, device="cuda").fill_(0))))
    rows.append(("gauss taps fwd+bwd (tap_weights, w * taps)",
                 host_us(lambda: torch.autograd.grad((w.unsqueeze(-1) * tap_weights(d, D, 12.27, "gauss")).sum(), [w, d]),
                         reps=100)))
    text = (f"layer L:\n    neuron lif\n    size {I}\n    input s size {J}\n"
            f"    synapses W from s to x:\n        delay synaptic max {D} learnable\n")
    m = flexdsl.loads(text).cuda()
    x = (torch.rand(T, N, J, device="cuda") < 0.3).float()

    def layer():
        m.reset()
        m.current(x).sum().backward()
    rows.append(("a delayed layer's current fwd+bwd", host_us(layer, reps=100)))
    text0 = text.replace(":\n        delay synaptic max 24 learnable\n", "\n")
    m0 = flexdsl.loads(text0).cuda()

    def layer0():
        m0.reset()
        m0.current(x).sum().backward()
    rows.append(("the same layer without delays", host_us(layer0, reps=100)))
    print("| piece | host µs a call |\n| --- | --- |")
    for name, t in rows:
        print(f"| {name} | {t:.1f} |")
    if "--profile" in sys.argv:  # where a delayed layer's host time goes (Python functions, 200 calls)
        import cProfile
        import pstats
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(200):
            layer()
        torch.cuda.synchronize()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
