"""The one place a call's params are checked, for every way a model runs: a neuron module's eager
call, a recurrent layer's call (through its neuron), and a `torch.compile`d call (through the op
`flexdsl::checked_params`, which runs the same check when the compiled call runs). A mixin of
`NeuronModule`.

What is checked, once per change of the params and per precision a call computes in:
- every param finite, every `where` constraint, a defined step (`slots._validate`'s float64 checks);
- the params and constants in the call's precision (a value that is 0 or beyond the range of
  float32/float16 where the step needs it nonzero or finite: `params.check_invariants`,
  `check_constants`, `check_constant_results`).

What counts as a change: an assignment through the API (`m.tau = ...`, `load_state_dict`, which
validate before they store), and any in-place change autograd sees (an optimizer step, `p.mul_()`
under `torch.no_grad()`, a copy into a buffer): the tensors' version counters, data pointers,
shapes and dtypes form a fingerprint compared at every call (a few integers: nothing is read
from a device). A write through `.data` bypasses PyTorch's version counter: the fingerprint holds
the values of CPU tensors of at most 65,536 values too; on a GPU such a write is not seen (reading
the device's memory at every call would wait for it), and `check_finite=True` checks every value
at every call.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import torch

from ..backends.base import transformed
from ..backends.ops import Op, define
from .params import check_constant_results, check_constants


class CallChecks:
    """NeuronModule's checks of its params before a call (see the module docstring)."""

    def _fingerprint(self) -> tuple:
        """What identifies the params' tensors' contents: version counters, pointers, shapes and
        dtypes, and for CPU tensors of at most `_HASHED` values their values (a write through
        `.data` bypasses the version counter; reading a device's memory would wait for the device,
        so there it is not read). A few microseconds a call."""
        out: list[Any] = []
        for t in (*self._parameters.values(), *self._buffers.values()):
            if t is None:
                continue
            try:
                out += (t._version, t.data_ptr(), t.dtype, t.shape)
                if transformed(t):
                    return (object(),)  # (a torch.func tensor: never equal to the last one, checked at every call)
                if t.is_cpu:
                    n = t.numel()
                    if n <= 16:
                        out.append(t.detach().tolist())
                    elif n <= _HASHED:
                        out.append(t.detach().numpy(force=True).tobytes())
            except RuntimeError:  # (a tensor without memory of its own: inside a torch.func transform)
                return (object(),)
        return tuple(out)

    def _call_params(self, program: Any, x0: torch.Tensor) -> list[Any]:
        """The params of a call on inputs like `x0` run by `program`, checked (see the module
        docstring). Under a trace the float params come through the op `flexdsl::checked_params`,
        which runs the same checks when the compiled call runs (its fingerprint compare: a few
        integers when nothing changed) and raises the eager call's error."""
        dt = getattr(program, "computes_in", None) or x0.dtype
        call = (x0.dtype, dt)  # (a bounded param is inside its bounds in both: runtime/bounds.py)
        if torch.compiler.is_compiling():
            t = check_op()(self._fixed_t, self.__dict__["_check_key"], str(dt), str(x0.dtype))
            return self._traced_param_list(t, call)
        params = self._param_list(call)
        self._check_values(dt, x0.dtype, params)
        return params


    def _check_values(self, dt: torch.dtype, dtype: torch.dtype, params: list[Any] | None = None) -> None:
        """The eager check: the full float64 validation when the fingerprint moved, the checks in
        precision `dt` (inputs in `dtype`) once per change."""
        d = self.__dict__
        fp = self._fingerprint() if (self._parameters or self._buffers) else ()
        if fp != d.get("_checked_fp"):
            self._dtypes_checked.clear()
            self._init_cache.clear()
            self._validate_tensors()
            d["_checked_fp"] = fp
        if (dt, dtype) not in self._dtypes_checked:
            check_constant_results(self._compiled, dtype)
            if dt != torch.float64:
                self._check_invariants(params if params is not None else self._param_list((dtype, dt)), dt)
                check_constants(self._compiled, dt)
            self._dtypes_checked.add((dt, dtype))

    def _validate_tensors(self) -> None:
        """The float64 checks of the params as they are now (after a change the API did not see:
        an optimizer step, an in-place op): finite, every `where` constraint, a defined step."""
        env = self._param_env()
        tensors = {n: v for n, v in env.items() if isinstance(v, torch.Tensor)}
        for n, v in tensors.items():
            bad = ~torch.isfinite(v)
            if bool(bad.any()):
                what = "nan" if bool(torch.isnan(v).any()) else "infinite"
                b = self._bounds.get(n)
                where = f" (from its Parameter `{b.raw}`)" if b is not None else ""
                raise self._error(f"param `{n}` is {what}{where}: it was changed in place (an optimizer step, an "
                                  "in-place op) to a value that is not a finite number", self._param_decls[n].pos,
                                  "a gradient step too large, or a NaN gradient: lower the learning rate, clip the "
                                  "gradients, and assign a finite value (m." + n + " = ...) to go on")
        self._validate({}, tensors)



_HASHED = 1 << 16  # (CPU tensors of at most this many values are compared by their bytes)
_MODULES: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
_OP: list = []
_LOCK = threading.Lock()


def register(module: Any) -> str:
    """The name under which the check op finds `module` (a string: what a graph can hold)."""
    k = f"m{id(module):x}"
    with _LOCK:
        _MODULES[k] = module
    check_op()  # (defined here, outside any trace)
    return k


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name.removeprefix("torch."))


def _checked_params(fixed: torch.Tensor, key: str, dt: str, dtype: str) -> torch.Tensor:
    _MODULES[key]._check_values(_dtype(dt), _dtype(dtype))
    return fixed.clone()  # (an op's output may not alias its input; a few float64 values)


def check_op():
    """`flexdsl::checked_params(fixed, key, dt, dtype) -> fixed`: a traced call's params checked
    when the call runs (defined on first use: no torch.library work when flexdsl is imported)."""
    if _OP:  # (the path a trace takes: the op is defined before any trace, at registration)
        return _OP[0]
    # (`define` holds a lock: two threads defining it at once would destroy one Library under the other)
    schema = "(Tensor fixed, str key, str dt, str dtype) -> Tensor"
    (op,) = define("flexdsl", [Op("checked_params", _checked_params, schema,
                                  fake=lambda fixed, key, dt, dtype: torch.empty_like(fixed))], once=True)
    _OP[:] = [op]
    return op


__all__ = ["CallChecks", "check_op", "register"]
