"""Syntax errors: lark's exceptions made located FlexDSLErrors, with hints for the mistakes of
someone coming from another tool: a misspelled keyword (`parm`, `sate`, `upate:`), `=>` for
`>=`, and Brian2's or NESTML's `C * dv/dt = rhs` (the exact rewrite as the hint)."""

from __future__ import annotations

import re

from lark import Token
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from ..errors import FlexDSLError, did_you_mean, source_lines

RESERVED = frozenset(
    "neuron input param state update equations method spike when surrogate on output where learnable let".split()
)
# the words that start or join the language's clauses (the reserved words and the contextual ones)
KEYWORDS = RESERVED | {"refractory", "unless", "while", "crosses"}

_TOKEN_WORDS = {
    "_NL": "end of line", "_INDENT": "indent", "_DEDENT": "dedent", "$END": "end of file",
    "NAME": "a name", "NUMBER": "a number", "STRING": "a string", "LONG_STRING": "a docstring",
    "EQUALS": "`=`", "AUG_OP": "`+=`", "COLON": "`:`", "LPAR": "`(`", "RPAR": "`)`", "COMMA": "`,`",
    "ADD": "`+`", "SUB": "`-`", "MUL": "`*`", "DIV": "`/`", "POW": "`**`", "GE": "`>=`", "GT": "`>`",
    "LE": "`<=`", "LT": "`<`", "EQ": "`==`", "NE": "`!=`", "ONE_OVER": "`1/` (a unit after a number)",
}
# `=>` and `=<`, written for `>=` and `<=` (the lexer reads `=` and then `>`)
_SWAPPED = {">": ">=", "<": "<="}
# `COEF * dX/dt = RHS` (Brian2's and NESTML's form: a capacitance or a time constant times the
# derivative), with an optional `unless refractory`
_SCALED_ODE = re.compile(r"^(?P<indent>\s*)(?P<coef>[^=#]*?\S)\s*\*\s*d(?P<state>[A-Za-z_][A-Za-z0-9_]*)\s*/\s*dt"
                         r"\s*=\s*(?P<rhs>[^#]*?)(?P<held>\s+unless\s+refractory)?\s*(#.*)?$")
_EXPONENT = re.compile(r"(?<![A-Za-z0-9_.])[0-9.]+[eE]$")  # text ending in `1e` (of `1e-3`)
_SIMPLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9.]+([eE][+-]?[0-9]+)?")


def _line_of(source: str, line: int) -> str:
    lines = source_lines(source)
    return lines[line - 1] if 0 < line <= len(lines) else ""


def _previous_word(source: str, tok: Token) -> str:
    """The word just before a token on its line (for hints about word order)."""
    before = _line_of(source, tok.line)[: tok.column - 1].split()
    return before[-1] if before else ""


def _describe_expected(expected: set[str]) -> str:
    words = sorted({_TOKEN_WORDS.get(e, f"`{e.lower()}`") for e in expected})
    if len(words) > 6:
        words = words[:6] + ["..."]
    return ", ".join(words)


def _wrapped(text: str) -> bool:
    """Whether `text` is one parenthesized group, `(...)`."""
    depth = 0
    for i, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and i < len(text) - 1:
            return False
    return text.startswith("(")


def _has_sum(text: str) -> bool:
    """Whether `text` has a binary `+` or `-` outside parentheses (not a sign, not `1e-3`)."""
    depth, prev = 0, ""
    for i, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and ch in "+-" and prev and (prev[-1].isalnum() or prev[-1] in "_).") \
                and not _EXPONENT.search(prev):
            return True
        prev = text[: i + 1].rstrip() if ch != " " else prev
    return False


def _operand(text: str, divisor: bool) -> str:
    """`text` as an operand of `/`: the dividend in parentheses if it is a sum, the divisor
    unless it is a name, a number or one parenthesized group."""
    text = text.strip()
    if _SIMPLE.fullmatch(text) or _wrapped(text) or (not divisor and not _has_sum(text)):
        return text
    return f"({text})"


def scaled_derivative(source: str, filename: str, tok: Token) -> FlexDSLError | None:
    """`C * dv/dt = rhs` on the line of `tok` (where the parser stopped, at or before the `*`):
    a located error whose hint is the line rewritten, `dv/dt = (rhs) / C`; None otherwise."""
    text = _line_of(source, tok.line)
    m = _SCALED_ODE.match(text)
    if m is None or not m.group("rhs") or tok.column > m.end("coef") + 1 + text[m.end("coef"):].index("*"):
        return None
    coef, state, rhs = m.group("coef"), m.group("state"), m.group("rhs")
    held = " unless refractory" if m.group("held") else ""
    rewrite = f"d{state}/dt = {_operand(rhs, False)} / {_operand(coef, True)}{held}"
    return FlexDSLError(f"`{coef.strip()} * d{state}/dt = ...`: an equation has the derivative alone on its left "
                        "(Brian2's and NESTML's factor before it is not read)", filename, tok.line,
                        m.start("coef") + 1, source, f"divide the right-hand side by it: `{rewrite}`")


