"""The `flexdsl` command line: check, show, run, doc (LANGUAGE.md §9).

User errors print the located message and exit 1 — never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .errors import FlexDSLError


def _cmd_check(args: argparse.Namespace) -> int:
    from .runtime.compiler import compile_model

    failed = 0
    for f in args.files:
        try:
            c = compile_model(f)
            method = f", method {c.method}" if c.method else ""  # lowering: its errors count too
        except FlexDSLError as e:
            print(e, file=sys.stderr)
            failed += 1
            continue
        ck = c.checked
        kind = "spiking" if ck.spike is not None else "non-spiking"
        print(f"{f}: ok — neuron {ck.name} ({kind}{method}; {len(ck.inputs)} input(s), {len(ck.params)} param(s), "
              f"{len(ck.states) - len(ck.hidden)} state(s))")
    return 1 if failed else 0


def _cmd_show(args: argparse.Namespace) -> int:
    from .runtime.compiler import compile_model

    if str(args.file).endswith(".nir"):
        return _show_nir(args)
    if args.dt is not None:
        raise FlexDSLError("--dt applies to NIR files (.nir) only", "<command line>")
    c = compile_model(args.file, detach_reset=args.detach_reset)
    _show_compiled(c, args.what or "torch")
    return 0


def _show_nir(args: argparse.Namespace) -> int:
    """Each neuron node of a NIR file: its generated `.neuron` text (default) or code."""
    from . import nir

    net = nir.load(args.file, dt=args.dt, backend="torch", detach_reset=args.detach_reset)
    kinds = net.node_kinds
    texts = net.neuron_texts
    print(f"# {args.file}: {len(kinds)} nodes, dt={net.dt:g}" + (", recurrent" if net.recurrent else ""))
    for name, kind in kinds.items():
        if name not in texts:
            print(f"# node {name!r}: {kind}")
            continue
        print(f"\n# ---- node {name!r}: NIR {kind}")
        if args.what in (None, "neuron"):
            print(texts[name], end="")
        else:
            _show_compiled(net.nodes[net.names[name]].compiled, args.what)
        print()
    return 0


def _show_compiled(c, what: str) -> None:
    if what == "torch":
        print(c.torch_source, end="")
    elif what == "triton":
        print(c.triton_source, end="")
    elif what == "equations":
        print(_format_equations(c, backward=False))
    elif what == "backward":
        print(_format_equations(c, backward=True))
    elif what == "neuron":
        print(c.text, end="")


def _format_equations(c, backward: bool) -> str:
    import sympy as sp

    step = c.step
    lines = [f"# neuron {c.name} ({c.filename})"]
    if step.method:
        lines.append(f"# integration: {step.method}" + (" (chosen automatically)" if step.method_auto else ""))
    lines.append(f"# inputs: {', '.join(s.name for s in step.inputs)}; states: {', '.join(s.name for s in step.states)}")
    if not backward:
        lines += [f"# computed once per call from the params: {d.describe()}" for d in step.derived]
        lines.append("# one step, in order (previous state values are the plain state names):")
        for y, e in step.assignments:
            lines.append(f"{y} = {sp.sstr(e)}")
        lines.append("# next states: " + ", ".join(f"{s} <- {v}" for s, v in zip(step.states, step.next_states)))
        lines.append("# outputs: " + ", ".join(f"{n} = {v}" for n, v in step.outputs))
        if step.surrogate is not None:
            lines.append(f"# surrogate {step.surrogate.name}: d spike/d u = {sp.sstr(step.surrogate.derivative)} (u = _u)")
    else:
        bw = c.backward
        lines.append("# given: " + ", ".join(str(g) for g in [*bw.grad_outputs, *bw.grad_next_states])
                     + " and the forward values")
        for y, e in bw.assignments:
            lines.append(f"{y} = {sp.sstr(e)}")
        res = [*zip(step.inputs, bw.grad_inputs), *zip(step.states, bw.grad_states),
               *zip((p.symbol for p in step.learnable), bw.grad_params)]
        lines.append("# results: " + ", ".join(f"d/d{s} = {g}" for s, g in res))
    return "\n".join(lines)


def _parse_input(spec: str, T: int):
    import torch

    try:
        if spec.startswith("step:"):
            amp, _, at = spec[5:].partition("@")
            x = torch.zeros(T, dtype=torch.float64)
            x[int(at or 0):] = float(amp)
            return x
        return torch.full((T,), float(spec), dtype=torch.float64)
    except ValueError:
        raise FlexDSLError(f"bad --input `{spec}`", "<command line>",
                           hint="use a number (`--input 1.5`) or a step (`--input step:1.5@20`)") from None


def _cmd_run(args: argparse.Namespace) -> int:
    import torch

    from .api import load

    overrides = {}
    for kv in args.param or []:
        k, sep, v = kv.partition("=")
        if not sep or not k or not v.strip():
            raise FlexDSLError(f"bad --param `{kv}`", "<command line>", hint="use NAME=VALUE") from None
        try:
            overrides[k] = float(v)
        except ValueError:
            overrides[k] = v  # a value with a unit, `tau=20 ms` (checked by the model)
    m = load(args.file, backend="torch", store_state_seqs=True, check_finite=args.check_finite,
             **overrides).to(torch.float64)
    c = m.compiled
    T = args.T
    x = _parse_input(args.input, T).reshape(T, 1)
    n_in = len(c.checked.inputs)
    inputs = [x] + [torch.zeros_like(x) for _ in range(n_in - 1)]
    with torch.no_grad():
        out = m(*inputs)
    outs = out if isinstance(out, tuple) else (out,)
    names = [n for n, _ in c.checked.outputs]
    print(f"neuron {c.name} ({c.filename}): {T} steps, input {args.input}"
          + (f" on `{c.checked.inputs[0].name}`" if n_in else ""))
    spikes = None
    for n, o in zip(names, outs):
        if n == "spike":
            spikes = o[:, 0]
            k = int(spikes.sum().item())
            steps = [int(i) for i in torch.nonzero(spikes).flatten()[:10]]
            more = " ..." if k > 10 else ""
            print(f"spikes: {k} ({k / max(T, 1):.3f} per step) at steps {steps}{more}")
        else:
            print(f"output {n}: final {o[-1, 0].item():.6g}, min {o.min().item():.6g}, max {o.max().item():.6g}"
                  if T else f"output {n}: (no steps)")
    for s in c.checked.states:
        if s.meta.get("hidden"):  # bookkeeping of refractoriness and crossing rules
            continue
        v = getattr(m, s.name)
        val = v.flatten()[0].item() if isinstance(v, torch.Tensor) else float(v)
        print(f"state {s.name}: final {val:.6g}{_unit(c, s.name)}" + (f"  ({s.doc})" if s.doc else ""))
    if args.plot:
        _plot(args.plot, c, x[:, 0], m.state_seqs, spikes, args.input)
        print(f"plot written to {args.plot}")
    return 0


def _plot(path: str, c, x, seqs, spikes, label: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    states = [s.name for s in c.checked.states if not s.meta.get("hidden") and s.name in seqs]
    n = 1 + len(states) + (1 if spikes is not None else 0)
    fig, axes = plt.subplots(n, 1, figsize=(8, 1.6 * n + 0.6), sharex=True, squeeze=False)
    axes = axes[:, 0]
    t = range(len(x))
    axes[0].plot(t, x.numpy(), color="tab:gray")
    axes[0].set_ylabel(c.checked.inputs[0].name + _unit(c, c.checked.inputs[0].name, " ({})"))
    axes[0].set_title(f"{c.name}: input {label}")
    for ax, s in zip(axes[1:], states):
        ax.plot(t, seqs[s][:, 0].numpy(), color="tab:blue")
        ax.set_ylabel(s + _unit(c, s, " ({})"))
    if spikes is not None:
        ax = axes[-1]
        idx = torch_nonzero(spikes)
        ax.vlines(idx, 0, 1, color="black")
        ax.set_ylim(0, 1.2)
        ax.set_yticks([])
        ax.set_ylabel("spikes")
    axes[-1].set_xlabel("step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _unit(c, name: str, fmt: str = " {}") -> str:
    """The unit of a value at the API (models with units), e.g. " mV"."""
    u = c.checked.units.unit.get(name) if c.checked.units is not None else None
    return fmt.format(u) if u and u != "1" else ""


def torch_nonzero(s):
    import torch

    return torch.nonzero(s).flatten().numpy()


def _cmd_doc(args: argparse.Namespace) -> int:
    raise FlexDSLError("`flexdsl doc` is not implemented yet", "<command line>",
                       hint="use `flexdsl show FILE --equations` to see what is computed")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flexdsl", description="Spiking neurons from equations.")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="validate .neuron files")
    c.add_argument("files", nargs="+")
    c.set_defaults(fn=_cmd_check)
    s = sub.add_parser("show", help="print generated code or equations (of a .neuron, or of each neuron of a .nir)")
    s.add_argument("file")
    g = s.add_mutually_exclusive_group()
    for w in ("torch", "triton", "equations", "backward", "neuron"):
        g.add_argument(f"--{w}", dest="what", action="store_const", const=w)
    s.add_argument("--detach-reset", action="store_true")
    s.add_argument("--dt", type=float, help="for a .nir file: the step, in the graph's time unit "
                   "(default: the one flexdsl.nir.export recorded)")
    s.set_defaults(fn=_cmd_show)
    r = sub.add_parser("run", help="simulate one neuron and summarize (optionally plot)")
    r.add_argument("file")
    r.add_argument("--T", type=int, default=200)
    r.add_argument("--input", default="1.5")
    r.add_argument("--param", action="append", metavar="NAME=VALUE")
    r.add_argument("--plot", metavar="OUT.png")
    r.add_argument("--check-finite", action="store_true",
                   help="stop with an error at the first NaN or inf, naming the state and the step")
    r.set_defaults(fn=_cmd_run)
    d = sub.add_parser("doc", help="documentation from the equations (not yet available)")
    d.add_argument("paths", nargs="+")
    d.add_argument("-o", "--out", default="docs")
    d.set_defaults(fn=_cmd_doc)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args) or 0)
    except FlexDSLError as e:
        print(e, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
