"""Song, Miller & Abbott (2000) for 100 s, Brian2 against flexdsl, the same input spike trains: Brian2's
examples/synapses/STDP.py (its neuron and synapses, `method="exact"`, numpy target, dt 0.1 ms) and a flexdsl
layer (examples/song_lif.neuron, `rule="stdp_song"`, `plasticity="online"`, float64, backend torch).

Run on a CPU (about 10 minutes on 2 cores): python3 bench/song_ks.py [--seconds 100] [--n 1000]
Prints: the first step where the postsynaptic spikes differ (if any), the largest weight difference after the
first second, the final weight histograms (20 bins of weight / gmax) side by side, and the two-sample
Kolmogorov-Smirnov test of the final weights (scipy.stats.ks_2samp)."""
import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def brian2_run(spikes, w0, dt, check_at):
    import brian2 as b2

    b2.prefs.codegen.target = "numpy"
    b2.defaultclock.dt = dt * b2.second
    n = spikes.shape[1]
    ns = {"taum": 10 * b2.ms, "taupre": 20 * b2.ms, "taupost": 20 * b2.ms, "taue": 5 * b2.ms, "Ee": 0 * b2.mV,
          "vt": -54 * b2.mV, "vr": -60 * b2.mV, "El": -74 * b2.mV, "gmax": 0.01}
    ns["dApre"] = 0.01 * ns["gmax"]
    ns["dApost"] = -0.01 * 1.05 * ns["gmax"]
    ti, ii = np.nonzero(spikes)
    inp = b2.SpikeGeneratorGroup(n, ii, ti * dt * b2.second)
    neurons = b2.NeuronGroup(1, "dv/dt = (ge * (Ee-vr) + El - v) / taum : volt\ndge/dt = -ge / taue : 1",
                             threshold="v>vt", reset="v = vr", method="exact", namespace=ns)
    neurons.v = ns["vr"]
    S = b2.Synapses(inp, neurons, """w : 1
        dApre/dt = -Apre / taupre : 1 (event-driven)
        dApost/dt = -Apost / taupost : 1 (event-driven)""",
                    on_pre="ge += w\nApre += dApre\nw = clip(w + Apost, 0, gmax)",
                    on_post="Apost += dApost\nw = clip(w + Apre, 0, gmax)", namespace=ns)
    S.connect()
    S.w = w0
    mon = b2.SpikeMonitor(neurons)
    b2.run(check_at * dt * b2.second)
    w_check = np.asarray(S.w).copy()
    b2.run((spikes.shape[0] - check_at) * dt * b2.second)
    return np.round(np.asarray(mon.t / b2.second) / dt).astype(int), w_check, np.asarray(S.w)


def flexdsl_run(spikes, w0, check_at):
    import flexdsl

    torch.set_default_dtype(torch.float64)
    m = flexdsl.feedforward(str(ROOT / "examples" / "song_lif.neuron"), spikes.shape[1], 1, bias=False,
                            rule="stdp_song", plasticity="online", backend="torch")
    with torch.no_grad():
        m.W.copy_(torch.tensor(w0)[None])
    outs, w_check = [], None
    chunk = 10000
    with torch.no_grad():
        for a in range(0, spikes.shape[0], chunk):
            x = torch.tensor(spikes[a:a + chunk], dtype=torch.float64)[:, None, :]
            outs.append(m(x)[:, 0, 0].numpy())
            if a + chunk == check_at:
                w_check = m.W[0].detach().numpy().copy()
    return np.nonzero(np.concatenate(outs))[0], w_check, m.W[0].detach().numpy().copy()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=100.0)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    dt = 1e-4
    steps = int(round(a.seconds / dt))
    check_at = min(steps, 10000)
    rng = np.random.default_rng(a.seed)
    spikes = rng.random((steps, a.n)) < 15 * dt
    w0 = rng.random(a.n) * 0.01
    t0 = time.time()
    b_spk, b_w1, b_w = brian2_run(spikes, w0, dt, check_at)
    t1 = time.time()
    f_spk, f_w1, f_w = flexdsl_run(spikes, w0, check_at)
    t2 = time.time()
    print(f"{a.seconds:g} s simulated, {a.n} inputs; brian2 {t1 - t0:.0f} s, flexdsl {t2 - t1:.0f} s (this CPU)")
    k = min(len(b_spk), len(f_spk))
    diff = next((i for i in range(k) if b_spk[i] != f_spk[i]), None)
    print(f"postsynaptic spikes: brian2 {len(b_spk)}, flexdsl {len(f_spk)}; first differing spike: "
          f"{'none' if diff is None and len(b_spk) == len(f_spk) else diff}"
          + (f" (step {b_spk[diff]} vs {f_spk[diff]})" if diff is not None else ""))
    first = [s for s in b_spk if s < check_at]
    print(f"after {check_at * dt:g} s: {len(first)} spikes, identical: {list(f_spk[:len(first)]) == first}; "
          f"max |w_flexdsl - w_brian2| / gmax = {np.abs(f_w1 - b_w1).max() / 0.01:.2e}")
    bins = np.linspace(0, 1, 21)
    hb, _ = np.histogram(b_w / 0.01, bins)
    hf, _ = np.histogram(f_w / 0.01, bins)
    print("weight/gmax bin   brian2  flexdsl")
    for i in range(20):
        print(f"  {bins[i]:.2f}-{bins[i + 1]:.2f}     {hb[i]:5d}   {hf[i]:5d}")
    from scipy.stats import ks_2samp

    r = ks_2samp(b_w, f_w)
    print(f"two-sample KS of the final weights: statistic {r.statistic:.4f}, p = {r.pvalue:.3f}")


if __name__ == "__main__":
    main()