def _keyword_hint(word: str, expected: set[str]) -> str | None:
    """"did you mean `param`?" for a misspelled keyword, among the keywords the parser expected."""
    words = {e.lower() for e in expected if e.isupper() and e.lower() in KEYWORDS}
    return did_you_mean(word, words) if words and word not in words else None


_EMPTY_HINT = "a model starts `neuron NAME:` (`layer NAME:`, `rule NAME:`) with its indented body below"


def _unexpected_token(err: UnexpectedToken, filename: str, source: str) -> FlexDSLError:
    tok = err.token
    expected = set(err.expected) if err.expected else set()
    if tok.type == "$END":
        lines = source_lines(source.rstrip("\n"))
        return FlexDSLError("unexpected end of file", filename, len(lines), len(lines[-1]) + 1, source,
                            "a block needs an indented body" if "_INDENT" in expected else _EMPTY_HINT)
    if tok.type == "_INDENT":
        return FlexDSLError("unexpected indent", filename, tok.end_line, tok.end_column, source,
                            "indent only the body of `neuron`, `update:`, `equations:` and `on spike:`")
    if tok.type == "_DEDENT":
        return FlexDSLError("unexpected dedent", filename, tok.end_line, tok.end_column, source,
                            f"expected {_describe_expected(expected)}")
    if tok.type == "_NL":
        if "_INDENT" in expected:
            return FlexDSLError("expected an indented block", filename, tok.end_line, tok.end_column, source)
        return FlexDSLError(f"unexpected end of line, expected {_describe_expected(expected)}",
                            filename, tok.line, tok.column, source)
    word = str(tok)
    scaled = scaled_derivative(source, filename, tok)
    if scaled is not None:
        return scaled
    after = source[tok.end_pos:tok.end_pos + 1] if tok.end_pos is not None else ""
    if tok.type == "EQUALS" and after in _SWAPPED:
        return FlexDSLError(f"`={after}` is not an operator", filename, tok.line, tok.column, source,
                            f"did you mean `{_SWAPPED[after]}`? (comparisons are `>=`, `<=`, `>`, `<`, `==`, `!=`)")
    if "NAME" in expected and word in RESERVED:
        return FlexDSLError(f"`{word}` is a reserved word and cannot be used as a name", filename,
                            tok.line, tok.column, source, "choose another name")
    if word == "where" and _previous_word(source, tok) == "learnable":
        return FlexDSLError("`where` after `learnable`: the constraint comes first", filename, tok.line,
                            tok.column, source, "write `param NAME = VALUE where CONDITION learnable`, e.g. "
                            "`param tau = 2.0 where tau > 1 learnable`")
    keyword = _keyword_hint(word, expected) if tok.type == "NAME" else None
    if keyword is not None:
        return FlexDSLError(f"unexpected `{word}`, expected {_describe_expected(expected)}", filename, tok.line,
                            tok.column, source, keyword)
    if "COLON" in expected and tok.type != "COLON":
        return FlexDSLError(f"expected `:` before {_TOKEN_WORDS.get(tok.type, '`' + word + '`')}",
                            filename, tok.line, tok.column, source)
    return FlexDSLError(f"unexpected `{word}`, expected {_describe_expected(expected)}",
                        filename, tok.line, tok.column, source)


def syntax_error(err: UnexpectedInput, filename: str, source: str) -> FlexDSLError:
    """The located FlexDSLError of a lark parse error of `source`."""
    if isinstance(err, UnexpectedCharacters):
        ch = source[err.pos_in_stream] if err.pos_in_stream < len(source) else ""
        if ch == '"':
            return FlexDSLError("unterminated string", filename, err.line, err.column, source,
                                "strings are one line `\"...\"`; docstrings use `\"\"\"...\"\"\"`")
        if ch.isdigit() or ch.isnumeric():
            return FlexDSLError(f"`{ch}` (U+{ord(ch):04X}) is not a digit of a number", filename, err.line,
                                err.column, source, "numbers are written with the ASCII digits 0-9")
        hint = (f"`{ch}` (U+{ord(ch):04X}) is not ASCII: names are ASCII letters, digits and `_` (a look-alike "
                "letter or an invisible character pasted in?)" if not ch.isascii() else
                "see the language reference (docs/language.md) for the characters a model is written with")
        return FlexDSLError(f"unexpected character `{ch}`", filename, err.line, err.column, source, hint)
    if isinstance(err, UnexpectedToken):
        return _unexpected_token(err, filename, source)
    if isinstance(err, UnexpectedEOF):
        lines = source_lines(source.rstrip("\n"))
        return FlexDSLError("unexpected end of file", filename, len(lines), len(lines[-1]) + 1, source, _EMPTY_HINT)
    return FlexDSLError(str(err), filename, getattr(err, "line", 0), getattr(err, "column", 0), source)
