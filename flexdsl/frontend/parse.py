"""Stage 1: text -> typed AST (frontend/ast.py), with lark (LALR + Indenter + Transformer).

Syntax errors become located FlexDSLErrors here; names and rules are checked in check.py.
"""

from __future__ import annotations

import keyword
import math
import re
import threading
from functools import lru_cache
from typing import Any

from lark import Lark, Token, Transformer_NonRecursive, v_args
from lark.exceptions import UnexpectedInput, VisitError
from lark.indenter import Indenter

from .._paths import GRAMMAR_DIR
from ..errors import FlexDSLError, line_col
from ..errors import source_lines as source_lines  # (the parser's line count, used by the backends)
from . import ast as A
from .syntax import RESERVED, syntax_error

_RECURSION_HINT = "split long expressions into several `let` statements"

MAX_SOURCE = 2_000_000  # characters of model text
MAX_LINE = 10_000  # characters of one line
MAX_DEPTH = 64  # nesting of an expression (calls, parentheses, powers, unary minus)
# characters no model text may hold: C0 controls other than tab, newline and form feed, DEL,
# C1 controls, and lone surrogates (which no file can encode)
_BAD_CHARS = re.compile("[\x00-\x08\x0b\x0e-\x1f\x7f-\x84\x86-\x9f\ud800-\udfff]")


class _IndentError(Exception):
    def __init__(self, token: Token, message: str, at_line_start: bool = False) -> None:
        self.token = token
        self.message = message
        self.column = 1 if at_line_start else token.end_column


class NeuronIndenter(Indenter):
    NL_type = "_NL"
    OPEN_PAREN_types = ["LPAR"]
    CLOSE_PAREN_types = ["RPAR"]
    INDENT_type = "_INDENT"
    DEDENT_type = "_DEDENT"
    tab_len = 8

    @property
    def always_accept(self) -> tuple[str, ...]:  # type: ignore[override]
        """Terminals the contextual lexer tries in every parser state: a word is always read whole as a
        NAME (a keyword only where it is the whole word, by lark's `unless`), never a keyword as its prefix
        (`neuronlif` was `neuron lif`, `size4` `size 4`)."""
        return (self.NL_type, "NAME")

    def process(self, stream):  # type: ignore[override]
        self.indent_char: str | None = None  # " " or "\t": the first indented line decides
        return super().process(stream)

    def handle_NL(self, token: Token):  # type: ignore[override]
        if self.paren_level > 0:
            return
        yield token
        indent_str = token.rsplit("\n", 1)[1]
        if indent_str:
            if " " in indent_str and "\t" in indent_str:
                raise _IndentError(token, "indentation mixes tabs and spaces", True)
            if self.indent_char is None:
                self.indent_char = indent_str[0]
            elif indent_str[0] != self.indent_char:
                first = "spaces" if self.indent_char == " " else "tabs"
                this = "a tab" if indent_str[0] == "\t" else "spaces"
                raise _IndentError(token, f"inconsistent indentation: this line is indented with {this}, "
                                          f"earlier lines with {first}", True)
        indent = indent_str.count(" ") + indent_str.count("\t") * self.tab_len
        if indent > self.indent_level[-1]:
            self.indent_level.append(indent)
            yield Token.new_borrow_pos(self.INDENT_type, indent_str, token)
        else:
            while indent < self.indent_level[-1]:
                self.indent_level.pop()
                yield Token.new_borrow_pos(self.DEDENT_type, indent_str, token)
            if indent != self.indent_level[-1]:
                raise _IndentError(token, "unindent does not match any outer indentation level")


@lru_cache(maxsize=1)
def _parser() -> Lark:
    """The LALR parser, built once per process (about 60 ms; its tables are never read back from
    a file, so nothing is unpickled)."""
    return Lark.open(str(GRAMMAR_DIR / "neuron.lark"), parser="lalr", postlex=NeuronIndenter(),
                     propagate_positions=True, maybe_placeholders=True,
                     start=["start", "layer_start", "rule_start", "surrogate_use", "surrogate_decl"])


# The indenter keeps per-parse state, so one parse runs at a time (parsing is fast).
_PARSE_LOCK = threading.Lock()


