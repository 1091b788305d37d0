"""Load-time options: what a model is shaped into where it is used, without editing its file.

`LoadOptions` holds what `flexdsl.load(..., surrogate=..., learnable=...)` (and the CLI's
`--surrogate`, `--learnable`, `flexdsl.nir.load`, `flexdsl.recurrent`) chose, as plain data: the
surrogate as text (`"atan(alpha=2.0)"`, checked like the model's own spike rule, or a definition
`"name(x, k=v) = expr"` as a model declares one) and the params to train (None: as the file says; True/False: all/none; or names). They change the compiled model, so
`key()` is part of every cache key made from it.

`apply(neuron, options)` gives the parsed model with the options in place (a new AST; the parsed one
is left alone): the spike rule's surrogate replaced, each param's `learnable` flag set. Errors in the
surrogate text are located in that text: its nodes carry negative line numbers (no model line is
negative), and `relocate` turns an error at such a position into one at `<load option>:1:COL`, quoting
`surrogate=TEXT` with a caret, whichever stage raised it (parse, check, units, lowering).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..errors import FlexDSLError, did_you_mean
from . import ast as A

OPTION_FILE = "<load option>"
SURROGATE_PREFIX = "surrogate="  # how an error quotes the option (as long as the parser's "surrogate ")
MAX_OPTION_TEXT = 4000


@dataclass(frozen=True)
class LoadOptions:
    """What was chosen at load. `surrogate`: the spike rule's surrogate as text (None: the
    model's); `learnable`: None (as written), True/False (every param/none) or the names of
    the params to train (every other param is then not learnable); `origin`: how the surrogate
    was given when it was not text (e.g. SpikingJelly's `ATan(alpha=2.0)`), for the notes."""

    surrogate: str | None = None
    learnable: bool | tuple[str, ...] | None = None
    origin: str = ""

    def key(self) -> str:
        """The options as a cache-key part ("" when nothing was chosen)."""
        if self.surrogate is None and self.learnable is None:
            return ""
        learn = ("all" if self.learnable else "none") if isinstance(self.learnable, bool) else \
            ",".join(self.learnable) if self.learnable is not None else "as written"
        return f"surrogate={self.surrogate or ''};learnable={learn}"

    def __bool__(self) -> bool:
        return self.surrogate is not None or self.learnable is not None

    def python_args(self) -> str:
        """The options as `flexdsl.load` keywords (`surrogate='atan(alpha=2.0)', learnable=['tau']`)."""
        out = [f"surrogate={self.surrogate!r}"] if self.surrogate is not None else []
        if self.learnable is not None:
            out.append(f"learnable={self.learnable if isinstance(self.learnable, bool) else list(self.learnable)!r}")
        return ", ".join(out)

    def cli_args(self) -> str:
        """The options as `flexdsl run` arguments (`--surrogate 'atan(alpha=2.0)' --learnable tau`)."""
        import shlex

        out = [f"--surrogate {shlex.quote(self.surrogate)}"] if self.surrogate is not None else []
        if self.learnable is not None:
            learn = ("all" if self.learnable else "none") if isinstance(self.learnable, bool) else \
                ",".join(self.learnable) or "none"
            out.append(f"--learnable {shlex.quote(learn)}")
        return " ".join(out)

    def learnable_text(self) -> str:
        if self.learnable is True:
            return "True (every param)"
        if self.learnable is False:
            return "False (no param)"
        names = self.learnable or ()
        return "[" + ", ".join(repr(n) for n in names) + "]"


NONE = LoadOptions()


# ---------------------------------------------------------------------------------- the surrogate text
def _negative(p: A.Pos) -> A.Pos:
    return A.Pos(-abs(p.line), p.column)


class _Relocate(A.ExprFold[A.Expr]):
    """An expression of the option text with every position on a negative line."""

    def visit_Num(self, e: A.Num) -> A.Expr:
        return dataclasses.replace(e, pos=_negative(e.pos))

    def visit_Quantity(self, e: A.Quantity) -> A.Expr:
        return dataclasses.replace(e, pos=_negative(e.pos), unit_pos=_negative(e.unit_pos))

    def visit_Name(self, e: A.Name) -> A.Expr:
        return dataclasses.replace(e, pos=_negative(e.pos))

    def visit_BinOp(self, e: A.BinOp, left: A.Expr, right: A.Expr) -> A.Expr:
        return dataclasses.replace(e, left=left, right=right, pos=_negative(e.pos))

    def visit_Neg(self, e: A.Neg, operand: A.Expr) -> A.Expr:
        return dataclasses.replace(e, operand=operand, pos=_negative(e.pos))

    def visit_Call(self, e: A.Call, *args: A.Expr) -> A.Expr:
        return dataclasses.replace(e, args=tuple(args), pos=_negative(e.pos))

    def visit_Compare(self, e: A.Compare, *operands: A.Expr) -> A.Expr:
        return dataclasses.replace(e, operands=tuple(operands), pos=_negative(e.pos))


def option_error(msg: str, text: str, column: int, hint: str | None = None) -> FlexDSLError:
    """An error located in the surrogate option's text (`column` counts `surrogate=` too)."""
    return FlexDSLError(msg, OPTION_FILE, 1, column, SURROGATE_PREFIX + text, hint)


def parse_surrogate(text: str) -> tuple[A.SurrogateUse, A.SurrogateDef | None]:
    """The surrogate option's text as the spike rule's `surrogate` clause and, for a definition
    (`name(x, k=v) = expr`), the user surrogate it declares (used with its defaults); positions
    on line -1 (see `relocate`)."""
    from .parse import parse_fragment

    if len(text) > MAX_OPTION_TEXT:
        raise option_error(f"the surrogate text is too long ({len(text):,} characters)", text[:80], 1)
    bad = next((i for i, ch in enumerate(text) if ch in "\n\r\x00#"), None)
    if bad is not None:
        raise option_error("the surrogate text is one line without comments", text.replace("\n", " "),
                           len(SURROGATE_PREFIX) + bad + 1, "e.g. surrogate=\"atan(alpha=2.0)\"")
    if not text.strip():
        raise option_error("the surrogate text is empty", text, len(SURROGATE_PREFIX) + 1,
                           "e.g. surrogate=\"atan(alpha=2.0)\" (a name alone takes its defaults: \"atan\")")
    parsed = parse_fragment(text, SURROGATE_PREFIX, OPTION_FILE)
    kwargs = [A.Kwarg(k.name, _Relocate().fold(k.value), _negative(k.pos)) for k in parsed.kwargs]
    if isinstance(parsed, A.SurrogateDef):
        definition = A.SurrogateDef(parsed.name, parsed.arg, kwargs, _Relocate().fold(parsed.body),
                                    _negative(parsed.pos), {"load option": True})
        return A.SurrogateUse(parsed.name, [], _negative(parsed.pos)), definition
    return A.SurrogateUse(parsed.name, kwargs, _negative(parsed.pos)), None


def relocate(err: FlexDSLError, options: LoadOptions) -> FlexDSLError:
    """An error at a position of the surrogate option (a negative line) located in its text;
    any other error as it is."""
    if err.line >= 0 or options.surrogate is None:
        return err
    hint = err.hint
    if options.origin:
        hint = (hint + "; " if hint else "") + f"the surrogate was given as {options.origin}"
    return option_error(err.reason, options.surrogate, err.column, hint)


# ---------------------------------------------------------------------------------- applying
def apply(neuron: A.Neuron, options: LoadOptions) -> A.Neuron:
    """The parsed model with the options in place (a new Neuron; `neuron` is not changed)."""
    if not options:
        return neuron
    items = list(neuron.items)
    if options.surrogate is not None:
        use, definition = parse_surrogate(options.surrogate)
        if definition is not None:  # (it takes the place of the model's surrogate of that name, if any)
            items = [it for it in items if not (isinstance(it, A.SurrogateDef) and it.name == definition.name)]
            items.append(definition)
        rules = [i for i, it in enumerate(items) if isinstance(it, A.SpikeRule)]
        if not rules:
            raise FlexDSLError(f"surrogate={options.surrogate!r} was given, but `{neuron.name}` has no spike rule",
                               neuron.filename, neuron.pos.line, neuron.pos.column, neuron.source,
                               "a surrogate is the gradient of a spike: only a model with `spike when ...` "
                               "takes one")
        old = items[rules[0]].surrogate
        written = "no surrogate (the default, sigmoid(alpha=4.0))" if old is None else \
            f"{old.name}(" + ", ".join(f"{k.name}={A.to_text(k.value)}" for k in old.kwargs) + ")"
        neuron = dataclasses.replace(neuron, meta={**neuron.meta, "surrogate_written": written})
        for i in rules:  # (a second rule is the checker's error)
            items[i] = dataclasses.replace(items[i], surrogate=use)
    if options.learnable is not None:
        params = [it for it in items if isinstance(it, A.Param)]
        names = [p.name for p in params]
        chosen = set(names) if options.learnable is True else set() if options.learnable is False \
            else set(options.learnable)
        for n in sorted(chosen - set(names), key=str):
            raise _unknown_learnable(neuron, n, names)
        items = [dataclasses.replace(it, learnable=it.name in chosen) if isinstance(it, A.Param) else it
                 for it in items]
    return dataclasses.replace(neuron, items=items)


def _unknown_learnable(neuron: A.Neuron, name: str, params: list[str]) -> FlexDSLError:
    what = next((("an input" if isinstance(it, A.Input) else "a state") for it in neuron.items
                 if isinstance(it, A.Input | A.State) and it.name == name), None)
    hint = did_you_mean(name, params) or ("params: " + ", ".join(params) if params else "the model has no params")
    if what is not None:
        msg = f"learnable= names `{name}`, which is {what} of `{neuron.name}`, not a param"
        hint = "only params are trained (a state's initial value follows the params)" + (
            "; params: " + ", ".join(params) if params else "")
    else:
        msg = f"learnable= names `{name}`, which `{neuron.name}` does not declare"
    return FlexDSLError(msg, neuron.filename, neuron.pos.line, neuron.pos.column, neuron.source, hint)


__all__ = ["LoadOptions", "NONE", "apply", "relocate", "parse_surrogate", "option_error", "OPTION_FILE"]
