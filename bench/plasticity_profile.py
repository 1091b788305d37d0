"""Where the time of a plastic layer's call goes on one GPU (window and online STDP, the harness's case).

Run on the device: python3 bench/plasticity_profile.py [--n 4096] [--t 100] [--b 32]
Prints the median time of: the layer without a rule, the rule's window alone on recorded spikes, its
parts (the sides' traces, the terms, the products), and a torch.profiler table of the window call."""
import argparse
import statistics
import time

import torch

import flexdsl

dev = "cuda"


def bench(run, reps=10):
    for _ in range(2):
        run()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        run()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--t", type=int, default=100)
    ap.add_argument("--b", type=int, default=32)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator(device=dev).manual_seed(0)
    x = (torch.rand(a.t, a.b, a.n, device=dev, generator=g) < 0.05).float()
    m = flexdsl.feedforward("lif", a.n, a.n, bias=False).to(dev)
    with torch.no_grad():
        m.W.normal_(0.0, 1.5 / (0.05 * a.n) ** 0.5, generator=g)
        post = m(x)
    rule = flexdsl.load_rule("stdp_sj")
    w = m.W.detach()
    rows = [("layer, no rule", lambda: m(x))]

    def window():
        rule.reset()
        return rule.window(x, post, w)
    rows.append(("rule.window alone", window))
    rows.append(("  sides + terms", lambda: (rule.reset(), rule._terms(x, post, {}, w))))
    from flexdsl.backends.rules import outer_sum
    A = post.reshape(-1, a.n)
    B = x.reshape(-1, a.n)
    rows.append(("  one outer_sum (exact bf16)", lambda: outer_sum(A, B)))
    rows.append(("  one fp32 matmul", lambda: A.T @ B))
    with torch.no_grad():
        for label, run in rows:
            print(f"{label:32s} {bench(run):8.2f} ms", flush=True)
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                window()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18))


if __name__ == "__main__":
    main()