def _pos(x) -> A.Pos:
    if isinstance(x, Token):
        return A.Pos(x.line, x.column)
    return A.Pos(x.meta.line, x.meta.column)


def _unquote(tok: Token) -> str:
    s = str(tok)
    return s[3:-3] if s.startswith('"""') else s[1:-1]


# a number as the language writes it, with an optional sign: ASCII digits only (Python's float()
# also reads `３.5`, `1_0`, `nan`, ` 1 `, which are not numbers of the language)
NUMBER_TEXT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")


def read_number(text: str) -> float:
    """A number given as text outside a model (a param value, a command-line option), read as
    the language reads numbers; ValueError for anything else."""
    if not isinstance(text, str) or NUMBER_TEXT.fullmatch(text.strip()) is None:
        raise ValueError(f"not a number: {text!r}")
    return float(text.strip())


def _nonzero_mantissa(text: str) -> bool:
    mantissa = text.lower().partition("e")[0]
    return any(ch in "123456789" for ch in mantissa)


def _dedent_doc(text: str) -> str:
    import inspect

    return inspect.cleandoc(text)


@v_args(inline=True)
class _ToAST(Transformer_NonRecursive):
    """lark tree -> frontend/ast.py nodes (positions kept on every node); iterative, so deep
    expressions never hit the recursion limit."""

    def __init__(self, filename: str, source: str) -> None:
        super().__init__()
        self.filename = filename
        self.source = source

    # ---- expressions
    def number(self, tok: Token) -> A.Num:
        value = float(tok)
        if value == float("inf"):
            raise FlexDSLError(f"the number `{tok}` is too large for a float", self.filename, tok.line, tok.column,
                               self.source, "the largest float is about 1.8e308")
        if value == 0.0 and _nonzero_mantissa(str(tok)):
            raise FlexDSLError(f"the number `{tok}` is too small for a float (it would be 0)", self.filename,
                               tok.line, tok.column, self.source, "the smallest float is about 5e-324; write 0 for 0")
        return A.Num(value, str(tok), _pos(tok))

    def name(self, tok: Token) -> A.Name:
        return A.Name(str(tok), _pos(tok))

    def exponent(self, sign: Token | None, num: Token) -> tuple[float, str]:
        text = (str(sign) if sign is not None and str(sign) == "-" else "") + str(num)
        return float(text), text

    def quantity(self, num: Token, unit: Token, _pow: Token | None, exponent: tuple[float, str] | None) -> A.Quantity:
        self.number(num)  # (its checks)
        power, ptext = exponent if exponent is not None else (1.0, "")
        return A.Quantity(float(num), str(num), str(unit), power, _pos(num), _pos(unit), ptext)

    def quantity_per(self, num: Token, _one_over: Token, unit: Token, _pow: Token | None,
                     exponent: tuple[float, str] | None) -> A.Quantity:
        """`0.02 1/ms`: the unit to a negative power."""
        self.number(num)
        power, ptext = exponent if exponent is not None else (1.0, "1")
        ptext = ptext[1:] if ptext.startswith("-") else "-" + ptext
        return A.Quantity(float(num), str(num), str(unit), -power, _pos(num), _pos(unit), ptext)

    def binop(self, left, op: Token, right) -> A.BinOp:
        return A.BinOp(str(op), left, right, _pos_of_expr(left))

    def pow(self, left, op: Token, right) -> A.BinOp:
        return A.BinOp("**", left, right, _pos_of_expr(left))

    def neg(self, op: Token, operand) -> A.Neg:
        return A.Neg(operand, _pos(op))

    def pos(self, op: Token, operand):
        return operand

    def call(self, func: Token, *args) -> A.Call:
        return A.Call(str(func), tuple(a for a in args if a is not None), _pos(func))

    def cmp_op(self, tok: Token) -> Token:
        return tok

    def comparison(self, *parts) -> A.Compare:
        operands = tuple(parts[0::2])
        ops = tuple(str(t) for t in parts[1::2])
        return A.Compare(operands, ops, _pos_of_expr(operands[0]))

    # ---- declarations
    def doc(self, tok: Token) -> str:
        return _unquote(tok)

    def docstring(self, tok: Token) -> tuple[str, str]:
        return ("__doc__", _dedent_doc(_unquote(tok)))

    def name_list(self, *toks: Token) -> list[Token]:
        return list(toks)

    def out_name(self, tok: Token) -> Token:
        return tok

    def input_unit(self, unit) -> A.Expr:
        return unit

    def input_decl(self, names: list[Token], unit, doc) -> list[A.Input]:
        return [A.Input(str(t), _pos(t), doc or "", {}, unit) for t in names]

    def where_clause(self, kw: Token, cmp: A.Compare) -> A.Compare:
        return cmp

    def param_decl(self, name: Token, _eq, default, where, learnable, doc) -> A.Param:
        return A.Param(str(name), default, _pos(name), where, learnable is not None, doc or "")

    def state_decl(self, name: Token, _eq, init, doc) -> A.State:
        return A.State(str(name), init, _pos(name), doc or "")

    def kwarg(self, name: Token, _eq, value) -> A.Kwarg:
        return A.Kwarg(str(name), value, _pos(name))

    def surrogate_decl(self, name: Token, arg: Token, *rest) -> A.SurrogateDef:
        *kwargs, _eq, body = rest
        return A.SurrogateDef(str(name), str(arg), list(kwargs), body, _pos(name))

    def output_decl(self, *names: Token) -> A.Output:
        return A.Output([(str(t), _pos(t)) for t in names], _pos(names[0]))

    # ---- blocks
    def held(self, _unless: Token, _refractory: Token) -> bool:
        return True

    def assign(self, target: Token, op: Token, value, held) -> A.Assign:
        return A.Assign(str(target), str(op), value, _pos(target), held=bool(held))

    def let_assign(self, target: Token, _eq, value) -> A.Assign:
        return A.Assign(str(target), "=", value, _pos(target), is_let=True)

    def update_block(self, *stmts) -> A.Update:
        return A.Update(list(stmts), stmts[0].pos)

    def on_spike_block(self, spike: Token, *stmts) -> A.OnSpike:
        return A.OnSpike(list(stmts), _pos(spike))

    def method(self, tok: Token) -> Token:
        return tok

    def ode(self, dname: Token, _div, denom: Token, _eq, value, held) -> A.ODE:
        written = str(dname)
        p = _pos(dname)
        if written.startswith("d") and len(written) > 1:
            return A.ODE(written[1:], value, A.Pos(p.line, p.column + 1), written, str(denom), _pos(denom),
                         bool(held))
        return A.ODE("", value, p, written, str(denom), _pos(denom), bool(held))

    def refractory_decl(self, kw: Token, *rest) -> A.Refractory:
        if len(rest) == 2:  # `refractory while CONDITION`
            return A.Refractory(None, rest[1], _pos(kw))
        return A.Refractory(rest[0], None, _pos(kw))

    def subexpr(self, name: Token, _eq, value) -> A.Subexpr:
        return A.Subexpr(str(name), value, _pos(name))

    def equations_block(self, method, *lines) -> A.Equations:
        m = str(method) if method is not None else None
        mpos = _pos(method) if method is not None else None
        return A.Equations(list(lines), lines[0].pos, m, mpos)

    def surrogate_use(self, name: Token, *kwargs) -> A.SurrogateUse:
        return A.SurrogateUse(str(name), [k for k in kwargs if k is not None], _pos(name))

    def spike_rule(self, spike: Token, left, op: Token, right, surrogate) -> A.SpikeRule:
        flipped = {"<": ">", "<=": ">="}.get(str(op))
        if flipped is not None:  # `A < B` fires as `B > A` (kept as written for the docs)
            return A.SpikeRule(right, flipped, left, _pos(spike), surrogate, str(op))
        return A.SpikeRule(left, str(op), right, _pos(spike), surrogate)

    def neuron(self, name: Token, *items) -> A.Neuron:
        doc, flat = _doc_and_items(items)
        return A.Neuron(str(name), flat, _pos(name), self.filename, self.source, doc)

    def start(self, neuron: A.Neuron) -> A.Neuron:
        return neuron

    # ---- layers
    def layer_neuron(self, ref: Token) -> A.LayerNeuron:
        is_path = ref.type == "STRING"
        return A.LayerNeuron(_unquote(ref) if is_path else str(ref), is_path, _pos(ref))

    def layer_size(self, kw: Token, num: Token) -> A.LayerSize:
        return A.LayerSize(self._count(num, "a layer's size"), _pos(num))

    def layer_input(self, name: Token, _kw, num, doc) -> A.LayerInput:
        size = self._count(num, f"the size of input `{name}`") if num is not None else None
        return A.LayerInput(str(name), size, _pos(name), doc or "", _pos(num) if num is not None else None)

    def _count(self, num: Token, what: str) -> int:
        try:
            value = float(num)
        except OverflowError:  # (a many-digit integer: over any size)
            value = math.inf
        if not math.isfinite(value) or value != int(value) or value < 1 or value > 2**31:
            raise FlexDSLError(f"{what} must be a positive whole number, not `{num}`", self.filename, num.line,
                               num.column, self.source, "e.g. `size 256`")
        return int(value)

    def synapses_line(self, kw: Token, name: Token, _from, pre: Token, _to, port: Token, doc) -> A.Synapses:
        return A.Synapses(str(name), str(pre), str(port), _pos(kw), _pos(pre), _pos(port), doc or "")

    def synapses_block(self, kw: Token, name: Token, _from, pre: Token, _to, port: Token, doc, *items) -> A.Synapses:
        syn = self.synapses_line(kw, name, _from, pre, _to, port, doc)
        for it in items:
            if isinstance(it, A.State):
                syn.states.append(it)
            elif isinstance(it, A.SynapseEvent):
                syn.events.append(it)
            else:
                field, value, pos = it
                if getattr(syn, field) is not None:
                    raise FlexDSLError(f"this synapse has a second `{field}` line", self.filename, pos.line,
                                       pos.column, self.source, f"keep one `{field}` line per synapses block")
                if field == "delay":
                    value, extra = value
                    for k, v in extra.items():
                        setattr(syn, k, v)
                if field == "rule":
                    value, syn.rule_is_path, syn.rule_mode, syn.rule_mode_pos = value
                setattr(syn, field, value)
                setattr(syn, field + "_pos", pos)
        return syn

    def connect_decl(self, kw: Token, kind: Token) -> tuple:
        return ("connect", str(kind), _pos(kind))

    def bias_decl(self, kw: Token, name: Token) -> tuple:
        return ("bias", str(name), _pos(name))

    def delay_decl(self, kw: Token, value, learnable: Token | None, interp: Token | None) -> tuple:
        return ("delay", (value, self._delay_extra(None, learnable, interp)), _pos(kw))

    def delay_kind_decl(self, kw: Token, kind: Token, _max, value, learnable: Token | None,
                        interp: Token | None) -> tuple:
        return ("delay", (value, self._delay_extra(str(kind), learnable, interp)), _pos(kw))

    @staticmethod
    def _delay_extra(kind: str | None, learnable: Token | None, interp: Token | None) -> dict[str, Any]:
        return {"delay_kind": kind, "delay_learnable": learnable is not None,
                "delay_interp": str(interp) if interp is not None else None,
                "delay_interp_pos": _pos(interp) if interp is not None else None}

    def rule_decl(self, kw: Token, ref: Token, mode: Token | None) -> tuple:
        is_path = ref.type == "STRING"
        value = (_unquote(ref) if is_path else str(ref), is_path,
                 str(mode) if mode is not None else None, _pos(mode) if mode is not None else None)
        return ("rule", value, _pos(ref))

    # ---- plasticity rules
    def weight_decl(self, kw: Token, name: Token, where, doc) -> A.WeightDecl:
        return A.WeightDecl(str(name), where, _pos(name), doc or "")

    def rule(self, kw: Token, name: Token, *items) -> A.Rule:
        doc, flat = _doc_and_items(items)
        return A.Rule(str(name), flat, _pos(name), self.filename, self.source, doc)

    def rule_start(self, rule: A.Rule) -> A.Rule:
        return rule

    def synapse_event(self, kind: Token, *stmts) -> A.SynapseEvent:
        return A.SynapseEvent(str(kind), list(stmts), _pos(kind))

    def layer(self, name: Token, *items) -> A.Layer:
        doc, flat = _doc_and_items(items)
        return A.Layer(str(name), flat, _pos(name), self.filename, self.source, doc)

    def layer_start(self, layer: A.Layer) -> A.Layer:
        return layer


