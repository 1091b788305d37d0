"""The model's ops for Inductor on CUDA: `torch.library.triton_op`s whose bodies launch the
generated kernels through `torch.library.wrap_triton`, so that Inductor traces into them and its
generated code launches the kernels itself (no dispatcher, Python op body or Triton launcher
at run time; the custom ops of `glue.py` cost tens of microseconds a layer and step there).

The bodies are the eager program's own code (`TritonProgram._fwd`, `bwd`) in `kernel.wrapping()`
mode: no launch plans or compiled-kernel cache (they key on data pointers, which traced tensors
lack), every launch through `wrap_triton`. They apply where Inductor compiles for CUDA and
Triton is not interpreted (the interpreter's kernels cannot be wrapped); a noisy model keeps the
ops of `glue.py` (its key is a tensor whose values the body would need as ints while tracing).
Results are those of the same kernels with the same arguments.
"""

from typing import Any, Optional

import torch

from ...settings import env_choice
from ..ops import Op, define
from .args import unpack
from .glue import _BWD_SCHEMA, _FWD_SCHEMA, _OWNER, _namespace, _Owner, autograd_fns, unpack_bwd
from .kernel import wrapping

# FLEXDSL_TRITON_INDUCTOR=0: compiled graphs call the custom ops of glue.py instead (read at trace time;
# bench/compile_ops_gpu.py measures both)
ENABLED = [env_choice("FLEXDSL_TRITON_INDUCTOR") != "0"]


def register_triton_ops(program: Any) -> "tuple[Any, Any]":
    """The model's `fwd` and `bwd` as `triton_op`s (once per model key and process; they run the
    newest program of the key), with the autograd formula of the custom ops."""
    ns = _namespace(program) + "_i"
    _OWNER[ns] = program
    tm: Any = _Owner(ns)

    # (annotated: torch 2.11's triton_op infers the schema from them, whatever its `schema` argument)
    def fwd_body(inputs: list[torch.Tensor], states: list[torch.Tensor], params: list[torch.Tensor],
                 state_vals: list[float], param_vals: list[float], is_tensor: list[bool], store_seqs: bool, save: bool,
                 recompute: bool) -> list[torch.Tensor]:
        p = _OWNER[ns]
        call = p.call(inputs, state_vals, param_vals, is_tensor, store_seqs, recompute)
        with wrapping():
            return p._fwd(inputs, unpack(states, (), call.state_is_t), unpack(params, (), call.param_is_t), call,
                          save)

    def bwd_body(tensors: list[Optional[torch.Tensor]], sizes: list[int], vals: list[float], flags: list[bool],  # noqa: UP045
                 dtype: torch.dtype) -> list[torch.Tensor]:
        p = _OWNER[ns]
        with wrapping():
            return p.bwd(*unpack_bwd(p, tensors, sizes, vals, flags, dtype))

    # (the OpOverloads: what a compiled graph calls)
    fwd, bwd = define(ns, [Op("fwd", fwd_body, _FWD_SCHEMA[len("fwd"):]),
                           Op("bwd", bwd_body, _BWD_SCHEMA[len("bwd"):])], via="triton_op",
                      autograd=lambda handles: autograd_fns(tm, handles[1]), once=True)
    return fwd, bwd


__all__ = ["register_triton_ops", "ENABLED"]
