"""Hand-written display math of the guides (`$$…$$` in docs/*.md) as MathML, so a guide's HTML
page shows it as the model pages show theirs (no script, no network).

The LaTeX is the subset the guides write: letters, numbers, operators, `_` and `^`, groups `{…}`,
`\\frac`, `\\sqrt`, `\\text`, `\\mathrm`, `\\mathrel`, sized delimiters (`\\Big(`, `\\left(`), spaces
(`\\,` `\\;` `\\quad` …), Greek letters, big operators (`\\sum` with limits below and above) and the
usual named functions and relations. Anything else raises `ValueError` (the caller then shows the
TeX as it is written, never with its backslashes lost).

    to_mathml(r"\\sum_j W_{ij}\\, s_j(t - d)")  # '<math display="block">…</math>'
"""

from __future__ import annotations

import html
import re

_TOKEN = re.compile(r"\\[A-Za-z]+|\\.|[0-9]+(?:\.[0-9]+)?|\s+|.", re.S)
_GREEK = {n: chr(c) for n, c in (
    ("alpha", 0x3B1), ("beta", 0x3B2), ("gamma", 0x3B3), ("delta", 0x3B4), ("epsilon", 0x3F5), ("varepsilon", 0x3B5),
    ("zeta", 0x3B6), ("eta", 0x3B7), ("theta", 0x3B8), ("vartheta", 0x3D1), ("iota", 0x3B9), ("kappa", 0x3BA),
    ("lambda", 0x3BB), ("mu", 0x3BC), ("nu", 0x3BD), ("xi", 0x3BE), ("pi", 0x3C0), ("rho", 0x3C1),
    ("sigma", 0x3C3), ("tau", 0x3C4), ("upsilon", 0x3C5), ("phi", 0x3D5), ("varphi", 0x3C6), ("chi", 0x3C7),
    ("psi", 0x3C8), ("omega", 0x3C9), ("Gamma", 0x393), ("Delta", 0x394), ("Theta", 0x398), ("Lambda", 0x39B),
    ("Xi", 0x39E), ("Pi", 0x3A0), ("Sigma", 0x3A3), ("Phi", 0x3A6), ("Psi", 0x3A8), ("Omega", 0x3A9))}
_OPS = {"approx": "\u2248", "le": "\u2264", "leq": "\u2264", "ge": "\u2265", "geq": "\u2265", "ne": "\u2260",
        "neq": "\u2260", "cdot": "\u22c5", "times": "\u00d7", "pm": "\u00b1", "to": "\u2192", "rightarrow": "\u2192",
        "leftarrow": "\u2190", "in": "\u2208", "sim": "\u223c", "propto": "\u221d", "equiv": "\u2261",
        "ldots": "\u2026", "cdots": "\u22ef", "mid": "|", "vert": "|", "lbrace": "{", "rbrace": "}", "{": "{",
        "}": "}", "|": "\u2016", "langle": "\u27e8", "rangle": "\u27e9"}
_IDENT = {"infty": "\u221e", "partial": "\u2202", "nabla": "\u2207", "ell": "\u2113"}
_BIG = {"sum": "\u2211", "prod": "\u220f", "int": "\u222b"}
_FUNCS = {"max", "min", "exp", "log", "ln", "sin", "cos", "tan", "tanh", "sinh", "cosh", "arctan", "sgn", "det",
          "lim", "sup", "inf", "arg"}
_SPACE = {",": "0.1667em", ":": "0.2222em", ">": "0.2222em", ";": "0.2778em", " ": "0.3333em",
          "quad": "1em", "qquad": "2em", "!": "-0.1667em"}
_SIZES = {"big", "Big", "bigg", "Bigg", "bigl", "bigr", "Bigl", "Bigr", "left", "right"}
_MO = set("+-=<>()[]|/,;:!*'")


