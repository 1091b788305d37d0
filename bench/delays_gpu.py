"""Learnable synaptic delays on one GPU: the DCLS-delays SHD network (Hammouamri et al., ICLR 2024,
repository Thvnvtos/SNN-delays, best_config_SHD.py) against the same network without delays, same run.

Run on the device: python3 bench/delays_gpu.py [--batch 256] [--t 100]
(needs the `dcls` package, 0.1.1, and spikingjelly 2.0.0: carry their wheels)
Network (as the paper's SHD configuration): 700 channels binned by 5 -> 140 inputs, 2 hidden layers of
256 LIF (tau 1.005 steps, decay_input False, threshold 1, ATan(5), detach_reset), an output layer of 20
LIF with an unreachable threshold whose membrane summed over time is the logit; each synaptic layer a
`Dcls1d(kernel_count=1, dilated_kernel_size=25, version="gauss")` over time with left padding 24 and
right padding 12, BatchNorm over channels, dropout 0.4. The baseline is the same network with
`nn.Linear` in place of each Dcls1d (no delays). One training step = forward, cross-entropy, backward
(no optimizer), input spikes Bernoulli(0.03) [T, batch, 140]. Median of 10 after 3 warm-ups,
synchronized; peak memory of a step (torch.cuda.max_memory_allocated above the resident weights).
flexdsl: `FlexDelayNet` (below): `.layer` text with `delay synaptic max 24 learnable`, `m.current` through
BatchNorm into the layer's neuron. `--recurrent`: a recurrent flexdsl layer (700 -> 256 and 1024, T = 100
and 250, batch 64) with learnable axonal delays on its input synapses (max 24; gauss and linear) against
the same layer without, fwd+bwd, same run.

In this repository: `bash bench/gpu_session.sh delays` (the shared delays harness with
`flexdsl_net` filled in; its definitions unchanged)."""
import argparse
import statistics
import time

import torch
from torch import nn

dev = "cuda"
N_IN, HIDDEN, N_OUT, MAX_DELAY = 140, 256, 20, 25
LEFT, RIGHT = MAX_DELAY - 1, (MAX_DELAY - 1) // 2


def lif(threshold=1.0):
    from spikingjelly.activation_based import neuron, surrogate
    return neuron.LIFNode(tau=1.005, v_threshold=threshold, surrogate_function=surrogate.ATan(alpha=5.0),
                          detach_reset=True, step_mode="m", decay_input=False, store_v_seq=True)


