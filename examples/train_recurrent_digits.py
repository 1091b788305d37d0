"""Train a recurrent spiking network on a temporal task: scikit-learn's bundled 8x8 digits (no
download) read one pixel column per step, so the network sees a digit as an 8-step sequence of
8 values and must remember the earlier columns to classify it.

    python examples/train_recurrent_digits.py                     # LIF, CPU (torch backend): ~10 s on 2 cores
    python examples/train_recurrent_digits.py --neuron alif --plot curves.png
    python examples/train_recurrent_digits.py --device cuda        # the compiled Triton layer
    python examples/train_recurrent_digits.py --no-recurrence      # the same network without W_rec
    python examples/train_recurrent_digits.py --learning eprop     # e-prop instead of BPTT (online learning)

The network is `flexdsl.recurrent(neuron, 8, H)` -- at each step the neurons receive
W_in x[t] + W_rec s[t-1] + b, s being their own spikes of the step before -- and a linear readout
of the spikes averaged over the last steps. Training is backpropagation through time with the
neuron's derived surrogate gradient; the accuracy reported is on a held-out quarter of the data
that training never sees. `--no-recurrence` (W_rec fixed at 0) shows what the feedback adds.
`--learning eprop` trains the same network by e-prop (Bellec et al. 2020): eligibility traces
derived from the neuron's equations, run forward with the steps, and the readout's error as the
learning signal (`--feedback random`: sent back through a fixed random matrix instead of the
readout's weights).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch import nn


def load_digits_split(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32).reshape(-1, 8, 8) / 16.0  # [N, row, column]
    y = torch.tensor(d.target)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.25, random_state=seed, stratify=y)
    return x_tr, x_te, y_tr, y_te


def as_sequence(img: torch.Tensor) -> torch.Tensor:
    """[B, 8, 8] images -> [T=8, B, 8]: step t sees column t (its 8 pixels, top to bottom)."""
    return img.permute(2, 0, 1).contiguous()


class Net(nn.Module):
    def __init__(self, neuron: str, hidden: int, gain: float, readout_steps: int, recurrence: bool,
                 learning: str = "bptt", feedback: str = "symmetric") -> None:
        super().__init__()
        import flexdsl

        self.gain = gain
        self.readout_steps = readout_steps
        eprop = {"learning": "eprop", "readout": 10, "feedback": feedback} if learning == "eprop" else {}
        self.rnn = flexdsl.recurrent(neuron, 8, hidden, **eprop)
        if not recurrence:
            with torch.no_grad():
                self.rnn.W_rec.zero_()
            self.rnn.W_rec.requires_grad_(False)
        self.fc = self.rnn.readout if learning == "eprop" else nn.Linear(hidden, 10)

    def forward(self, seq: torch.Tensor) -> torch.Tensor:  # seq: [T, B, 8]
        self.rnn.reset()
        s = self.rnn(seq * self.gain)
        s = s[0] if isinstance(s, tuple) else s
        return self.fc(s[-self.readout_steps:].mean(0))  # [B, 10]


def main(argv: list[str] | None = None) -> float:
    ap = argparse.ArgumentParser(description="Recurrent spiking classifier of digits read column by column.")
    ap.add_argument("--neuron", default="lif", help="a library stem (lif, alif, plif...) or a .neuron file")
    ap.add_argument("--epochs", type=int, default=25)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--input-gain", type=float, default=0.0,
                    help="scale of the pixel values (default: 40 for alif, whose input is scaled by 1 - "
                         "exp(-dt/tau_m), else 4)")
    ap.add_argument("--readout-steps", type=int, default=4, help="the last steps whose spikes the readout averages")
    ap.add_argument("--no-recurrence", action="store_true", help="W_rec fixed at 0 (a feed-forward baseline)")
    ap.add_argument("--learning", default="bptt", choices=["bptt", "eprop"],
                    help="backpropagation through time, or e-prop (eligibility traces, online)")
    ap.add_argument("--feedback", default="symmetric", choices=["symmetric", "random"],
                    help="e-prop's learning signal through the readout's weights or a fixed random matrix")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (the compiled Triton layer)")
    ap.add_argument("--plot", metavar="OUT.png", help="save loss and accuracy curves")
    a = ap.parse_args(argv)

    import flexdsl

    for name in ("epochs", "hidden", "batch", "readout_steps"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be a positive number, not {getattr(a, name)}")
    if a.readout_steps > 8:
        ap.error(f"--readout-steps must be at most 8 (the sequence's length), not {a.readout_steps}")
    try:
        dev = torch.device(a.device)
    except RuntimeError:
        ap.error(f"--device: unknown device `{a.device}` (use cpu or cuda)")
    if dev.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: this torch has no CUDA device (run on a GPU machine, or use --device cpu)")
    if a.plot is not None:
        from flexdsl.docs.plots import plot_path_problem

        problem = plot_path_problem(a.plot)
        if problem is not None:
            ap.error(f"--plot {a.plot}: {problem[0]} ({problem[1]})")
    gain = a.input_gain or (40.0 if Path(a.neuron).stem == "alif" else 4.0)
    torch.manual_seed(a.seed)
    try:
        net = Net(a.neuron, a.hidden, gain, a.readout_steps, not a.no_recurrence, a.learning, a.feedback).to(dev)
    except flexdsl.FlexDSLError as e:
        ap.exit(2, f"{e}\n")
    x_tr, x_te, y_tr, y_te = (t.to(dev) for t in load_digits_split(a.seed))
    params = [p for p in net.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=a.lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, a.epochs)
    history: dict[str, list[float]] = {"loss": [], "train": [], "test": []}
    c = net.rnn.neuron.compiled
    print(f"recurrent {c.name} layer ({c.filename}), {a.hidden} neurons, on {dev} "
          f"({'Triton kernels' if dev.type == 'cuda' else 'torch backend'}); {len(x_tr)} training / {len(x_te)} test "
          f"digits, read column by column (T=8){'; no recurrence' if a.no_recurrence else ''}; learning: "
          f"{'e-prop (' + a.feedback + ' feedback)' if a.learning == 'eprop' else 'BPTT'}")
    t0 = time.time()

    def evaluate(x: torch.Tensor, y: torch.Tensor) -> float:
        net.eval()
        with torch.no_grad():
            pred = torch.cat([net(as_sequence(xb)).argmax(1) for xb in x.split(512)])
        net.train()
        return (pred == y).float().mean().item()

    for epoch in range(a.epochs):
        perm = torch.randperm(len(x_tr), device=dev)
        total, correct = 0.0, 0
        for idx in perm.split(a.batch):
            scores = net(as_sequence(x_tr[idx]))
            loss = nn.functional.cross_entropy(scores, y_tr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
            correct += (scores.argmax(1) == y_tr[idx]).sum().item()
        sched.step()
        history["loss"].append(total / len(x_tr))
        history["train"].append(correct / len(x_tr))
        history["test"].append(evaluate(x_te, y_te))
        print(f"epoch {epoch + 1:2d}: loss {history['loss'][-1]:.3f}, train accuracy {history['train'][-1]:.3f}, "
              f"test accuracy {history['test'][-1]:.3f} ({time.time() - t0:.0f} s)", flush=True)
    if a.plot:
        _plot(a.plot, history)
        print(f"curves written to {a.plot}")
    acc = evaluate(x_te, y_te)
    print(f"trained in {time.time() - t0:.1f} s")
    print(f"test accuracy: {acc:.3f}")
    return acc


def _plot(path: str, h: dict[str, list[float]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.4))
    epochs = range(1, len(h["loss"]) + 1)
    ax1.plot(epochs, h["loss"], color="tab:red")
    ax1.set_xlabel("epoch")
    ax1.set_ylabel("training loss")
    ax2.plot(epochs, h["train"], label="train")
    ax2.plot(epochs, h["test"], label="held-out test")
    ax2.set_xlabel("epoch")
    ax2.set_ylabel("accuracy")
    ax2.set_ylim(0.0, 1.0)
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(0 if main() >= 0 else 1)
