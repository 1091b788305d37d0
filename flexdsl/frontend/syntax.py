"""Syntax errors: lark's exceptions made located FlexDSLErrors, with hints for the mistakes of
someone coming from another tool: a misspelled keyword (`parm`, `sate`, `upate:`), `=>` for
`>=`, and Brian2's or NESTML's `C * dv/dt = rhs` (the exact rewrite as the hint)."""

from __future__ import annotations

import re
from collections.abc import Callable

from lark import Token
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from ..errors import FlexDSLError, clip, did_you_mean, source_lines

RESERVED = frozenset(
    "neuron input param state update equations method spike when surrogate on output where learnable let".split()
)
# the words that start or join the clauses of the three file kinds (grammar/neuron.lark: the reserved words
# and the contextual ones, names elsewhere; tests/test_syntax_keywords.py checks it is every word of the grammar)
KEYWORDS = RESERVED | {"refractory", "unless", "while", "crosses", "layer", "size", "synapses", "from", "to",
                       "connect", "bias", "delay", "axonal", "synaptic", "dendritic", "max", "rule", "weight"}

_TOKEN_WORDS = {
    "_NL": "end of line", "_INDENT": "an indented line", "_DEDENT": "end of the block", "$END": "end of file",
    "NAME": "a name", "NUMBER": "a number", "STRING": "a string", "LONG_STRING": "a docstring",
    "EQUALS": "`=`", "AUG_OP": "`+=`", "COLON": "`:`", "LPAR": "`(`", "RPAR": "`)`", "COMMA": "`,`",
    "ADD": "`+`", "SUB": "`-`", "MUL": "`*`", "DIV": "`/`", "POW": "`**`", "GE": "`>=`", "GT": "`>`",
    "LE": "`<=`", "LT": "`<`", "EQ": "`==`", "NE": "`!=`", "ONE_OVER": "`1/` (a unit after a number)",
    "DELAY_KIND": "`axonal`, `synaptic`, `dendritic`",
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


# the line of the first syntax error of a text parsed as the file at hand (0: it parses): for hints that are
# checked by parsing the text they suggest
Reparse = Callable[[str], int]


def _expected(err: UnexpectedToken) -> set[str]:
    """The terminals that can follow where the parser stopped: lark's `accepts()` (each fed to a copy of the
    parser), not the LALR state's lookaheads, which merge those of the three file kinds (a rule's error listed
    the keywords of a layer's synapses)."""
    ip = getattr(err, "interactive_parser", None)
    if ip is not None:
        return set(ip.accepts())
    return set(err.expected) if err.expected else set()


def _keyword_hint(word: str, expected: set[str]) -> str | None:
    """"did you mean `param`?" for a misspelled keyword, among the keywords the parser expected."""
    words = _keywords(expected)
    return did_you_mean(word, words) if words and word not in words else None


def _keywords(expected: set[str]) -> set[str]:
    words = {e.lower() for e in expected if e.isupper() and e.lower() in KEYWORDS}
    if "DELAY_KIND" in expected:
        words |= {"axonal", "synaptic", "dendritic"}
    return words


def _glued_hint(tok: Token, expected: set[str], source: str, reparse: Reparse | None) -> str | None:
    """"did you mean `neuron lif`?" for a keyword glued to the word after it (`neuronlif`, `size4`), where
    the text with the two words apart parses past this line."""
    if reparse is None or tok.start_pos is None:
        return None
    word = str(tok)
    for kw in sorted(_keywords(expected), key=len, reverse=True):
        if word.startswith(kw) and len(word) > len(kw):
            split = f"{kw} {word[len(kw):]}"
            line = reparse(source[:tok.start_pos] + split + source[tok.end_pos:])
            if line == 0 or line > tok.line:
                return f"did you mean `{split}`? (a keyword is a whole word)"
    return None


def _code_line_before(source: str, line: int) -> int:
    """The last line before `line` with more than blanks and a comment (the header of a block)."""
    lines = source_lines(source)
    for k in range(min(line, len(lines) + 1) - 1, 0, -1):
        if lines[k - 1].strip() and not lines[k - 1].lstrip().startswith("#"):
            return k
    return max(line, 1)


def _empty_block(tok: Token, filename: str, source: str) -> FlexDSLError:
    """A block header (`synapses W from s to x:`, `update:`) with no indented line below it, located at the
    header (lark stops at what follows: a dedent past the end of the file, or the next line)."""
    ends_line = tok.type in ("_NL", "_DEDENT", "$END")  # (these carry the position of the header's line end)
    line = tok.line if ends_line and tok.line > 0 else _code_line_before(source, tok.line)
    text = _line_of(source, line)
    column = len(text) - len(text.lstrip()) + 1
    header = text.split("#", 1)[0].strip()
    hint = "add its lines below it, indented"
    if header.startswith("synapses "):
        hint = (f"drop the `:` (`{header.rstrip(':').rstrip()}` alone is a whole synapses line) or add its lines "
                "below it, indented (`connect dense`, `delay 3`, `rule stdp`, ...)")
    after = "the end of file follows it" if tok.type == "$END" else "no indented line follows it"
    return FlexDSLError(f"the block of `{clip(header, 60)}` is empty: {after}", filename, line, column, source, hint)


_EMPTY_HINT = "a model starts `neuron NAME:` (`layer NAME:`, `rule NAME:`) with its indented body below"


def _unexpected_token(err: UnexpectedToken, filename: str, source: str,
                      reparse: Reparse | None = None) -> FlexDSLError:
    tok = err.token
    expected = _expected(err)
    if "_INDENT" in expected and tok.type != "_INDENT":
        return _empty_block(tok, filename, source)
    if tok.type == "$END":
        lines = source_lines(source.rstrip("\n"))
        return FlexDSLError("unexpected end of file", filename, len(lines), len(lines[-1]) + 1, source, _EMPTY_HINT)
    if tok.type == "_INDENT":
        return FlexDSLError("unexpected indent", filename, tok.end_line, tok.end_column, source,
                            "indent only the body of `neuron`, `update:`, `equations:` and `on spike:`")
    if tok.type == "_DEDENT":
        text = _line_of(source, tok.line)
        return FlexDSLError("unexpected end of the block", filename, tok.line, len(text) + 1, source,
                            f"expected {_describe_expected(expected)} (a line of the block)")
    if tok.type == "_NL":
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
    if tok.type == "NAME":
        keyword = _glued_hint(tok, expected, source, reparse) or _keyword_hint(word, expected)
        if keyword is not None:
            return FlexDSLError(f"unexpected `{word}`, expected {_describe_expected(expected)}", filename,
                                tok.line, tok.column, source, keyword)
    if "COLON" in expected and tok.type != "COLON":
        return FlexDSLError(f"expected `:` before {_TOKEN_WORDS.get(tok.type, '`' + word + '`')}",
                            filename, tok.line, tok.column, source)
    return FlexDSLError(f"unexpected `{word}`, expected {_describe_expected(expected)}",
                        filename, tok.line, tok.column, source)


def syntax_error(err: UnexpectedInput, filename: str, source: str, reparse: Reparse | None = None) -> FlexDSLError:
    """The located FlexDSLError of a lark parse error of `source` (`reparse`: parses a text as `source` was, for
    hints that are checked by parsing them)."""
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
        return _unexpected_token(err, filename, source, reparse)
    if isinstance(err, UnexpectedEOF):
        lines = source_lines(source.rstrip("\n"))
        return FlexDSLError("unexpected end of file", filename, len(lines), len(lines[-1]) + 1, source, _EMPTY_HINT)
    return FlexDSLError(str(err), filename, getattr(err, "line", 0), getattr(err, "column", 0), source)