class DelayNet(nn.Module):
    def __init__(self, delays=True):
        super().__init__()
        from DCLS.construct.modules import Dcls1d
        from spikingjelly.activation_based import layer
        sizes = [N_IN, HIDDEN, HIDDEN, N_OUT]
        self.delays = delays
        self.syn, self.bn, self.sn, self.drop = nn.ModuleList(), nn.ModuleList(), nn.ModuleList(), nn.ModuleList()
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            last = i == len(sizes) - 2
            if delays:
                d = Dcls1d(a, b, kernel_count=1, groups=1, dilated_kernel_size=MAX_DELAY, bias=False, version="gauss")
                nn.init.kaiming_uniform_(d.weight, nonlinearity="relu")
                nn.init.uniform_(d.P, a=-MAX_DELAY // 2, b=MAX_DELAY // 2)
                d.clamp_parameters()
                nn.init.constant_(d.SIG, MAX_DELAY // 2)
                d.SIG.requires_grad = False
                self.syn.append(d)
            else:
                self.syn.append(nn.Linear(a, b, bias=False))
            self.sn.append(lif(1e9 if last else 1.0))
            if not last:
                self.bn.append(layer.BatchNorm1d(b, step_mode="m"))
                self.drop.append(layer.Dropout(0.4, step_mode="m"))

    def forward(self, x):  # x [T, B, C]
        from spikingjelly.activation_based import functional
        functional.reset_net(self)
        for i, syn in enumerate(self.syn):
            if self.delays:
                x = nn.functional.pad(x.permute(1, 2, 0), (LEFT, RIGHT))
                x = syn(x).permute(2, 0, 1)
            else:
                x = syn(x)
            if i < len(self.bn):
                x = self.bn[i](x.unsqueeze(3)).squeeze(3)
                x = self.drop[i](self.sn[i](x))
            else:
                self.sn[i](x)
                return self.sn[i].v_seq.sum(0)  # [B, N_OUT] logits


READOUT = """neuron Readout:
    \"\"\"SpikingJelly's LIFNode(decay_input=False) with an unreachable threshold: its membrane.\"\"\"
    input x
    param tau = 1.005
    state v = 0.0
    update:
        v = v - v / tau + x
    output v
"""


class FlexDelayNet(nn.Module):
    """The same network in flexdsl: each synaptic layer a feed-forward layer file with learnable
    synaptic delays (`delay synaptic max 24 learnable`: 25 steps, DCLS's Gaussian of width 12.27 =
    DCLS's fixed SIG 12 + 0.27), its current (`m.current`) through BatchNorm over channels into the
    layer's LIF (`lif_no_decay_input`, tau 1.005, ATan(5), detach_reset), dropout 0.4 with one mask
    over time (SpikingJelly's multi-step Dropout); each layer's input padded with 12 zero steps at the
    end, as DCLS-delays pads (the output has T + 12 steps per layer); the readout's membrane summed."""

    def __init__(self, delays=True):
        super().__init__()
        import flexdsl
        sizes = [N_IN, HIDDEN, HIDDEN, N_OUT]
        self.delays = delays
        self.syn, self.bn = nn.ModuleList(), nn.ModuleList()
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            line = f":\n        delay synaptic max {MAX_DELAY - 1} learnable\n" if delays else "\n"
            text = (f"layer L{i}:\n    neuron lif_no_decay_input\n    size {b}\n    input s size {a}\n"
                    f"    synapses W from s to x{line}")
            m = flexdsl.loads(text, tau=1.005, surrogate="atan(alpha=5.0)", detach_reset=True)
            with torch.no_grad():
                nn.init.kaiming_uniform_(m.W, nonlinearity="relu")
            if delays:
                m.set_delay_width(MAX_DELAY // 2 + 0.27)
            self.syn.append(m)
            if i < len(sizes) - 2:
                self.bn.append(nn.BatchNorm1d(b))
        self.readout = flexdsl.loads(READOUT)

    def forward(self, x):  # x [T, B, C]
        for m in self.syn:
            m.reset()
        self.readout.reset()
        for i, m in enumerate(self.syn):
            if self.delays:
                x = nn.functional.pad(x, (0, 0, 0, 0, 0, RIGHT))
            c = m.current(x)
            if i < len(self.bn):
                T, B, C = c.shape
                c = self.bn[i](c.reshape(T * B, C)).reshape(T, B, C)
                s = m.neuron(c)
                if self.training:
                    keep = (torch.rand(B, C, device=s.device) >= 0.4).to(s.dtype) / 0.6
                    s = s * keep
                x = s
            else:
                return self.readout(c).sum(0)  # [B, N_OUT] logits


def flexdsl_net(delays=True):
    """The same network with flexdsl's learnable delays (FlexDelayNet)."""
    return FlexDelayNet(delays)


def train_step(net, x, y):
    """One training step as this harness times it: gradients cleared, forward, cross-entropy, backward."""
    def step():
        for p in net.parameters():
            p.grad = None
        nn.functional.cross_entropy(net(x), y).backward()
    return step


def bench(net, x, y):
    step = train_step(net, x, y)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2 ** 20
    ts = []
    for _ in range(10):
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3, peak


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--t", type=int, default=100)
    ap.add_argument("--recurrent", action="store_true", help="also the recurrent layer with and without delays")
    ap.add_argument("--check", action="store_true", help="first the delay layer on CUDA against the CPU (float64)")
    a = ap.parse_args()
    if a.check:
        check()
    print(f"device {torch.cuda.get_device_name()} torch {torch.__version__}; T={a.t} batch={a.batch}", flush=True)
    torch.manual_seed(0)
    x = (torch.rand(a.t, a.batch, N_IN, device=dev) < 0.03).float()
    y = torch.randint(0, N_OUT, (a.batch,), device=dev)
    for label, make in (("DCLS delays (SJ LIF)", lambda: DelayNet(True)),
                        ("no delays (SJ LIF)", lambda: DelayNet(False)),
                        ("flexdsl delays", lambda: flexdsl_net(True)),
                        ("flexdsl no delays", lambda: flexdsl_net(False))):
        try:
            torch.manual_seed(0)
            net = make()
            if net is None:
                print(f"{label:24s} n/a (no API)", flush=True)
                continue
            net = net.to(dev).train()
            ms, peak = bench(net, x, y)
            print(f"{label:24s} fwd+bwd {ms:8.2f} ms   peak {peak:8.1f} MiB", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"{label:24s} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
    torch.cuda.empty_cache()
    if a.recurrent:
        recurrent()


def recurrent():
    import flexdsl
    print("recurrent layer, input 700, batch 64, learnable axonal delays (max 24) on W_in; fwd+bwd", flush=True)
    rows = []
    for H in (256, 1024):
        for T in (100, 250):
            torch.manual_seed(0)
            x = (torch.rand(T, 64, 700, device=dev) < 0.03).float()
            y = torch.randint(0, 20, (64,), device=dev)
            res = {}
            for kind in ("none", "gauss", "linear"):
                res[kind] = bench(_Readout(flexdsl.loads(recurrent_text(H, kind)), nn.Linear(H, 20)).to(dev), x, y)
            base = res["none"][0]
            line = (f"H={H:5d} T={T:4d}  none {base:7.2f} ms  gauss {res['gauss'][0]:7.2f} ms ({res['gauss'][0] / base:.2f}x)"
                    f"  linear {res['linear'][0]:7.2f} ms ({res['linear'][0] / base:.2f}x)   peak MiB none/gauss/linear "
                    f"{res['none'][1]:.0f}/{res['gauss'][1]:.0f}/{res['linear'][1]:.0f}")
            rows.append(line)
            print(line, flush=True)
    return rows


def recurrent_text(H, kind):
    """The recurrent layer (input 700 -> H LIF) with learnable axonal delays of the relaxation `kind` on its
    input synapses (max 24), or none (`kind="none"`)."""
    line = "" if kind == "none" else f"        delay axonal max 24 learnable {kind}\n"
    return (f"layer R:\n    neuron lif\n    size {H}\n    input s size 700\n    synapses W_in from s to x:\n"
            f"{line}        bias b\n    synapses W_rec from spike to x\n")


class _Readout(nn.Module):
    def __init__(self, layer, head):
        super().__init__()
        self.layer, self.head = layer, head

    def forward(self, x):
        self.layer.reset()
        return self.head(self.layer(x).mean(0))


def check():
    """The flexdsl network's delay layers on the GPU (float32) against the same on the CPU (float64)."""
    import copy
    torch.manual_seed(0)
    net = FlexDelayNet(True).double()
    x = (torch.rand(60, 8, N_IN, dtype=torch.float64) < 0.05).double()
    m = net.syn[0]
    ref = m.current(x)
    gm = copy.deepcopy(m).float().to(dev)
    for tf32 in (False, True):  # (the convolution follows cuDNN's TF32 setting, True by default)
        torch.backends.cudnn.allow_tf32 = tf32
        gm.reset()
        got = gm.current(x.float().to(dev))
        rel = ((got.double().cpu() - ref).norm() / ref.norm()).item()
        bound = 1e-5 if not tf32 else 2e-3  # (float32: ~F * 25 roundings; TF32: a 10-bit mantissa)
        print(f"check: layer 1 delayed current, CUDA float32 (cudnn.allow_tf32={tf32}) vs CPU float64: rel "
              f"{rel:.1e} {'ok' if rel < bound else 'BAD'}", flush=True)
    torch.backends.cudnn.allow_tf32 = True


if __name__ == "__main__":
    main()
