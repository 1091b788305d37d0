"""`flexdsl check` and `flexdsl show` of the files that are not neuron models: layers (`.layer`) and
plasticity rules (`.rule`). Each prints what the command shows, or the located error."""

from __future__ import annotations

import sys
from typing import Any

from .errors import FlexDSLError

CMDLINE = "<command line>"  # (where an error in the command's own arguments is located)


def file_kind(arg: str) -> tuple[str, str]:
    """(kind, file) of a command's model argument: kind `nir`, `layer`, `rule` or `neuron`, by the file's
    suffix or, for a library rule or layer named without a file (`stdp_additive`, `rlif`, as `flexdsl doc`
    takes them), by the library's; file: what to load (the library's file for those)."""
    from .library import library_file

    lib = library_file(str(arg))
    path = str(lib) if lib is not None else str(arg)
    kind = next((k for k in ("nir", "layer", "rule") if path.endswith("." + k)), "neuron")
    return kind, path


def no_show_options(f: str, opts: Any, what: str | None, detach_reset: Any) -> None:
    """`show` of a rule prints the rule's generated module: a load option it does not take (`no_options`) and
    an option that picks what a neuron model shows (`--equations`, `--backward`, a backend, `--neuron`,
    `--eprop`, `--detach-reset`) are errors, never silently ignored (it printed the same module)."""
    no_options(opts, f, rule=True)
    given = ([f"--{what}"] if what else []) + (["--detach-reset"] if detach_reset is not False else [])
    if given:
        verb = "apply" if len(given) > 1 else "applies"
        raise FlexDSLError(f"{' and '.join(given)} {verb} to neuron models and layers, not to a plasticity rule: "
                           "`flexdsl show` of a rule prints its generated module (the step, where each state "
                           "lives, the window's change)", CMDLINE,
                           hint=f"leave {' and '.join(given)} out for `{f}` (`--learnable NAMES` adds the derived "
                                "backward of its constants)")


def runnable(f: str) -> None:
    """`flexdsl run` of a layer or a rule is an error that says `run` simulates one neuron model (a layer's
    error was about options the user never gave: `store_state_seqs, check_finite and surrogate_function`)."""
    kind, _ = file_kind(f)
    if kind == "layer":
        raise FlexDSLError(f"`flexdsl run` simulates a neuron model; `{f}` is a layer", f,
                           hint=f"run a layer from Python: `m = flexdsl.load({f!r})` (with the sizes the file "
                                "leaves open, e.g. hidden=, in_features=), then `m(x)`, x of shape (T, batch, "
                                "inputs); `flexdsl show` prints its plan, `flexdsl run NEURON` runs its neuron")
    if kind == "rule":
        raise FlexDSLError(f"`flexdsl run` simulates a neuron model; `{f}` is a plasticity rule", f,
                           hint="a rule runs on a layer's synapses (`rule NAME` in a synapses block) or from "
                                f"Python: `flexdsl.load_rule({f!r}).window(pre, post, w)`; `flexdsl show` prints it")


def check_layer(f: str) -> int:
    from .runtime.layer import describe

    try:
        layer, plan = describe(f)
    except FlexDSLError as e:
        print(e, file=sys.stderr)
        return 1
    kind = "recurrent" if plan.scan is not None else "feed-forward"
    print(f"{f}: ok — layer {layer.name} ({kind}; neuron {layer.neuron.name}, {len(layer.inputs)} input(s), "
          f"{len(layer.synapses)} synapse group(s))")
    return 0


def check_rule(f: str, learnable: Any = None) -> int:
    from .runtime.rule import load_rule

    try:
        rule = load_rule(f, learnable=learnable)
        rule.bounds()
    except FlexDSLError as e:
        print(e, file=sys.stderr)
        return 1
    sides = ", ".join(f"{s} {side}" for s, side in rule.sides.items() if s != rule.weight_name)
    how = "its window as products" if rule.separable else "per synapse"
    print(f"{f}: ok — rule {rule.name} ({len(rule.ir.checked.params)} param(s); states: {sides or 'none'}; {how})")
    return 0


def show_rule(path: str, learnable: Any = None) -> int:
    """A rule: its generated torch module (the step, its sides, the window's terms); `learnable`:
    the constants to train instead of the file's (`--learnable`), whose derived backward it prints."""
    from .runtime.rule import load_rule

    ir = load_rule(path, learnable).ir  # (a rule's load checks too: what `check` and `load_rule` refuse)
    _, meta = ir.generated()
    print(ir.source(), end="")
    sides = ", ".join(f"{s}: {side}" for s, side in meta["sides"].items())
    print(f"# where each state lives: {sides}")
    print("# the window's change: " + (" + ".join(f"({c}) * ({a}) x ({b})" for c, a, b in meta["terms_text"])
                                       if meta["separable"] else "per synapse (it does not factor)"))
    learnable = [p.name for p in ir.checked.params if p.learnable]
    if learnable:  # (the step's backward, derived symbolically as a neuron's; the runtime's gradient equals it)
        print(f"\n# the step's vector-Jacobian product into the learnable constants ({', '.join(learnable)}),")
        print("# derived symbolically as a neuron's: per synapse, the gradient a loss on later weights sends")
        print("# back through one step (the gradient a call computes chains it over its steps)")
        print(ir.backward_source.strip("\n"))
    return 0


def no_options(opts: Any, f: Any, rule: bool = False, note: bool = False) -> None:
    """A load-time option that a file other than a neuron model does not take is never silently
    ignored: a rule takes `--learnable` (its constants), not `--surrogate` (it has no spike); a layer
    file neither (shown and checked as written). `show` of such a file is an error; `check` of
    several files (a directory) says so in a line and checks the file as it is (`note`)."""
    bad = ["--surrogate"] if opts.surrogate is not None else []
    if opts.learnable is not None and not rule:
        bad.append("--learnable")
    if bad:
        what = "a plasticity rule has no spike to take a surrogate" if rule else \
            "a layer file is shown and checked as it is written"
        verb = "apply" if len(bad) > 1 else "applies"
        msg = f"{' and '.join(bad)} {verb} to neuron models: {what}"
        if note:
            print(f"{f}: note: {msg}; checked without {'it' if len(bad) == 1 else 'them'}", file=sys.stderr)
            return
        raise FlexDSLError(msg, CMDLINE, hint=f"leave {' and '.join(bad)} out for `{f}`")


__all__ = ["CMDLINE", "check_layer", "check_rule", "file_kind", "no_options", "no_show_options", "runnable",
           "show_rule"]
