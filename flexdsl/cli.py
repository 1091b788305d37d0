"""The `flexdsl` command line: check, show, run, doc (the language reference, docs/language.md,
section "Command line", describes each).

User errors print the located message and exit 1 — never a traceback.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from . import backends, cli_files
from .cli_files import CMDLINE, check_layer, check_rule, no_options, show_rule
from .errors import FlexDSLError, printable


# ----------------------------------------------------------------------------- check
def _neuron_files(args: Sequence[str]) -> list[str]:
    """Files as given; a directory stands for every `.neuron`, `.layer` and `.rule` file below it (sorted)."""
    out: list[str] = []
    for a in args:
        p = Path(a)
        if p.is_dir():
            found = sorted(str(q) for q in [*p.rglob("*.neuron"), *p.rglob("*.layer"), *p.rglob("*.rule")]
                           if q.is_file())
            if not found:
                raise FlexDSLError(f"no `.neuron`, `.layer` or `.rule` files in the directory `{a}`", a)
            out += found
        else:
            out.append(a)
    return out


def _options(args: argparse.Namespace):
    """The load-time options of the command line (`--surrogate TEXT`, `--learnable NAMES`)."""
    from .frontend.options import LoadOptions

    learn: bool | tuple[str, ...] | None = None
    spec = getattr(args, "learnable", None)
    if spec is not None:
        words = [w.strip() for w in spec.split(",")]
        if spec.strip() in ("all", "none"):
            learn = spec.strip() == "all"
        elif not all(words):
            raise FlexDSLError(f"bad --learnable `{spec}`", CMDLINE,
                               hint="param names separated by commas (--learnable tau,v_threshold), or all, or none")
        else:
            learn = tuple(sorted(set(words)))
    sur = getattr(args, "surrogate", None)
    return LoadOptions(sur.strip() if sur is not None else None, learn)


def _add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--surrogate", metavar="TEXT",
                   help="the spike's surrogate gradient instead of the model's, e.g. --surrogate 'atan(alpha=2.0)' "
                        "(as load(..., surrogate=...))")
    p.add_argument("--learnable", metavar="NAMES",
                   help="the params to train instead of the model's `learnable` ones: names separated by commas "
                        "(--learnable tau,v_threshold), all or none (as load(..., learnable=...))")


def _cmd_check(args: argparse.Namespace) -> int:
    from .runtime.compiler import compile_model

    failed = 0
    opts = _options(args)
    for f in _neuron_files(args.files):
        kind, f = cli_files.file_kind(f)
        if kind == "layer":
            no_options(opts, f, note=True)
            failed += check_layer(f)
            continue
        if kind == "rule":
            no_options(opts, f, rule=True, note=True)
            failed += check_rule(f, opts.learnable)
            continue
        try:
            c = compile_model(f, options=opts)
            method = f", method {c.method}" if c.method else ""  # lowering: its errors count too
        except FlexDSLError as e:
            print(e, file=sys.stderr)
            failed += 1
            continue
        except (ArithmeticError, ValueError, TypeError, LookupError, RecursionError) as e:
            # (a flexdsl bug on this file: reported, and the other files are still checked)
            print(f"{f}: error: flexdsl failed on this file ({type(e).__name__}: {str(e)[:200]})", file=sys.stderr)
            print("hint: this is a bug in flexdsl; please report it with the file", file=sys.stderr)
            failed += 1
            continue
        ck = c.checked
        kind = "spiking" if ck.spike is not None else "non-spiking"
        print(f"{f}: ok — neuron {ck.name} ({kind}{method}; {len(ck.inputs)} input(s), {len(ck.params)} param(s), "
              f"{len(ck.states) - len(ck.hidden)} state(s))")
    return 1 if failed else 0


# ----------------------------------------------------------------------------- show
def _cmd_show(args: argparse.Namespace) -> int:
    from .runtime.compiler import compile_model

    if isinstance(args.detach_reset, str):  # (--detach-reset v,a: those states' resets)
        args.detach_reset = tuple(n.strip() for n in args.detach_reset.split(",") if n.strip()) or True
    given = args.file
    kind, args.file = cli_files.file_kind(args.file)
    if kind == "nir":
        return _show_nir(args)
    if args.dt is not None:
        raise FlexDSLError("--dt applies to NIR files (.nir) only", CMDLINE)
    if kind == "layer":
        no_options(_options(args), args.file)
        return _show_layer(args)
    if kind == "rule":
        opts = _options(args)
        cli_files.no_show_options(given, opts, args.what, args.detach_reset)
        return show_rule(args.file, opts.learnable)
    c = compile_model(args.file, detach_reset=args.detach_reset, options=_options(args))
    _show_compiled(c, args.what or backends.REFERENCE)
    return 0


def _show_layer(args: argparse.Namespace) -> int:
    """A layer: its text and plan (default), or its neuron's code and equations (`--what`)."""
    from .runtime.layer import describe

    layer, plan = describe(args.file)
    if args.what is None:
        print(layer.ast.source, end="" if layer.ast.source.endswith("\n") else "\n")
        print(f"# the plan of layer {plan.name}: per step, and the derived gradients")
        print("\n".join(plan.equations))
        return 0
    from .runtime.compiler import compile_text

    ck = layer.neuron
    _show_compiled(compile_text(ck.ast.source, ck.ast.filename, args.detach_reset), args.what)
    return 0


