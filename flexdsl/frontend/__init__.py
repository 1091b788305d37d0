"""The frontend: model text to a checked model, without sympy or torch.

Takes `.neuron` text; gives a `CheckedModel` (`model.py`): `parse.py` (lark: text -> the typed
AST of `ast.py`, every node located), `check.py` (names and rules, located errors), and for a
model that writes units `unitcheck.py` (dimensions) and `convert.py` (values in base units),
with `dims.py` (dimensions and unit definitions). Shared below everything: `catalog.py` (the
built-in names: functions with their numeric forms from `numeric.py`, surrogates, methods,
units) and `evaluate.py` (the one numeric evaluator: AST expressions and host expressions).
"""