class _Parser:
    def __init__(self, tex: str) -> None:
        self.toks = [t for t in _TOKEN.findall(tex)]
        self.i = 0

    def peek(self, skip_space: bool = True) -> str | None:
        while skip_space and self.i < len(self.toks) and self.toks[self.i].isspace():
            self.i += 1
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> str:
        t = self.peek()
        if t is None:
            raise ValueError("unexpected end of the formula")
        self.i += 1
        return t

    def group_text(self) -> str:
        """The raw text of a `{…}` argument (for `\\text`)."""
        if self.peek() != "{":
            raise ValueError("expected `{`")
        self.i += 1
        depth, out = 1, []
        while self.i < len(self.toks):
            t = self.toks[self.i]
            self.i += 1
            depth += (t == "{") - (t == "}")
            if depth == 0:
                return "".join(out)
            out.append(t)
        raise ValueError("unbalanced `{`")

    def row(self, until: str | None = None) -> str:
        items: list[str] = []
        while True:
            t = self.peek()
            if t is None:
                if until is not None:
                    raise ValueError(f"missing `{until}`")
                break
            if t == until:
                self.i += 1
                break
            if t == "}":
                raise ValueError("unbalanced `}`")
            items.append(self.scripted())
        return items[0] if len(items) == 1 else f"<mrow>{''.join(items)}</mrow>"

    def argument(self) -> str:
        if self.peek() == "{":
            self.i += 1
            return self.row("}")
        return self.atom()

    def scripted(self) -> str:
        big = self.peek() in ("\\sum", "\\prod")
        base = self.atom()
        sub = sup = None
        while self.peek() in ("_", "^", "'"):
            t = self.take()
            if t == "'":
                base = f"<msup>{base}<mo>\u2032</mo></msup>"
            elif t == "_":
                sub = self.argument()
            else:
                sup = self.argument()
        tags = ("munderover", "munder", "mover") if big else ("msubsup", "msub", "msup")
        if sub is not None and sup is not None:
            return f"<{tags[0]}>{base}{sub}{sup}</{tags[0]}>"
        if sub is not None:
            return f"<{tags[1]}>{base}{sub}</{tags[1]}>"
        if sup is not None:
            return f"<{tags[2]}>{base}{sup}</{tags[2]}>"
        return base

    def atom(self) -> str:
        t = self.take()
        if t == "{":
            return self.row("}")
        if t[0].isdigit():
            return f"<mn>{t}</mn>"
        if t.isalpha() and len(t) == 1:
            return f"<mi>{t}</mi>"
        if t in _MO:
            return f"<mo>{html.escape(t)}</mo>" if t != "'" else "<mo>\u2032</mo>"
        if not t.startswith("\\"):
            raise ValueError(f"`{t}` is not in the LaTeX this page converts")
        name = t[1:]
        if name in _SPACE:
            return f'<mspace width="{_SPACE[name]}"/>'
        if name in _GREEK:
            return f"<mi>{_GREEK[name]}</mi>"
        if name in _IDENT:
            return f"<mi>{_IDENT[name]}</mi>"
        if name in _OPS:
            return f"<mo>{html.escape(_OPS[name])}</mo>"
        if name in _BIG:
            return f'<mo largeop="true" movablelimits="false">{_BIG[name]}</mo>'
        if name in _FUNCS:  # (applied: the name, function application, its argument, as sympy's printer
            # writes it; alone, `^{\max}`: an operator's name, as TeX's \mathop sets it)
            applied = self.peek() in ("(", "\\left", "\\big", "\\Big", "\\bigl", "\\Bigl")
            return f"<mi>{name}</mi><mo>\u2061</mo>" if applied else f"<mo>{name}</mo>"
        if name in _SIZES:
            d = self.take()
            d = _OPS.get(d[1:], d[1:]) if d.startswith("\\") else d
            return f'<mo stretchy="true">{html.escape(d)}</mo>' if d != "." else ""
        if name == "text" or name == "textrm":
            return f"<mtext>{html.escape(self.group_text())}</mtext>"
        if name in ("mathrm", "operatorname"):
            return f'<mi mathvariant="normal">{html.escape(self.group_text())}</mi>'
        if name == "mathrel":
            inner = self.argument()
            return re.sub(r"<mi>([^<]*)</mi>", r"<mo>\1</mo>", inner)
        if name == "frac":
            return f"<mfrac>{self.argument()}{self.argument()}</mfrac>"
        if name == "sqrt":
            return f"<msqrt>{self.argument()}</msqrt>"
        raise ValueError(f"`\\{name}` is not in the LaTeX this page converts")


def to_mathml(tex: str, display: bool = True) -> str:
    """The formula as a `<math>` element (ValueError: LaTeX outside the subset, see the module doc)."""
    body = _Parser(tex).row()
    kind = ' display="block"' if display else ""
    alt = html.escape(" ".join(tex.split()), quote=True)
    return f'<math{kind} alttext="{alt}">{body}</math>'


__all__ = ["to_mathml"]