def _show_nir(args: argparse.Namespace) -> int:
    """Each neuron node of a NIR file: its generated `.neuron` text (default) or code."""
    from . import nir

    opts = _options(args)
    net = nir.load(args.file, dt=args.dt, backend=backends.REFERENCE, detach_reset=args.detach_reset, surrogate=opts.surrogate,
                   learnable=() if opts.learnable is None else opts.learnable)
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
    if what in backends.names():  # (a backend's generated source: `--backend NAME` or `--NAME`)
        print(c.source(what), end="")
    elif what == "equations":
        print(_format_equations(c, backward=False))
    elif what == "backward":
        print(_format_equations(c, backward=True))
    elif what == "neuron":
        print(c.text, end="")
    elif what == "eprop":
        print(_format_eprop(c))


def _format_eprop(c) -> str:
    """e-prop's eligibility of the model's first input, derived from its step (ir/eprop.py)."""
    from .ir.eprop import describe

    return describe(c.step, c.name, c.filename)


def _format_equations(c, backward: bool) -> str:
    import sympy as sp

    step = c.step
    lines = [f"# neuron {c.name} ({c.filename})"]
    if step.method:
        lines.append(f"# integration: {step.method}" + (" (chosen automatically)" if step.method_auto else ""))
    lines.append(f"# inputs: {', '.join(s.name for s in step.inputs)}; states: {', '.join(s.name for s in step.states)}")
    if not backward:
        lines += [f"# computed once per call from the params: {d.describe()}" for d in step.matrix_exps]
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


# ----------------------------------------------------------------------------- run
INPUT_HELP = "use a number (`--input 1.5`) or a step `step:AMPLITUDE@STEP` (`--input step:1.5@20`)"


def _parse_input(spec: str, T: int):
    """`--input`: a constant (`1.5`) or a step (`step:1.5@20`: 0 before step 20, then 1.5)."""
    import torch

    def bad(why: str = "") -> FlexDSLError:
        return FlexDSLError(f"bad --input `{spec}`" + (f": {why}" if why else ""), CMDLINE, hint=INPUT_HELP)

    try:
        if spec.startswith("step:"):
            amp_s, sep, at_s = spec[5:].partition("@")
            amp = read_number(amp_s)
            at = _steps(at_s) if sep else 0
        else:
            amp, at = read_number(spec), 0
    except ValueError:
        try:
            nonfinite = not math.isfinite(float(spec.removeprefix("step:").partition("@")[0]))
        except ValueError:
            nonfinite = False
        raise bad("the amplitude must be a finite number" if nonfinite else "") from None
    if not math.isfinite(amp):
        raise bad("the amplitude must be a finite number")
    if at < 0:
        raise bad("the step starts at a step >= 0")
    if at >= T:
        raise bad(f"the step starts at step {at}, after the last step ({T - 1}); raise --T or start it earlier")
    x = torch.zeros(T, dtype=torch.float64)
    x[at:] = amp
    return x


def read_number(text: str) -> float:
    """A number as the language writes it (ASCII digits; float() also reads `３.5`, `1_0`)."""
    from .frontend.parse import read_number as read

    return read(text)