def _doc_and_items(items: tuple) -> tuple[str, list]:
    """A block's docstring (or "") and its items, lists of items (`input a, b`) flattened."""
    doc = ""
    flat: list = []
    for it in items:
        if isinstance(it, tuple) and it and it[0] == "__doc__":
            doc = it[1]
        elif isinstance(it, list):
            flat.extend(it)
        else:
            flat.append(it)
    return doc, flat


def _pos_of_expr(e) -> A.Pos:
    return e.pos



def normalize(source: str) -> str:
    """The text as the parser sees it (and as errors quote it): no byte-order mark, and every
    line break (`\\r\\n`, a lone `\\r`) a `\\n`."""
    if source.startswith("\ufeff"):
        source = source[1:]
    return source.replace("\r\n", "\n").replace("\r", "\n")


def _check_text(source: str, filename: str) -> None:
    if len(source) > MAX_SOURCE:
        raise FlexDSLError(f"the model text is too large ({len(source):,} characters; the limit is "
                           f"{MAX_SOURCE:,})", filename, 1, 1, source)
    bad = _BAD_CHARS.search(source)
    if bad is not None:
        line, col = line_col(source, bad.start())
        raise FlexDSLError(f"invalid character U+{ord(bad.group()):04X} in the model text", filename, line, col,
                           source, "a .neuron file is UTF-8 text without control characters")
    if len(source) > MAX_LINE:
        for k, text in enumerate(source_lines(source)):
            if len(text) > MAX_LINE:
                raise FlexDSLError(f"this line is too long ({len(text):,} characters; the limit is {MAX_LINE:,})",
                                   filename, k + 1, MAX_LINE + 1, source,
                                   "split it: a statement may use `let` temporaries, a docstring several lines")


