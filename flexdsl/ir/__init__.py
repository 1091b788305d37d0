"""The IR: the checked model as sympy, and everything derived from it symbolically.

Takes a `CheckedModel`; gives `StepModel` (`lower.py`: one step as SSA assignments, ODEs
discretized by `integrate.py`, the surrogate from `surrogates.py`, expressions read by
`tosympy.py`, functions from `functions.py`), `BackwardModel` (`derive.py`: the symbolic
vector-Jacobian product), `Schedule` (`schedule.py`: hoisting, the save/recompute structure)
and `HostProgram` (`host.py`: what the host computes from the params before a call, as data,
and its evaluation). Importing this package imports no sympy (the stages do, on use).
"""
