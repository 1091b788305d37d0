"""Keywords are whole words, and syntax errors speak of what the file at hand accepts: a keyword glued to
the word after it (`neuronlif`, `size4`, `synapsesW`, `inputx`) is a located error with the two words apart
as its hint (lark's contextual lexer had matched the keyword as the word's prefix, and loaded it); the
expected tokens of a message are those of the file's kind (a rule's listed a layer's keywords); an empty
block is located at its header; misspelled layer keywords get "did you mean"."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from lark.lexer import PatternStr

import flexdsl
from flexdsl import FlexDSLError
from flexdsl.frontend import parse as P
from flexdsl.frontend.syntax import KEYWORDS

ROOT = Path(__file__).resolve().parents[1]
PARSE = {".neuron": P.parse, ".layer": P.parse_layer, ".rule": P.parse_rule}
START = {".neuron": "start", ".layer": "layer_start", ".rule": "rule_start"}
LAYER = "layer L:\n    neuron lif\n    size 4\n    input s size 3\n"
RULE = "rule R:\n    param A = 0.1\n    state x = 0\n    on pre:\n        x += 1\n        w += A\n"
NEURON = "neuron n:\n    input x\n    state v = 0\n    update:\n        v = v + x\n    spike when v > 1\n" \
         "    on spike:\n        v = 0\n"
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _error(load, text: str) -> FlexDSLError:
    with pytest.raises(FlexDSLError) as e:
        load(text)
    err = e.value
    assert err.line >= 1 and err.column >= 1 and err.source_line, str(err)  # located, the line shown
    assert str(err).splitlines()[2].rstrip().endswith("^"), str(err)
    return err


def test_keywords_are_every_word_of_the_grammar():
    """syntax.KEYWORDS (the words did-you-mean and the glued-word hint know) is every word the grammar spells."""
    words = set()
    for t in P._parser().terminals:
        if isinstance(t.pattern, PatternStr) and _WORD.fullmatch(t.pattern.value):
            words.add(t.pattern.value)
        elif t.name == "DELAY_KIND":
            words |= set(re.findall(r"[a-z]+", t.pattern.value.split("(?!")[0]))
    assert words == set(KEYWORDS)


def _glued_variants(path: Path):
    """The file's text with each keyword token (as the parser read it) glued to the word after it."""
    text = P.normalize(path.read_text())
    parser = P._parser().parse_interactive(text if text.endswith("\n") else text + "\n", start=START[path.suffix])
    tokens = list(parser.iter_parse())
    for tok, nxt in zip(tokens, tokens[1:]):
        if tok.type != "NAME" and str(tok) in KEYWORDS and nxt.line == tok.line and _WORD.match(str(nxt)) \
                and text[tok.end_pos:nxt.start_pos].strip() == "":
            yield str(tok), tok.line, text[:tok.end_pos] + text[nxt.start_pos:]


LIBRARY = sorted(p for p in (ROOT / "neurons").iterdir() if p.suffix in PARSE)


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: p.name)
def test_every_keyword_glued_to_the_next_word_is_a_located_error(path):
    """Every keyword of every library file (all the keywords of the three grammars between them), written
    without the space after it, is refused where it stands: `param dt` as `paramdt`, `synapses W` as
    `synapsesW`; where the glued word is a name to the parser, loading refuses it there."""
    seen = 0
    for word, line, glued in _glued_variants(path):
        seen += 1
        try:
            PARSE[path.suffix](glued, path.name)
        except FlexDSLError as e:
            assert e.line == line and e.source_line, (word, str(e))
            continue
        # (after a number a glued word reads as a unit, `0 unlessrefractory`; `letx = 1` assigns a new
        # temporary `letx`, and the uses of `x` are unknown names)
        assert word in ("unless", "learnable", "crosses", "max", "let"), (word, line)
        load = flexdsl.load_rule if path.suffix == ".rule" else flexdsl.loads
        with pytest.raises(FlexDSLError) as e:
            load(glued)
        assert e.value.line == line or word == "let", (word, str(e.value))
    assert seen


@pytest.mark.parametrize("load, text, glued, hint", [
    (flexdsl.loads, LAYER, "    neuron lif\n", "neuron lif"),
    (flexdsl.loads, LAYER, "    size 4\n", "size 4"),
    (flexdsl.loads, LAYER + "    synapses W from s to x\n", "    synapses W from s to x\n", "synapses W"),
    (flexdsl.loads, LAYER + "    synapses W from s to x:\n        delay 3\n", "        delay 3\n", "delay 3"),
    (flexdsl.loads, LAYER + "    synapses W from s to x:\n        connect dense\n", "        connect dense\n",
     "connect dense"),
    (flexdsl.loads, NEURON, "    input x\n", "input x"),
    (flexdsl.loads, NEURON, "    state v = 0\n", "state v"),
    (flexdsl.load_rule, RULE + "    weight w\n", "    weight w\n", "weight w"),
])
def test_glued_keyword_hint_is_the_two_words(load, text, glued, hint):
    kw, rest = hint.split(" ", 1)
    bad = text.replace(glued, glued.replace(f"{kw} {rest}", kw + rest))
    assert bad != text
    err = _error(load, bad)
    assert err.line == bad[:bad.index(kw + rest)].count("\n") + 1
    assert f"`{hint}`" in err.hint and "whole word" in err.hint