def parse(source: str, filename: str = "<string>") -> A.Neuron:
    """Parse `.neuron` text into a typed AST. Raises FlexDSLError on syntax errors."""
    neuron = _parse(source, filename, "start")
    _check_identifiers(neuron)
    _check_depth(neuron)
    return neuron


def parse_layer(source: str, filename: str = "<string>") -> A.Layer:
    """Parse `.layer` text into a typed AST (`A.Layer`). Raises FlexDSLError on syntax errors."""
    return _parse(source, filename, "layer_start")


def parse_rule(source: str, filename: str = "<string>") -> A.Rule:
    """Parse `.rule` text (a plasticity rule) into a typed AST (`A.Rule`). Raises FlexDSLError on
    syntax errors."""
    return _parse(source, filename, "rule_start")


def _parse(source: str, filename: str, start: str):
    source = normalize(source)
    _check_text(source, filename)
    text = source if source.endswith("\n") else source + "\n"
    try:
        with _PARSE_LOCK:
            tree = _parser().parse(text, start=start)
    except _IndentError as e:
        tok = e.token
        raise FlexDSLError(e.message, filename, tok.end_line, e.column, source,
                           "indent blocks with 4 spaces or with tabs, the same way throughout the file") from None
    except UnexpectedInput as e:
        raise syntax_error(e, filename, source, lambda other: _error_line(other, start)) from None
    try:
        return _ToAST(filename, source).transform(tree)
    except VisitError as e:
        if isinstance(e.orig_exc, FlexDSLError):
            raise e.orig_exc from None
        raise e.orig_exc from None  # pragma: no cover - a transformer bug, not a user error