def _number_arg(text: str) -> float:
    try:
        return read_number(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def _steps(text: str) -> int:
    """A whole number as the command line takes it: ASCII digits, a sign (int() also reads `٣`)."""
    t = text.strip()
    digits = t[1:] if t[:1] in "+-" else t
    if not digits.isascii() or not digits.isdigit():
        raise ValueError(f"not a number of steps: {text!r}")
    return int(t)


def _steps_arg(text: str) -> int:
    try:
        return _steps(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of steps: {text!r} (digits 0-9)") from None


def _plot_target(path: str) -> Path:
    """The --plot file, checked before simulating: a known image format, an existing folder."""
    from .docs.plots import plot_path_problem

    problem = plot_path_problem(path)
    if problem is not None:
        raise FlexDSLError(f"cannot write a plot to `{path}`: {problem[0]}", CMDLINE, hint=problem[1])
    return Path(path)


# `flexdsl run` steps the torch backend in float64 from Python, keeping every state's trace:
# at most this many steps, and at most WORK_BUDGET statements of the step in all (T times the
# statements of one step), so that a run takes seconds and hundreds of MB, not minutes and GBs
# (Hodgkin-Huxley, 51 statements: 39,000 steps; LIF: the full 100,000)
MAX_RUN_STEPS = 100_000
WORK_BUDGET = 2_000_000


def _cmd_run(args: argparse.Namespace) -> int:
    import torch

    from .api import load

    if args.T < 1:
        raise FlexDSLError(f"--T must be a positive number of steps, not {args.T}", CMDLINE, hint="e.g. --T 200")
    if args.T > MAX_RUN_STEPS:
        raise FlexDSLError(f"--T {args.T} is more steps than `flexdsl run` simulates (at most {MAX_RUN_STEPS:,})",
                           CMDLINE, hint="for longer runs, call the module from Python in chunks of steps (its "
                                         "states carry over between calls)")
    cli_files.runnable(args.file)
    plot = _plot_target(args.plot) if args.plot is not None else None
    overrides = {}
    for kv in args.param or []:
        k, eq, v = kv.partition("=")
        if not eq or not k or not v.strip():
            raise FlexDSLError(f"bad --param `{kv}`", CMDLINE, hint="use NAME=VALUE, e.g. --param tau=3.0")
        try:
            overrides[k.strip()] = read_number(v)
        except ValueError:
            overrides[k.strip()] = v  # a value with a unit, `tau=20 ms` (the model converts it)
    T = args.T
    x = _parse_input(args.input, T).reshape(T, 1)
    opts = _options(args)
    m = load(args.file, backend=backends.REFERENCE, store_state_seqs=True, check_finite=args.check_finite,
             surrogate=opts.surrogate, learnable=opts.learnable, **overrides).to(torch.float64)
    c = m.compiled
    work = sum(1 for line in c.source(backends.REFERENCE).splitlines() if " = " in line and not line.lstrip().startswith("#"))
    if T * max(work, 1) > WORK_BUDGET:
        raise FlexDSLError(f"--T {T} is more steps of {c.name} than `flexdsl run` simulates (at most "
                           f"{WORK_BUDGET // max(work, 1):,}: its step has {work} statements)", CMDLINE,
                           hint="for longer runs, call the module from Python in chunks of steps (its states "
                                "carry over between calls)")
    overrides = {k: getattr(m, k) for k in overrides}  # numbers in the declared units
    from .docs.simulate import param_defaults, run_module, time_axis

    run = run_module(m, x, overrides, seed=args.seed)
    n_in = len(c.checked.inputs)
    from .docs.units import unit_label

    unit = unit_label(c.checked.inputs[0]) if n_in else None
    print(f"neuron {c.name} ({c.filename}): {T} steps, input {args.input}"
          + (f" on `{c.checked.inputs[0].name}`" if n_in else "")
          + (f" (in {unit}, the input's unit)" if unit else ""))
    for n in (n for n, _ in c.checked.outputs):
        o = run.outputs[n]
        if n == "spike":
            k = int(o.sum().item())
            steps = [int(i) for i in torch.nonzero(o[:, 0]).flatten()[:10]]
            more = " ..." if k > 10 else ""
            print(f"spikes: {k} ({k / T:.3f} per step) at steps {steps}{more}")
        else:
            print(f"output {n}: final {o[-1, 0].item():.6g}, min {o.min().item():.6g}, max {o.max().item():.6g}")
    for s in c.checked.states:
        if s.meta.get("hidden"):  # the bookkeeping of refractoriness and crossing rules
            continue
        v = run.states[s.name][-1, 0]
        unit = c.checked.units.unit.get(s.name, "1") if c.checked.units is not None else "1"
        print(f"state {s.name}: final {v.item():.6g}" + (f" {unit}" if unit != "1" else "")
              + (f"  ({s.doc})" if s.doc else ""))
    if plot is not None:
        from .docs.plots import response_figure

        tm = time_axis(c, param_defaults(c, overrides))
        try:
            response_figure(c, run, 0, tm, plot, title=f"{c.name}: input {args.input}")
        except OSError as e:
            raise FlexDSLError(f"cannot write the plot `{plot}`: {e.strerror or e}", CMDLINE) from None
        except (ValueError, RuntimeError) as e:  # a format matplotlib lists but cannot write here
            raise FlexDSLError(f"cannot write the plot `{plot}`: {e}", CMDLINE) from None
        print(f"plot written to {plot}")
    return 0


# ----------------------------------------------------------------------------- doc
class _Progress:
    """One line per model on stderr: a bar, the count, the model, its time."""

    def __init__(self, width: int = 24) -> None:
        self.width = width

    def __call__(self, done: int, total: int, label: str, seconds: float) -> None:
        fill = round(self.width * done / max(total, 1))
        bar = "#" * fill + "-" * (self.width - fill)
        print(f"[{bar}] {done:>{len(str(total))}}/{total} {label} ({seconds:.1f} s)", file=sys.stderr, flush=True)


def _cmd_doc(args: argparse.Namespace) -> int:
    from ._paths import DOCS_DIR
    from .docs.sitebuild import build, expand

    out = Path(args.out)
    try:
        if out.resolve() == DOCS_DIR.resolve():
            raise FlexDSLError(f"`{args.out}` holds flexdsl's own documentation; write the pages elsewhere",
                               CMDLINE, hint="e.g. -o site")
    except OSError:
        pass
    targets = expand(args.paths)
    print(f"documenting {len(targets)} model{'s' if len(targets) != 1 else ''} into {out}/", file=sys.stderr)
    res = build(targets, out, plots=not args.no_plots, progress=_Progress(), title=args.title, options=_options(args))
    for _, e in res.failed:
        print(e, file=sys.stderr)
    n = len(res.pages)
    print(f"wrote {n} page{'s' if n != 1 else ''} (HTML and Markdown) in {res.seconds:.1f} s; open {res.index}")
    if res.failed:
        print(f"{len(res.failed)} model(s) not documented: " + ", ".join(lb for lb, _ in res.failed), file=sys.stderr)
        return 1
    return 0


# ----------------------------------------------------------------------------- parser
def _language_reference() -> str:
    from ._paths import LANGUAGE_REFERENCE

    return str(LANGUAGE_REFERENCE)


class _Formatter(argparse.RawDescriptionHelpFormatter):
    pass


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    p = argparse.ArgumentParser(
        prog="flexdsl", formatter_class=_Formatter,
        description="Spiking neurons from equations: check, inspect, simulate and document `.neuron` models.",
        epilog="A MODEL is a path to a .neuron file or the name of a packaged model (`lif`, `adex`, ...;\n"
               "python -c 'import flexdsl; print(flexdsl.library())' lists them).\n"
               f"The language reference: {_language_reference()}\n"
               "Run `flexdsl COMMAND --help` for a command's options and examples.")
    p.add_argument("--version", action="version", version=f"flexdsl {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for add in (_add_check, _add_show, _add_run, _add_doc):
        add(sub)
    return p


def _add_check(sub) -> None:
    c = sub.add_parser("check", help="validate .neuron files (exit 1 with located errors)", formatter_class=_Formatter,
                       description="Parse, check and lower each model; print `ok` or its located errors.\n"
                                   "Exits 1 if any model has an error.",
                       epilog="examples:\n  flexdsl check my_lif.neuron\n  flexdsl check models/          "
                              "# every .neuron, .layer and .rule file below models/\n  flexdsl check neurons/*.neuron lif")
    c.add_argument("files", nargs="+", metavar="FILE_OR_DIR",
                   help="a .neuron, .layer or .rule file, a library model's, rule's or layer's name, or a directory "
                        "(every such file below it)")
    _add_options(c)
    c.set_defaults(fn=_cmd_check)


def _title(name: str) -> str:
    """What `flexdsl show --NAME` prints (the backend's `title`)."""
    return getattr(backends.get(name), "title", f"the {name} backend's generated code")


def _add_show(sub) -> None:
    s = sub.add_parser("show", help="print the generated code or the derived equations (of a .neuron, or of "
                       "each neuron of a .nir graph)", formatter_class=_Formatter,
                       description="Print what flexdsl generates for a model (default: the PyTorch core), or for\n"
                                   "each neuron node of a NIR graph (default: its generated .neuron text).",
                       epilog="examples:\n  flexdsl show lif                  # the generated PyTorch core\n"
                              + "".join(f"  {'flexdsl show lif --' + n:<34}# {_title(n)}\n" for n in backends.names()
                                        if n != backends.REFERENCE)
                              + "  flexdsl show adex --equations     # the discretized step (sympy)\n"
                              "  flexdsl show adex --backward      # the derived vector-Jacobian product\n"
                              "  flexdsl show lif --surrogate 'atan(alpha=2.0)' --learnable tau   # shaped at load\n"
                              "  flexdsl show rlif.layer           # a layer: its text and plan (derived gradients)\n"
                              "  flexdsl show net.nir              # the .neuron text of each neuron of a NIR graph\n"
                              f"  flexdsl show net.nir --{backends.REFERENCE} --dt 1e-4")
    s.add_argument("file", metavar="MODEL", help="a .neuron file, a library model's, rule's or layer's name, a .layer, "
                   ".rule or .nir file")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--backend", dest="what", metavar="NAME", choices=backends.names(),
                   help="the code a backend generates (" + ", ".join(backends.names()) + "; default: "
                   + backends.REFERENCE + ")")
    for name in backends.names():  # (--NAME: the same as --backend NAME)
        g.add_argument(f"--{name}", dest="what", action="store_const", const=name,
                       help=_title(name)
                       + (" (the default for a model)" if name == backends.REFERENCE else ""))
    g.add_argument("--equations", dest="what", action="store_const", const="equations",
                   help="the discretized step as sympy assignments, with the integration method")
    g.add_argument("--backward", dest="what", action="store_const", const="backward",
                   help="the derived backward (vector-Jacobian product) of one step")
    g.add_argument("--neuron", dest="what", action="store_const", const="neuron",
                   help="the model's .neuron text (the default for a .nir file)")
    g.add_argument("--eprop", dest="what", action="store_const", const="eprop",
                   help="e-prop's eligibility, derived from the step (recurrent(..., learning='eprop'))")
    s.add_argument("--detach-reset", nargs="?", const=True, default=False, metavar="STATES",
                   help="compile with the spike detached in the reset (as load(..., detach_reset=True)); "
                        "STATES (e.g. v, or v,a): only those states' resets")
    s.add_argument("--dt", type=_number_arg, help="for a .nir file: the step, in the graph's time unit "
                   "(default: the one flexdsl.nir.export recorded)")
    _add_options(s)
    s.set_defaults(fn=_cmd_show)


def _add_run(sub) -> None:
    r = sub.add_parser("run", help="simulate one neuron, print a summary, optionally plot it", formatter_class=_Formatter,
                       description="Simulate a model for T steps (torch backend, float64) with the input on its first\n"
                                   "input (the others 0); print the spikes and final states; optionally plot the input,\n"
                                   "every state (with the threshold) and the spikes, against time in the model's unit\n"
                                   "where it declares `dt` with one (else in steps).",
                       epilog="input formats (--input):\n"
                              "  1.5            a constant input of 1.5 at every step\n"
                              "  step:1.5@20    0 before step 20, then 1.5 (steps count from 0)\n"
                              "  step:1.5       1.5 from step 0 (the same as 1.5)\n\n"
                              "examples:\n  flexdsl run lif --T 100 --input step:1.5@20 --plot lif.png\n"
                              "  flexdsl run adex --T 2000 --input step:800@200 --param b=0 --plot adex.svg\n"
                              "  flexdsl run my_model.neuron --input 0.8")
    r.add_argument("file", metavar="MODEL", help="a .neuron file or a library model name")
    r.add_argument("--T", type=_steps_arg, default=200, metavar="STEPS", help="number of steps to simulate (default 200)")
    r.add_argument("--input", default="1.5", metavar="SPEC",
                   help="the input: a number, or step:AMPLITUDE@STEP (see below; default 1.5)")
    r.add_argument("--param", action="append", metavar="NAME=VALUE",
                   help="override a param (repeatable; `where` constraints are checked), e.g. --param tau=3")
    r.add_argument("--plot", metavar="OUT.png",
                   help="write a plot; the extension picks the format (.png, .svg, .pdf, ...)")
    r.add_argument("--check-finite", action="store_true",
                   help="stop with an error at the first NaN or inf, naming the state, the step and the element")
    _add_options(r)
    r.add_argument("--seed", type=int, default=None, metavar="N",
                   help="the seed of a noisy model's draws (default: the docs' fixed seed, so a run repeats)")
    r.set_defaults(fn=_cmd_run)


def _add_doc(sub) -> None:
    d = sub.add_parser("doc", help="HTML and Markdown pages generated from the equations", formatter_class=_Formatter,
                       description="For each model: an HTML page and a Markdown page with its docstring and reference,\n"
                                   "tables of inputs, params and states, the equations as written and as derived\n"
                                   "(the discretized step, the backward), plots (surrogate, step response, f-I curve)\n"
                                   "and the generated code; then index.html / index.md linking them, and a copy of the\n"
                                   "language reference. Math is MathML: the pages need no network and no script.",
                       epilog="examples:\n  flexdsl doc neurons/ -o site          # the packaged library; open site/index.html\n"
                              "  flexdsl doc lif adex -o site           # library models by name\n"
                              "  flexdsl doc my_model.neuron -o out --no-plots")
    d.add_argument("paths", nargs="+", metavar="FILE_OR_DIR_OR_STEM",
                   help="a .neuron, .layer or .rule file, a directory (every such file below it) or a library model name")
    d.add_argument("-o", "--out", default="flexdsl-docs", metavar="OUTDIR",
                   help="the output directory, created if missing (default: flexdsl-docs)")
    d.add_argument("--no-plots", action="store_true", help="skip the simulations and plots (faster)")
    d.add_argument("--title", default="flexdsl models", help="the title of the index page")
    _add_options(d)
    d.set_defaults(fn=_cmd_doc)


class _Printable:
    """A text stream writing control characters as escapes: file names, node names and
    arguments echoed by the CLI (or by argparse) never reach the terminal as escape sequences."""

    def __init__(self, raw) -> None:
        self.raw = raw

    def write(self, s: str) -> int:
        self.raw.write(printable(s))
        return len(s)

    def __getattr__(self, name: str):
        return getattr(self.raw, name)


def main(argv: Sequence[str] | None = None) -> int:
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Printable(out), _Printable(err)
    try:
        return _main(argv)
    finally:
        if isinstance(sys.stdout, _Printable):  # (a broken pipe leaves devnull there)
            sys.stdout = out
        if isinstance(sys.stderr, _Printable):
            sys.stderr = err


def _main(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args) or 0)
    except FlexDSLError as e:
        print(e, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `flexdsl show lif | head`
        try:
            sys.stdout = open(__import__("os").devnull, "w")  # noqa: SIM115 - silence the flush at exit
        except OSError:
            pass
        return 0
    except OSError as e:
        print(f"{getattr(e, 'filename', None) or CMDLINE}: error: {e.strerror or e}", file=sys.stderr)
        return 1
    except MemoryError:
        print(f"{CMDLINE}: error: out of memory (try a smaller --T)", file=sys.stderr)
        return 1
    except RuntimeError as e:  # torch's allocator says "can't allocate memory" as a RuntimeError
        if "allocate" not in str(e) and "out of memory" not in str(e):
            raise
        print(f"{CMDLINE}: error: out of memory (try a smaller --T)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
