"""The generated sections of the language reference (`docs/language.md`): the tables of
functions, random draws, constants, surrogates (keyword defaults, S'(x) rendered from its sympy form), the
SpikingJelly and snnTorch surrogate objects the load option `surrogate=` maps (`runtime/options.py`),
integration methods, the reserved words, the names taken by the torch module, the size limits and
the grammar, all read from the code (`frontend/catalog.py`, `ir/surrogates.py`, `frontend/parse.py`,
`ir/lower.py`, `grammar/neuron.lark`), so that the reference cannot drift from it.

A generated section sits between `<!-- BEGIN GENERATED: name -->` and `<!-- END GENERATED: name -->`;
the text around it is written by hand.

    python -m flexdsl.docs.reference            # rewrite the sections of docs/language.md in place
    python -m flexdsl.docs.reference --check    # exit 1 if the file differs from the registries
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from .._paths import GRAMMAR_DIR, LANGUAGE_REFERENCE
from ..frontend.catalog import CONSTANTS, FUNCTIONS, METHODS, SURROGATES

COMMAND = "python -m flexdsl.docs.reference"
_SECTION = re.compile(r"(<!-- BEGIN GENERATED: (?P<name>[a-z_]+) [^>]*-->\n)(?P<body>.*?)(<!-- END GENERATED: (?P=name) -->)",
                      re.S)


def _cell(s: str) -> str:
    return s.replace("|", "\\|")


def signature(name: str) -> str:
    """`clip(x, lo, hi)`: from the record's doc where it starts with the call, else by arity."""
    f = FUNCTIONS[name]
    m = re.match(rf"{re.escape(name)}\(([^)]*)\)", f.doc)
    if m:
        return f"{name}({m.group(1)})"
    args = {1: "x", 2: "a, b", 3: "x, y, z"}.get(f.arity, ", ".join(f"x{i}" for i in range(f.arity)))
    return f"{name}({args})"


def functions() -> str:
    rows = ["| function | meaning |", "| --- | --- |"]
    for name, f in FUNCTIONS.items():
        doc = re.sub(rf"^{re.escape(name)}\([^)]*\):\s*", "", f.doc)
        rows.append(f"| `{signature(name)}` | {_cell(doc)} |")
    return "\n".join(rows)


def draws() -> str:
    from ..frontend.catalog import DRAWS

    rows = ["| draw | value |", "| --- | --- |"]
    rows += [f"| `{d.name}()` | {_cell(d.doc)} |" for d in DRAWS.values()]
    return "\n".join(rows)


def constants() -> str:
    rows = ["| constant | value |", "| --- | --- |"]
    rows += [f"| `{k}` | {v!r} |" for k, v in CONSTANTS.items()]
    return "\n".join(rows)


def surrogate_call(name: str) -> str:
    s = SURROGATES[name]
    return f"{name}(" + ", ".join(f"{k}={v!r}" for k, v in s.defaults.items()) + ")"


def surrogate_latex(name: str) -> str:
    """S'(x) of a built-in surrogate as LaTeX, keywords as symbols."""
    import sympy as sp

    from ..ir.surrogates import BUILTIN_SURROGATES
    from .printing import latex

    s = BUILTIN_SURROGATES[name]
    x = sp.Symbol("x", real=True)
    expr = s.derivative(x, **{k: sp.Symbol(k, real=True) for k in s.defaults})
    return latex(expr).replace("<", r"\lt ").replace(">", r"\gt ")


def surrogate_mathml(name: str) -> str:
    """S'(x) of a built-in surrogate as a `<math>` element (the HTML guide shows it)."""
    import sympy as sp

    from ..ir.surrogates import BUILTIN_SURROGATES
    from .printing import mathml

    s = BUILTIN_SURROGATES[name]
    x = sp.Symbol("x", real=True)
    return mathml(s.derivative(x, **{k: sp.Symbol(k, real=True) for k in s.defaults}))


def surrogates() -> str:
    rows = ["| surrogate (keyword defaults) | S'(x) | as text | from |", "| --- | --- | --- | --- |"]
    for name, s in SURROGATES.items():
        rows.append(f"| `{surrogate_call(name)}` | ${surrogate_latex(name)}$ | `{_cell(s.doc)}` | {_cell(s.source)} |")
    return "\n".join(rows)