def _error_line(text: str, start: str) -> int:
    """The line of the first syntax error of `text` parsed from `start`, 0 if it parses (for hints that
    suggest a text: one that parses past the error's line)."""
    try:
        with _PARSE_LOCK:
            _parser().parse(text if text.endswith("\n") else text + "\n", start=start)
    except _IndentError as e:
        return e.token.end_line
    except UnexpectedInput as e:
        return max(e.line, 1)
    return 0


_DEFINITION = re.compile(r"\s*[A-Za-z_][A-Za-z0-9_]*\s*\(\s*[A-Za-z_][A-Za-z0-9_]*\s*[,)]")


def parse_fragment(text: str, shown_prefix: str, filename: str) -> A.SurrogateUse | A.SurrogateDef:
    """A surrogate given apart from a model (the load option `surrogate=`): `text` is a clause
    `name(k=v, ...)` (a bare name takes the defaults) or a definition `name(x, k=v, ...) = expr`
    (as a model declares one); errors quote `shown_prefix + text`, and positions count the prefix
    (`shown_prefix` is as long as the parsed `surrogate `)."""
    assert len(shown_prefix) == len("surrogate ")
    shown = shown_prefix + text
    _check_text(shown, filename)
    definition = bool(_DEFINITION.match(text))
    body = text + "()" if re.fullmatch(r"\s*[A-Za-z_][A-Za-z0-9_]*\s*", text) else text
    try:
        with _PARSE_LOCK:
            tree = _parser().parse("surrogate " + body + ("\n" if definition else ""),
                                   start="surrogate_decl" if definition else "surrogate_use")
    except _IndentError as e:  # (a one-line text has no indentation; kept for completeness)
        raise FlexDSLError(e.message, filename, 1, e.column, shown) from None
    except UnexpectedInput as e:
        err = syntax_error(e, filename, shown + " " * (len(body) - len(text)))
        reason = err.reason.replace("end of file", "end of the text").replace("end of line", "end of the text")
        raise FlexDSLError(reason, filename, err.line, err.column, shown, err.hint) from None
    try:
        out = _ToAST(filename, shown).transform(tree)
    except VisitError as e:
        raise e.orig_exc from None
    exprs = [k.value for k in out.kwargs] + ([out.body] if definition else [])
    names = [(out.name, out.pos), *((k.name, k.pos) for k in out.kwargs)]
    names += [(n.id, n.pos) for e in exprs for n in A.names(e)] + ([(out.arg, out.pos)] if definition else [])
    for name, pos in names:
        if name in RESERVED or name.startswith("_") or keyword.iskeyword(name):
            raise FlexDSLError(f"`{name}` cannot be a name here", filename, pos.line, pos.column, shown,
                               "names starting with `_`, reserved words and Python keywords are not names")
    for e in exprs:
        deep = _depth_errors(e)
        if deep is not None:
            raise FlexDSLError(f"this expression is nested more than {MAX_DEPTH} levels deep", filename,
                               deep.pos.line, deep.pos.column, shown, _RECURSION_HINT)
    return out