def test_glued_layer_keywords_of_the_report_are_refused():
    err = _error(flexdsl.loads, "layer L:\n    neuronlif\n    size4\n    input s size 3\n    synapsesW from s to x\n")
    assert (err.line, err.column) == (2, 5) and "`neuron lif`" in err.hint


def test_a_delay_kind_is_a_whole_word():
    """`axonalx` is a name, not `axonal x` (the delay kinds' terminal has a priority over names)."""
    err = _error(flexdsl.loads, LAYER + "    synapses W from s to x:\n        delay axonalx max 3\n")
    assert err.line == 6
    ok = P.parse_layer(LAYER + "    synapses W from s to x:\n        delay axonal max 3\n")
    assert ok.items[-1].delay_kind == "axonal"


@pytest.mark.parametrize("line, word, keyword", [
    ("    sizes 4\n", "sizes", "size"),
    ("    inputs s size 3\n", "inputs", "input"),
    ("    synapse W from s to x\n", "synapse", "synapses"),
    ("    neurons lif\n", "neurons", "neuron"),
])
def test_misspelled_layer_keywords_get_did_you_mean(line, word, keyword):
    text = "layer L:\n" + line + "    neuron lif\n    size 4\n    input s size 3\n"
    err = _error(flexdsl.loads, text)
    assert (err.line, err.column) == (2, 5)
    assert f"unexpected `{word}`" in err.reason and f"did you mean `{keyword}`" in err.hint


def test_misspelled_synapse_keyword_gets_did_you_mean():
    err = _error(flexdsl.loads, LAYER + "    synapses W from s to x:\n        conect dense\n")
    assert (err.line, err.column) == (6, 9) and "did you mean `connect`" in err.hint


@pytest.mark.parametrize("text, header", [
    (LAYER + "    synapses W from s to x:\n", 5),
    (LAYER + "    synapses W from s to x:   # to do\n\n", 5),
    (LAYER + "    synapses W from s to x:\n    synapses V from s to x\n", 5),
])
def test_an_empty_synapses_block_is_located_at_its_header(text, header):
    """Was "unexpected dedent" at a line past the end of the file (no line shown), hint "expected indent"."""
    err = _error(flexdsl.loads, text)
    assert (err.line, err.column) == (header, 5)
    assert "empty" in err.reason and "synapses W from s to x:" in err.source_line
    assert "drop the `:`" in err.hint and "dedent" not in str(err)


def test_an_empty_neuron_block_is_located_at_its_header():
    err = _error(flexdsl.loads, NEURON.replace("    on spike:\n        v = 0\n", "    on spike:\n"))
    assert err.line == 7 and "empty" in err.reason and "indented" in err.hint


def test_a_layer_with_only_a_docstring_lists_layer_keywords():
    err = _error(flexdsl.loads, 'layer L:\n    """doc"""\n')
    assert err.line == 2
    for word in ("`neuron`", "`size`", "`input`", "`synapses`"):
        assert word in err.hint
    for word in ("`equations`", "`param`", "`on`", "`output`"):  # (a neuron's keywords)
        assert word not in str(err)


NEURON_ONLY = {"equations", "param", "output", "update", "surrogate", "refractory", "spike"}
LAYER_ONLY = {"bias", "connect", "delay", "synapses", "size", "neuron"}


def _listed(err: FlexDSLError) -> set[str]:
    return set(re.findall(r"`(\w+)`", err.reason.split(", expected", 1)[1]))


def test_a_rules_messages_list_only_what_a_rule_accepts():
    """`spike when` in a rule listed `bias`, `connect`, `delay`, ... (the LALR state's lookaheads are
    shared with the layer's synapses block)."""
    err = _error(flexdsl.load_rule, RULE + "    spike when x > 1\n")
    assert err.line == 7
    listed = _listed(err)
    assert listed and not listed & LAYER_ONLY, err.reason
    err = _error(flexdsl.load_rule, 'rule R:\n    """doc"""\n    spike when x > 1\n')
    assert not _listed(err) & (LAYER_ONLY | {"refractory", "surrogate"}), err.reason


def test_a_layers_messages_list_only_what_a_layer_accepts():
    err = _error(flexdsl.loads, LAYER + "    param a = 1\n")
    assert not _listed(err) & (NEURON_ONLY - {"neuron"}), err.reason
    err = _error(flexdsl.loads, LAYER + "    synapses W from s to x:\n        param a = 1\n")
    assert not _listed(err) & {"equations", "param", "output", "update", "weight"}, err.reason


def test_a_header_alone_is_an_empty_block_at_the_end_of_file():
    err = _error(flexdsl.loads, "neuron X:")
    assert (err.line, err.column) == (1, 1) and "empty" in err.reason and "end of file" in err.reason