def surrogate_objects() -> str:
    """The SpikingJelly and snnTorch surrogate objects `surrogate=` takes, and what each becomes."""
    from ..runtime.options import SNNTORCH, SNNTORCH_DEFINED, SPIKINGJELLY, SPIKINGJELLY_DEFINED

    rows = ["| given as `surrogate=` | becomes |", "| --- | --- |"]
    for cls, (name, kw) in SPIKINGJELLY.items():
        if cls == "PiecewiseLeakyReLU":
            continue
        args = ", ".join(f"{v}={k}" for k, v in kw.items())
        rows.append(f"| SpikingJelly `surrogate.{cls}(" + ", ".join(kw) + f")` | `{name}({args})` |")
    rows.append("| SpikingJelly `surrogate.PiecewiseLeakyReLU(w, c)` with `c = 0` | `rect(alpha=1/(2*w))` |")
    for cls, text in SPIKINGJELLY_DEFINED.items():
        params = re.findall(r"(\w+)=\{\w+\}", text)
        shown = re.sub(r"=\{\w+\}", "", text).replace(
            "{series}", "4/T_period*(cos(1*(2*pi/T_period)*x) + ... + cos((2n-3)*(2*pi/T_period)*x))")
        rows.append(f"| SpikingJelly `surrogate.{cls}(" + ", ".join(["n", *params] if "series" in text else params)
                    + f")` | the user surrogate `surrogate {_cell(shown)}` |")
    for fn, (name, kw) in SNNTORCH.items():
        args = ", ".join(f"{v}={k}" for k, v in kw.items())
        rows.append(f"| snnTorch `surrogate.{fn}(" + ", ".join(kw) + f")` | `{name}({args})` |")
    for fn, text in SNNTORCH_DEFINED.items():
        params = re.findall(r"(\w+)=\{\w+\}", text)
        shown = _cell(re.sub(r"=\{\w+\}", "", text))
        rows.append(f"| snnTorch `surrogate.{fn}(" + ", ".join(params) + f")` | the user surrogate `surrogate {shown}` |")
    return "\n".join(rows)


def methods() -> str:
    rows = ["| method | also called | what one step computes |", "| --- | --- | --- |"]
    for name, m in METHODS.items():
        aliases = ", ".join(f"`{a}`" for a in m.aliases)
        rows.append(f"| `{name}` | {aliases} | {_cell(m.doc)} |")
    return "\n".join(rows)


def reserved() -> str:
    from ..frontend.parse import RESERVED

    return " ".join(f"`{w}`" for w in sorted(RESERVED))


def module_attributes() -> str:
    from ..frontend.catalog import MODULE_ATTRIBUTES

    return " ".join(f"`{w}`" for w in sorted(MODULE_ATTRIBUTES, key=str.lower))


def limits() -> str:
    from ..frontend.parse import MAX_DEPTH, MAX_LINE, MAX_SOURCE
    from ..ir.lower import MAX_EXPONENT

    return "\n".join([
        "| limit | value |", "| --- | --- |",
        f"| characters of model text | {MAX_SOURCE:,} |",
        f"| characters of one line | {MAX_LINE:,} |",
        f"| nesting depth of an expression (calls, parentheses, powers, unary minus) | {MAX_DEPTH} |",
        f"| a constant exponent of a non-constant base (`x ** n`) | {MAX_EXPONENT} |",
    ])


def grammar() -> str:
    text = (GRAMMAR_DIR / "neuron.lark").read_text(encoding="utf-8").rstrip()
    return "```lark\n" + text + "\n```"


SECTIONS: dict[str, Callable[[], str]] = {
    "functions": functions, "draws": draws, "constants": constants, "surrogates": surrogates,
    "surrogate_objects": surrogate_objects, "methods": methods,
    "reserved": reserved, "module_attributes": module_attributes, "limits": limits, "grammar": grammar,
}


def regenerate(text: str) -> str:
    """`text` with every generated section rewritten from the registries."""
    found: set[str] = set()

    def repl(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in SECTIONS:
            raise ValueError(f"unknown generated section `{name}`")
        found.add(name)
        return m.group(1) + SECTIONS[name]() + "\n" + m.group(4)

    out = _SECTION.sub(repl, text)
    missing = set(SECTIONS) - found
    if missing:
        raise ValueError("the reference lacks the generated section(s): " + ", ".join(sorted(missing))
                         + f" (add `<!-- BEGIN GENERATED: NAME ({COMMAND}) -->` … `<!-- END GENERATED: NAME -->`)")
    return out


def sections(text: str) -> dict[str, str]:
    """The bodies of the generated sections of `text`, by name."""
    return {m.group("name"): m.group("body") for m in _SECTION.finditer(text)}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=COMMAND, description="Regenerate the tables of the language reference.")
    p.add_argument("path", nargs="?", default=str(LANGUAGE_REFERENCE), help="the reference (default: %(default)s)")
    p.add_argument("--check", action="store_true", help="only check; exit 1 if the file is out of date")
    args = p.parse_args(argv)
    path = Path(args.path)
    text = path.read_text(encoding="utf-8")
    new = regenerate(text)
    if args.check:
        if new != text:
            print(f"{path}: the generated sections are out of date; run `{COMMAND}`", file=sys.stderr)
            return 1
        print(f"{path}: up to date")
        return 0
    if new != text:
        path.write_text(new, encoding="utf-8")
        print(f"{path}: regenerated")
    else:
        print(f"{path}: up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