def _depth_errors(e: A.Expr) -> A.Expr | None:
    """The first node nested deeper than MAX_DEPTH, or None. A chain of `+`/`-` (or `*`/`/`)
    is one level however long, so a flat sum of many terms is never "too deep"."""
    stack: list[tuple[A.Expr, int]] = [(e, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            return node
        if isinstance(node, A.BinOp) and node.op in "+-*/":
            group = "+-" if node.op in "+-" else "*/"
            left = node.left
            same = isinstance(left, A.BinOp) and left.op in group
            stack.append((left, depth if same else depth + 1))
            stack.append((node.right, depth + 1))
        else:
            stack.extend((k, depth + 1) for k in A.children(node))
    return None


def _check_depth(neuron: A.Neuron) -> None:
    for it in neuron.items:
        for e in A.item_exprs(it):
            deep = _depth_errors(e)
            if deep is not None:
                raise FlexDSLError(f"this expression is nested more than {MAX_DEPTH} levels deep",
                                   neuron.filename, deep.pos.line, deep.pos.column, neuron.source, _RECURSION_HINT)


def _check_identifiers(neuron: A.Neuron) -> None:
    """Names starting with `_` and Python keywords are rejected where they are declared or used."""

    def bad(name: str, pos: A.Pos) -> None:
        if name in RESERVED:
            raise FlexDSLError(f"`{name}` is a reserved word and cannot be used as a name", neuron.filename,
                               pos.line, pos.column, neuron.source, "choose another name")
        if name.startswith("_"):
            raise FlexDSLError(f"name `{name}` starts with `_`", neuron.filename, pos.line, pos.column,
                               neuron.source, "names starting with `_` are reserved for generated code")
        if keyword.iskeyword(name):
            raise FlexDSLError(f"`{name}` is a Python keyword and cannot be used as a name", neuron.filename,
                               pos.line, pos.column, neuron.source, "choose another name")

    for name, pos in A.declared_names(neuron):
        bad(name, pos)
