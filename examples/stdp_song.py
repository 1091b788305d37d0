"""STDP makes the weights bimodal: Song, Miller & Abbott (Nat. Neurosci. 3:919, 2000) with flexdsl's
plasticity rules. 1000 Poisson inputs at 15 Hz drive one conductance-based LIF neuron (`song_lif.neuron`,
Brian2's `examples/synapses/STDP.py`); additive pair STDP (potentiation `dApre = 0.01 gmax` per pair,
depression 5 % stronger, 20 ms traces) with hard bounds [0, gmax]. The weights start uniform in [0, gmax]
and end bimodal: most near 0, a group near gmax; the neuron's rate falls to a balanced regime.

    python examples/stdp_song.py                        # ~20 s on 2 cores
    python examples/stdp_song.py --plot song.png        # the weights' histogram and the rate over training
    python examples/stdp_song.py --online --seconds 5   # Brian2's semantics, one trial (slow on a CPU)
    python examples/stdp_song.py --device cuda

How it runs. By default the rule runs in *window* semantics (`rule="stdp_additive"`, SpikingJelly's
multi-step learners): a call simulates `--window` seconds of `--batch` independent trials that share the
weights; the weights are held over the call, the rule's change over all trials is added after it (then
the bounds), and the rule's products run as matrix products over the window's steps and trials. Each
window thus applies `--batch` trials' worth of STDP at once; the equilibrium is Song et al.'s. `--online`
runs Brian2's semantics instead (`rule="stdp_song"`: every step's clipped update applied before the next
step, one trial; tests/test_plasticity.py checks it against Brian2 spike for spike), one step at a time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
N, RATE, GMAX, DT = 1000, 15.0, 0.01, 1e-4  # inputs, Hz, largest weight, s


def build(online: bool, device: str, seed: int):
    import flexdsl

    torch.manual_seed(seed)
    if online:
        m = flexdsl.feedforward(str(HERE / "song_lif.neuron"), N, 1, bias=False, rule="stdp_song",
                                plasticity="online", backend="torch")
    else:
        m = flexdsl.feedforward(str(HERE / "song_lif.neuron"), N, 1, bias=False, rule="stdp_additive",
                                rule_params={"dt": 0.1, "tau_plus": 20.0, "tau_minus": 20.0, "A_plus": 0.01 * GMAX,
                                             "A_minus": 0.0105 * GMAX, "w_min": 0.0, "w_max": GMAX})
    m = m.to(device=device)
    with torch.no_grad():
        m.W.uniform_(0.0, GMAX)
    return m


def run(args) -> dict:
    m = build(args.online, args.device, args.seed)
    batch = 1 if args.online else args.batch
    steps = int(round(args.window / DT))
    windows = max(1, int(round(args.seconds / (args.window * batch))))
    g = torch.Generator(device=args.device).manual_seed(args.seed)
    w0 = m.W.detach().clone().cpu()[0]
    rates, t0 = [], time.perf_counter()
    with torch.no_grad():
        for k in range(windows):
            x = (torch.rand(steps, batch, N, generator=g, device=args.device) < RATE * DT).to(m.W.dtype)
            out = m(x)
            rates.append(float(out.mean()) / DT)
            if (k + 1) % max(1, windows // 10) == 0 or k + 1 == windows:
                w = m.W[0] / GMAX
                print(f"window {k + 1:4d}/{windows}  experience {(k + 1) * batch * args.window:7.1f} s  "
                      f"rate {rates[-1]:5.1f} Hz  weights <0.1 gmax {float((w < 0.1).float().mean()):.2f}  "
                      f">0.9 gmax {float((w > 0.9).float().mean()):.2f}  ({time.perf_counter() - t0:.0f} s)",
                      flush=True)
    w = m.W.detach().cpu()[0]
    fifths = torch.histc(w.double() / GMAX, bins=5, min=0.0, max=1.0) / N
    low, mid, high = float(fifths[0]), float(fifths[2]), float(fifths[4])
    bimodal = low > 2 * mid and high > 2 * mid
    print(f"final: {low:.2f} of the weights in [0, 0.2) gmax, {mid:.2f} in [0.4, 0.6), {high:.2f} in [0.8, 1] "
          f"(started uniform: 0.20 each); bimodal: {'yes' if bimodal else 'no'}; rate {rates[-1]:.1f} Hz")
    if args.plot:
        plot(args.plot, w0, w, rates, batch * args.window)
    return {"low": low, "mid": mid, "high": high, "bimodal": bimodal, "rates": rates, "w": w}


def plot(path: str, w0: torch.Tensor, w: torch.Tensor, rates: list, per_window: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(11, 3))
    ax[0].hist((w0 / GMAX).numpy(), 20, color="0.6")
    ax[0].set_title("weights at the start")
    ax[1].hist((w / GMAX).numpy(), 20, color="tab:blue")
    ax[1].set_title("weights after STDP (bimodal)")
    for a in ax[:2]:
        a.set_xlabel("weight / gmax")
    ax[0].set_ylabel("synapses")
    t = [(k + 1) * per_window for k in range(len(rates))]
    ax[2].plot(t, rates, color="tab:red")
    ax[2].set_xlabel("experience (s)")
    ax[2].set_ylabel("output rate (Hz)")
    ax[2].set_title("the neuron's rate")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=None, help="simulated experience (default 200 s; --online 5 s)")
    ap.add_argument("--window", type=float, default=0.1, help="seconds a call simulates (default 0.1)")
    ap.add_argument("--batch", type=int, default=8, help="trials per call sharing the weights (default 8)")
    ap.add_argument("--online", action="store_true", help="Brian2's semantics: one trial, every step")
    ap.add_argument("--plot", help="write the figure here (.png, .pdf, .svg)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.seconds is None:
        args.seconds = 5.0 if args.online else 200.0
    if args.seconds <= 0 or args.window <= 0 or args.batch < 1:
        ap.error("--seconds and --window must be positive, --batch at least 1")
    if args.plot:
        sys.path.insert(0, str(HERE.parent))
        from flexdsl.docs.plots import plot_path_problem

        problem = plot_path_problem(args.plot)
        if problem:
            ap.error(f"--plot {args.plot}: {problem[0]} ({problem[1]})")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here")
    run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
