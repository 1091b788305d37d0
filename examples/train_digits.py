"""Train a spiking classifier on scikit-learn's bundled 8x8 digits (no download), with a
flexdsl neuron, and report accuracy on a held-out test set.

    python examples/train_digits.py                       # LIF, CPU: a few seconds, one thread
    python examples/train_digits.py --neuron plif --plot curves.png
    python examples/train_digits.py --neuron my_neuron.neuron --device cuda   # Triton kernels
    python examples/train_digits.py --encoding rate --T 16 --test-T 64         # spike-train inputs

Each image is shown for T steps (default 8). With `--encoding current` (default) the pixel
intensities (x gain) are a constant input current: the neurons integrate it and turn it into
spike trains over time. With `--encoding rate` each pixel is a Bernoulli spike train (a fresh
draw every epoch). The network is Linear(64, H) -> neuron -> Linear(H, 10); the class scores
are the readout averaged over time, so a prediction depends on spikes accumulated across the
steps. Training uses the neuron's surrogate gradient (backpropagation through time); the
accuracy reported is on a held-out quarter of the data set that training never sees.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
from torch import nn


def load_digits_split(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32) / 16.0
    y = torch.tensor(d.target)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.25, random_state=seed, stratify=y)
    return x_tr, x_te, y_tr, y_te


def encode(x: torch.Tensor, T: int, gen: torch.Generator, how: str) -> torch.Tensor:
    """[B, 64] intensities -> [T, B, 64]: Bernoulli spike trains ("rate") or the intensity as
    a constant input current that the neurons integrate ("current")."""
    p = x.unsqueeze(0).expand(T, *x.shape)
    return torch.bernoulli(p, generator=gen) if how == "rate" else p


class Net(nn.Module):
    def __init__(self, neuron: nn.Module, hidden: int, dropout: float = 0.0, gain: float = 1.0) -> None:
        super().__init__()
        self.gain = gain
        self.fc1 = nn.Linear(64, hidden)
        self.neuron = neuron
        self.drop = nn.Dropout(dropout)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, s: torch.Tensor) -> torch.Tensor:  # s: [T, B, 64]
        self.neuron.reset()
        h = self.neuron(self.fc1(s * self.gain))
        h = h[0] if isinstance(h, tuple) else h
        return self.fc2(self.drop(h)).mean(0)  # [B, 10]


def main(argv: list[str] | None = None) -> float:
    ap = argparse.ArgumentParser(description="Spiking classifier on the 8x8 digits with a flexdsl neuron.")
    ap.add_argument("--neuron", default="lif", help="a library stem (e.g. lif, plif, alif) or a .neuron file")
    ap.add_argument("--T", type=int, default=8, help="time steps per image (default 8)")
    ap.add_argument("--encoding", choices=["rate", "current"], default="current",
                    help="rate: Bernoulli spike trains; current: constant input current")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--weight-decay", type=float, default=0.05)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--input-gain", type=float, default=4.0, help="scale of the input (intensity x gain; default 4)")
    ap.add_argument("--test-T", type=int, default=0, help="time steps per test image (default: --T)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (runs the Triton kernels)")
    ap.add_argument("--threads", type=int, default=1,
                    help="CPU threads for torch (default 1: the layers are small, so more threads mostly wait "
                         "on each other, and on a busy machine they compete with other work)")
    ap.add_argument("--plot", metavar="OUT.png", help="save loss and accuracy curves")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    a = ap.parse_args(argv)

    from tqdm import tqdm

    import flexdsl
    from flexdsl import backends

    # what would fail only after training, or with a traceback: said now, in one line
    for name in ("T", "epochs", "hidden", "batch", "threads"):
        if getattr(a, name) < 1:
            ap.error(f"--{name} must be a positive number, not {getattr(a, name)}")
    if a.test_T < 0:
        ap.error(f"--test-T must be a positive number (or 0: as --T), not {a.test_T}")
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
    try:
        neuron = flexdsl.load(a.neuron)
    except flexdsl.FlexDSLError as e:
        ap.exit(2, f"{e}\n")
    if len(neuron.compiled.checked.inputs) != 1:
        ap.error(f"--neuron {a.neuron}: the classifier drives one input per neuron, but "
                 f"{neuron.compiled.name} has {len(neuron.compiled.checked.inputs)}")

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    x_tr, x_te, y_tr, y_te = load_digits_split(a.seed)
    x_tr, x_te, y_tr, y_te = x_tr.to(dev), x_te.to(dev), y_tr.to(dev), y_te.to(dev)
    net = Net(neuron, a.hidden, a.dropout, a.input_gain).to(dev)
    opt = torch.optim.AdamW(net.parameters(), lr=a.lr, weight_decay=a.weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, a.epochs)
    gen = torch.Generator(device=dev).manual_seed(a.seed)
    test_gen_seed = a.seed + 1
    history: dict[str, list[float]] = {"loss": [], "train": [], "test": []}
    kernel = {"triton": "Triton kernels", "cpu": "CPU kernels", "torch": "torch backend"}.get(
        backends.choose(neuron.backend, [x_tr]).name, "another backend")
    print(f"neuron {neuron.compiled.name} ({neuron.compiled.filename}) on {dev} ({kernel}); "
          f"{len(x_tr)} training / {len(x_te)} test images, T={a.T}, {a.threads} CPU thread"
          f"{'s' if a.threads != 1 else ''}")
    t0 = time.time()

    def evaluate(x: torch.Tensor, y: torch.Tensor, seed: int) -> float:
        g = torch.Generator(device=dev).manual_seed(seed)
        net.eval()
        with torch.no_grad():
            pred = torch.cat([net(encode(xb, a.test_T or a.T, g, a.encoding)).argmax(1) for xb in x.split(256)])
        net.train()
        return (pred == y).float().mean().item()

    for epoch in range(a.epochs):
        perm = torch.randperm(len(x_tr), device=dev)
        total, correct, seen = 0.0, 0, 0
        bar = tqdm(perm.split(a.batch), desc=f"epoch {epoch + 1:2d}/{a.epochs}", leave=False,
                   disable=a.quiet or not sys.stdout.isatty(), file=sys.stdout)  # (a log gets the epoch lines)
        for idx in bar:
            scores = net(encode(x_tr[idx], a.T, gen, a.encoding))
            loss = nn.functional.cross_entropy(scores, y_tr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(idx)
            correct += (scores.argmax(1) == y_tr[idx]).sum().item()
            seen += len(idx)
            bar.set_postfix(loss=f"{total / seen:.3f}", acc=f"{correct / seen:.3f}")
        sched.step()
        history["loss"].append(total / seen)
        history["train"].append(correct / seen)
        history["test"].append(evaluate(x_te, y_te, test_gen_seed))
        if not a.quiet:
            print(f"epoch {epoch + 1:2d}: loss {total / seen:.3f}, train accuracy {correct / seen:.3f}, "
                  f"test accuracy {history['test'][-1]:.3f} ({time.time() - t0:.0f} s)")
    if a.plot:
        _plot(a.plot, history)
        print(f"curves written to {a.plot}")
    acc = evaluate(x_te, y_te, test_gen_seed)
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
    ax2.set_ylim(0.5, 1.0)
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
