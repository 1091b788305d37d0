"""Training and inference time of several library models on a GPU, with the schedule's default
training plan and with the other plan forced, in one run.

    python bench/models_gpu.py

fp32, T = 32, N = 1,048,576 (do_bench median, ms); "plan" is the default the schedule chose.
"""

from __future__ import annotations

import torch
import triton.testing as tt

import flexdsl

SCALE = {"adex": 3000.0, "hodgkin_huxley": 60.0, "izhikevich_2003": 40.0, "lif_ode": 4.0}


def bench(f):
    return tt.do_bench(f, warmup=25, rep=200, return_mode="median")


def _calls(m, x, xg, n_out):
    def infer():
        m.reset()
        with torch.no_grad():
            m(x)

    def train():
        m.reset()
        xg.grad = None
        out = m(xg)
        out = out[0] if n_out > 1 else out
        out.sum().backward()

    return infer, train


def main() -> None:
    T, N = 32, 1 << 20
    print(f"device {torch.cuda.get_device_name()}; fp32, T={T}, N={N}")
    print("| model | plan | inference ms | training ms (plan) | training ms (other plan) |")
    print("| --- | --- | --- | --- | --- |")
    for name in ("lif", "plif", "cuba_lif", "alif", "izhikevich", "adex", "hodgkin_huxley"):
        m = flexdsl.load(name, backend="triton").to("cuda")
        prog = m.compiled.program("triton")
        x = torch.rand(T, N, device="cuda") * SCALE.get(name, 1.5)
        xg = x.clone().requires_grad_(True)
        n_out = len(m.compiled.checked.outputs)

        infer, train = _calls(m, x, xg, n_out)
        default = prog.train_plan
        t_inf, t_plan = bench(infer), bench(train)
        prog.train_plan = "save" if default == "recompute" else "recompute"
        t_other = bench(train)
        prog.default_train_plans()
        print(f"| {name} | {default} | {t_inf:.3f} | {t_plan:.3f} | {t_other:.3f} |", flush=True)


if __name__ == "__main__":
    main()
