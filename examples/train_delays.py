"""Learn synaptic delays on a task that needs them: classes that differ only in the relative timing
of spikes across channels.

    python examples/train_delays.py                        # learnable delays, CPU: ~1 min on 2 cores
    python examples/train_delays.py --delays none          # the same network without delays (chance)
    python examples/train_delays.py --delays dcls          # the same network with DCLS's Dcls1d (needs `dcls`)
    python examples/train_delays.py --plot delays.png      # curves and the histogram of the learned delays
    python examples/train_delays.py --doc page/            # the trained layer's page: equations, learned delays
    python examples/train_delays.py --device cuda

The task (generated here, no download): every sample has `--channels` input channels, each firing
exactly one spike; in class c channel j fires `lag[c, j]` steps after a random onset, the lags of a
class being a permutation of the same distinct values 0, 2, ..., 2(channels - 1). No two spikes of a
sample fall on one step, and every class has every channel fire once: a network whose neurons only
see the present step (LIF with tau = 1.005 steps, as DCLS-delays' SHD networks) cannot tell the
classes apart without delays: it stays at chance. With a learnable delay per connection
(`delay synaptic max D learnable`) a neuron can bring one class's spikes onto the same step and fire
on that coincidence.

The network: one flexdsl layer (`--hidden` LIF neurons, learnable synaptic delays up to `--max-delay`
steps, DCLS's Gaussian relaxation whose width anneals from max/2 to 0.5 over the first 70 % of the
epochs; then the delays are rounded to whole steps, `m.round_delays()`, and the weights fine-tuned
on them) and a linear readout of the spike counts. The reported accuracy is on held-out samples,
with the whole-step delays that inference and export run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch import nn

TAU = 1.005  # steps: the neurons forget their input within a step (DCLS-delays' SHD setting)


def make_task(n: int, channels: int, classes: int, steps: int, seed: int, noise: float = 0.0,
              patterns: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x [steps, n, channels] of 0/1 spikes, labels [n], the classes' lags [classes, channels]);
    `noise`: the probability of a background spike per channel and step (the same in every class)."""
    g = torch.Generator().manual_seed(seed)
    lags = torch.arange(channels) * 2
    if patterns is None:
        patterns = torch.stack([lags[torch.randperm(channels, generator=g)] for _ in range(classes)])
    y = torch.randint(0, classes, (n,), generator=g)
    onset = torch.randint(0, steps - int(lags.max()), (n,), generator=g)
    x = torch.zeros(steps, n, channels)
    t = onset.unsqueeze(1) + patterns[y]  # [n, channels]
    x[t, torch.arange(n).unsqueeze(1), torch.arange(channels)] = 1.0
    if noise > 0:
        x = torch.maximum(x, (torch.rand(x.shape, generator=g) < noise).float())
    return x, y, patterns


class Net(nn.Module):
    def __init__(self, kind: str, channels: int, hidden: int, classes: int, max_delay: int) -> None:
        super().__init__()
        import flexdsl

        self.kind, self.max_delay = kind, max_delay
        delay = f"        delay synaptic max {max_delay} learnable\n" if kind != "none" else ""
        text = (f"layer Hidden:\n    neuron lif_no_decay_input\n    size {hidden}\n    input s size {channels}\n"
                f"    synapses W from s to x:\n{delay}        bias b\n")
        self.layer = flexdsl.loads(text, tau=TAU)
        if kind == "dcls":  # (the same initial weights, bias and delays as flexdsl's layer, in DCLS's form)
            from DCLS.construct.modules import Dcls1d

            with torch.random.fork_rng():  # (its own initialisation, overwritten: the same random numbers after)
                self.dcls = Dcls1d(channels, hidden, kernel_count=1, dilated_kernel_size=max_delay + 1, bias=True,
                                   version="gauss")
            with torch.no_grad():
                self.dcls.weight.copy_(self.layer.W.unsqueeze(-1))
                self.dcls.bias.copy_(self.layer.b)
                self.dcls.P.copy_((max_delay - self.layer.W_delay - (max_delay + 1) // 2).reshape(self.dcls.P.shape))
            self.neuron = self.layer.neuron
            del self.layer
        self.readout = nn.Linear(hidden, classes)

    def delay_params(self) -> list[nn.Parameter]:
        if self.kind == "dcls":
            return [self.dcls.P]
        return [self.layer.W_delay] if self.kind == "learnable" else []

    def set_width(self, sigma: float) -> None:
        if self.kind == "learnable":
            self.layer.set_delay_width(sigma)
        elif self.kind == "dcls":  # (DCLS's width is |SIG| + 0.27)
            with torch.no_grad():
                self.dcls.SIG.fill_(max(sigma - 0.27, 0.0))

    def after_step(self) -> None:
        if self.kind == "dcls":
            self.dcls.clamp_parameters()  # (flexdsl keeps its delays in [0, max] itself)

    def round_delays(self) -> None:
        if self.kind == "learnable":
            self.layer.round_delays()
        elif self.kind == "dcls":
            with torch.no_grad():
                self.dcls.P.round_()
                self.dcls.SIG.zero_()

    def learned_delays(self) -> torch.Tensor:
        if self.kind == "dcls":  # (a position p is the delay max - (p + (max + 1) // 2))
            return (self.max_delay - (self.dcls.P.detach()[0, :, :, 0] + (self.max_delay + 1) // 2)).flatten()
        return self.layer.W_delay.detach().flatten()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [T, B, channels]
        if self.kind == "dcls":
            self.neuron.reset()
            h = nn.functional.pad(x.permute(1, 2, 0), (self.max_delay, 0))
            s = self.neuron(self.dcls(h).permute(2, 0, 1))
        else:
            self.layer.reset()
            s = self.layer(x)
        return self.readout(s.sum(0))  # [B, classes]: the spike counts, read out


def main(argv: list[str] | None = None) -> float:
    ap = argparse.ArgumentParser(description="Learnable synaptic delays on a spike-timing task.")
    ap.add_argument("--delays", default="learnable", choices=["learnable", "none", "dcls"],
                    help="flexdsl's learnable delays, none, or DCLS's Dcls1d (the reference)")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--channels", type=int, default=10)
    ap.add_argument("--classes", type=int, default=6)
    ap.add_argument("--noise", type=float, default=0.01, help="background spikes per channel and step")
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--max-delay", type=int, default=20)
    ap.add_argument("--steps", type=int, default=40, help="the samples' length T")
    ap.add_argument("--train", type=int, default=1024)
    ap.add_argument("--test", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=5e-3, help="Adam's rate for the weights")
    ap.add_argument("--lr-delays", type=float, default=0.1, help="Adam's rate for the delays (steps)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda")
    ap.add_argument("--plot", metavar="OUT.png", help="save the curves and the learned delays' histogram")
    ap.add_argument("--doc", metavar="DIR", help="write the trained layer's page (equations, learned delays) into DIR")
    a = ap.parse_args(argv)

    import flexdsl

    for name in ("epochs", "channels", "hidden", "max_delay", "train", "test", "batch"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be a positive number, not {getattr(a, name)}")
    if not 0 <= a.noise < 1:
        ap.error(f"--noise must be a probability in [0, 1), not {a.noise}")
    if a.classes < 2:
        ap.error(f"--classes must be 2 or more, not {a.classes}")
    span = 2 * (a.channels - 1)
    if a.steps <= span:
        ap.error(f"--steps must exceed the lags' span ({span} steps for {a.channels} channels), not {a.steps}")
    if a.max_delay < span:
        ap.error(f"--max-delay must reach the lags' span ({span} steps for {a.channels} channels), not {a.max_delay}")
    try:
        dev = torch.device(a.device)
    except RuntimeError:
        ap.error(f"--device: unknown device `{a.device}` (use cpu or cuda)")
    if dev.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: this torch has no CUDA device (run on a GPU machine, or use --device cpu)")
    if a.delays == "dcls":
        try:
            import DCLS  # noqa: F401
        except ImportError:
            ap.error("--delays dcls needs the `dcls` package (pip install dcls)")
    if a.doc is not None and a.delays == "dcls":
        ap.error("--doc writes a flexdsl layer's page: use it with --delays learnable or none")
    if a.plot is not None:
        from flexdsl.docs.plots import plot_path_problem

        problem = plot_path_problem(a.plot)
        if problem is not None:
            ap.error(f"--plot {a.plot}: {problem[0]} ({problem[1]})")

    x_tr, y_tr, patterns = make_task(a.train, a.channels, a.classes, a.steps, a.seed, a.noise)
    x_te, y_te, _ = make_task(a.test, a.channels, a.classes, a.steps, a.seed + 1, a.noise, patterns)
    x_tr, y_tr, x_te, y_te = (t.to(dev) for t in (x_tr, y_tr, x_te, y_te))
    torch.manual_seed(a.seed)
    try:
        net = Net(a.delays, a.channels, a.hidden, a.classes, a.max_delay).to(dev)
    except flexdsl.FlexDSLError as e:
        ap.exit(2, f"{e}\n")
    delays = net.delay_params()
    others = [p for p in net.parameters() if all(p is not d for d in delays)]
    opt = torch.optim.Adam([{"params": others, "lr": a.lr}, {"params": delays, "lr": a.lr_delays}])
    anneal = max(1, (7 * a.epochs) // 10)  # the width anneals over 70 % of the epochs; then whole steps
    print(f"{a.classes} classes of {a.channels} channels firing once each, lags 0..{span} steps, T={a.steps}, "
          f"background spikes {a.noise:g} per step; "
          f"{x_tr.shape[1]} training / {x_te.shape[1]} test samples; {a.hidden} LIF neurons (tau {TAU} steps), delays: "
          f"{a.delays}" + (f" (max {a.max_delay} steps)" if a.delays != "none" else "") + f"; on {dev}")
    history: dict[str, list[float]] = {"loss": [], "train": [], "test": []}

    def evaluate() -> float:
        net.eval()
        with torch.no_grad():
            pred = torch.cat([net(x_te[:, i:i + 512]).argmax(1) for i in range(0, x_te.shape[1], 512)])
        net.train()
        return (pred == y_te).float().mean().item()

    t0 = time.time()
    for epoch in range(a.epochs):
        if epoch < anneal:
            net.set_width(max(0.5, a.max_delay / 2 * (1 - epoch / (anneal - 1 or 1))))
        elif epoch == anneal:  # the delays rounded to whole steps (what inference runs); the weights fine-tuned
            net.round_delays()
            opt.param_groups[1]["lr"] = 0.0
        perm = torch.randperm(x_tr.shape[1], device=dev)
        total, correct = 0.0, 0
        for idx in perm.split(a.batch):
            scores = net(x_tr[:, idx])
            loss = nn.functional.cross_entropy(scores, y_tr[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            net.after_step()
            total += loss.item() * len(idx)
            correct += (scores.argmax(1) == y_tr[idx]).sum().item()
        history["loss"].append(total / x_tr.shape[1])
        history["train"].append(correct / x_tr.shape[1])
        history["test"].append(evaluate())
        print(f"epoch {epoch + 1:2d}: loss {history['loss'][-1]:.3f}, train accuracy {history['train'][-1]:.3f}, "
              f"test accuracy {history['test'][-1]:.3f} ({time.time() - t0:.0f} s)", flush=True)
    net.round_delays()
    acc = evaluate()
    if a.plot:
        _plot(a.plot, history, net.learned_delays().cpu() if a.delays != "none" else None, a.max_delay)
        print(f"curves and delays written to {a.plot}")
    if a.doc and a.delays != "dcls":
        import flexdsl.docs

        out = Path(a.doc)
        out.mkdir(parents=True, exist_ok=True)
        (out / "hidden.html").write_text(flexdsl.docs.render_layer(net.layer, out), encoding="utf-8")
        (out / "hidden.md").write_text(flexdsl.docs.render_layer(net.layer, out, markdown=True), encoding="utf-8")
        print(f"the trained layer's page written to {out / 'hidden.html'}")
    print(f"trained in {time.time() - t0:.1f} s")
    print(f"test accuracy (delays rounded to whole steps): {acc:.3f}")
    return acc


def _plot(path: str, h: dict[str, list[float]], delays: torch.Tensor | None, max_delay: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3 if delays is not None else 2, figsize=(12 if delays is not None else 8, 3.4))
    epochs = range(1, len(h["loss"]) + 1)
    axes[0].plot(epochs, h["loss"], color="tab:red")
    axes[0].set_xlabel("epoch")
    axes[0].set_ylabel("training loss")
    axes[1].plot(epochs, h["train"], label="train")
    axes[1].plot(epochs, h["test"], label="held-out test")
    axes[1].set_xlabel("epoch")
    axes[1].set_ylabel("accuracy")
    axes[1].set_ylim(0.0, 1.0)
    axes[1].legend()
    if delays is not None:
        axes[2].hist(delays.numpy(), bins=range(max_delay + 2), align="left", color="tab:green")
        axes[2].set_xlabel("learned delay (steps, rounded)")
        axes[2].set_ylabel("connections")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(0 if main() >= 0 else 1)
