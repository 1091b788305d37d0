"""The e-prop side of a recurrent layer (`flexdsl.recurrent(..., learning="eprop")`): the checks at build
time (located errors for what e-prop cannot serve), the readout and its feedback, and a training call
(`EPropLearning`, a mixin of `RecurrentModule`), which runs `runtime/eprop.py`'s `EPropCall`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ..backends import eprop as programs
from ..errors import did_you_mean
from ..settings import env_choice
from . import eprop as core
from .eprop import FEEDBACK, LEARNING, EPropCall, Plan, stepper
from .feedback import Readout

_UNCOMPILED: dict[str, Any] = {}


class EPropLearning:
    """The e-prop side of `RecurrentModule` (a mixin): the build-time checks, the readout and
    feedback, and a training call (`_eprop_call`)."""

    def _setup_learning(self, learning: Any, readout: Any, feedback: Any) -> None:
        view = self.__dict__["_view"]
        ck = view.compiled.checked
        where = ck.ast.pos
        if not isinstance(learning, str) or learning not in LEARNING:
            raise view.error(f"learning must be 'bptt' or 'eprop', not {learning!r}", where,
                             did_you_mean(str(learning), LEARNING) or
                             "'bptt': backpropagation through time; 'eprop': e-prop (online, eligibility traces)")
        self.__dict__["_learning"] = learning
        self.__dict__["_eprop"] = None
        if learning != "eprop":
            if readout is not None or not (isinstance(feedback, str) and feedback == "symmetric"):
                raise view.error("readout= and feedback= belong to learning='eprop'", where,
                                 "pass learning='eprop', or build the readout as a module of your own")
            return
        self.__dict__["_eprop"] = self._eprop_program(view, ck)
        self._setup_readout(view, readout, feedback)

    def _eprop_program(self, view: Any, ck: Any) -> programs.EPropProgram:
        """The model's e-prop step, or a located error saying why e-prop cannot train this layer."""
        hint = "use learning='bptt' (backpropagation through time)"
        s = self.__dict__["_in_delay"] or self.__dict__["_rec_delay"]
        if s is not None:  # (located at the synapses' delay line)
            raise self.__dict__["_layer"].error(f"e-prop does not run layers with delays yet (`{s.name}` has them)",
                                                s.delay_pos, hint)
        if ck.stochastic:
            raise view.error("e-prop cannot run a noisy model: its e-prop step does not replay the model's random draws",
                             ck.noise_pos, hint + ", or a noise-free variant of the model")
        names = [i.name for i in ck.inputs]
        port = names.index(self.port)
        prog = programs.program(view.compiled, port)
        outs = [n for n, _ in ck.outputs]
        if not any(f.startswith(("b[", "g[")) for f in prog.factors):
            decl = next(i for i in ck.inputs if i.name == self.port)
            raise view.error(f"the input `{self.port}` reaches neither a state nor an output of {ck.name} with a "
                             "gradient: the weights into it get no eligibility", decl.pos,
                             "e-prop needs a differentiable path from the port to the states (a spike's surrogate "
                             "counts); check the model's `update:` block")
        self._refuse_unreached_outputs(view, ck, prog)
        src = outs.index(self.source)
        if not any(f.startswith((f"c[{self.source},", f"g[{self.source}]")) for f in prog.factors):
            pos = next(p for n, p in ck.outputs if n == self.source)
            raise view.error(f"the fed-back output `{self.source}` does not depend on the neuron's states or input "
                             "with a gradient: no learning signal reaches the weights", pos, hint)
        self.__dict__["_eprop_form"] = (port, src)
        return prog

    def _refuse_unreached_outputs(self, view: Any, ck: Any, prog: Any) -> None:
        """The port reaches an output through a gradient (directly, or through states the port's
        current moves and the states they move over the steps); else the weights' e-prop gradient is 0
        at every step: a located error naming the states the port reaches."""
        fs = set(prog.factors)
        states = [s for s in prog.meta["states"]]
        reached = {a for a in states if f"b[{a}]" in fs}
        grow = True
        while grow:  # (J[a,b]: the state a's next value moves with b's)
            new = {a for a in states for b in reached if f"J[{a},{b}]" in fs} - reached
            reached |= new
            grow = bool(new)
        outs = [n for n, _ in ck.outputs]
        if any(f"g[{o}]" in fs or any(f"c[{o},{a}]" in fs for a in reached) for o in outs):
            return
        decl = next(i for i in ck.inputs if i.name == self.port)
        moved = ", ".join(f"`{a}`" for a in sorted(reached)) or "no state"
        raise view.error(f"the input `{self.port}` moves {moved}, but no output of {ck.name} depends on "
                         f"{'them' if len(reached) > 1 else 'it'} with a gradient: e-prop's updates of the weights "
                         "into it would be 0 at every step", decl.pos,
                         "make the output (e.g. the spike's condition) read that state, or use learning='bptt'")

    def _setup_readout(self, view: Any, readout: Any, feedback: Any) -> None:
        ck = view.compiled.checked
        where = ck.ast.pos
        H = self.hidden
        linear = None
        if readout is not None:
            if isinstance(readout, bool) or not isinstance(readout, int | nn.Module):
                raise view.error(f"readout must be the number of outputs or an nn.Linear(hidden, n_out), not "
                                 f"{type(readout).__name__}", where, f"e.g. readout=10 (nn.Linear({H}, 10))")
            if isinstance(readout, int):
                if readout <= 0:
                    raise view.error(f"readout must be a positive number of outputs, not {readout}", where)
                try:
                    linear = nn.Linear(H, readout)
                except (RuntimeError, TypeError, OverflowError, MemoryError, ValueError):
                    raise view.error(f"readout={readout}: a readout of {readout} outputs could not be made (its weight "
                                     f"[{readout}, {H}] is beyond what this machine allocates)", where,
                                     "a number of outputs such as readout=10") from None
            else:
                w = getattr(readout, "weight", None)
                if not isinstance(readout, nn.Linear):
                    raise view.error(f"the readout is a {type(readout).__name__}; an e-prop readout is an "
                                     f"nn.Linear({H}, n_out) of the layer's spikes (its weight is the symmetric "
                                     "feedback)", where, f"e.g. readout=nn.Linear({H}, 10), or readout=10")
                if isinstance(w, nn.parameter.UninitializedParameter):
                    raise view.error("the readout is lazy (its weight has no shape yet); an e-prop readout's weight is "
                                     "the feedback, needed before the first call", where,
                                     f"e.g. readout=nn.Linear({H}, n_out), or readout=n_out")
                if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.shape[1] != H:
                    got = tuple(w.shape) if isinstance(w, torch.Tensor) else "no weight"
                    raise view.error(f"the readout's weight is {got}; an e-prop readout reads the layer's {H} neurons: "
                                     f"a weight [n_out, {H}]", where, f"e.g. readout=nn.Linear({H}, n_out)")
                linear = readout
        B = None
        if isinstance(feedback, str):
            if feedback not in FEEDBACK:
                raise view.error(f"feedback must be 'symmetric', 'random' or a [n_out, hidden] tensor, not "
                                 f"{feedback!r}", where, did_you_mean(feedback, FEEDBACK))
            if feedback == "random":
                if linear is None:
                    raise view.error("feedback='random' needs the readout: the random matrix has its shape", where,
                                     f"pass readout=n_out (an nn.Linear({H}, n_out) made here) or readout=your_linear")
                n_out = linear.weight.shape[0]
                B = torch.randn(n_out, H, dtype=linear.weight.dtype) / H ** 0.5
        elif isinstance(feedback, torch.Tensor):
            if linear is None:
                raise view.error("a feedback matrix needs the readout it stands for", where,
                                 f"pass readout=n_out or readout=nn.Linear({H}, n_out)")
            want = (linear.weight.shape[0], H)
            if tuple(feedback.shape) != want or not feedback.is_floating_point() or feedback.layout != torch.strided:
                raise view.error(f"the feedback matrix is {tuple(feedback.shape)} {feedback.dtype} "
                                 f"({str(feedback.layout).replace('torch.', '')}); it stands for the readout's weight: "
                                 f"a dense floating-point [n_out, hidden] = {want} tensor", where,
                                 f"e.g. feedback=torch.randn{want} / {H} ** 0.5")
            if feedback.device.type == "meta" or not bool(torch.isfinite(feedback).all()):
                raise view.error("the feedback matrix has values that are not finite numbers (NaN, infinite, or "
                                 "a meta tensor without values)", where, f"e.g. feedback=torch.randn{want} / {H} ** 0.5")
            B = feedback.detach().clone().to(linear.weight.device)
        else:
            raise view.error(f"feedback must be 'symmetric', 'random' or a tensor, not {type(feedback).__name__}", where)
        c = view.compiled
        self.readout = Readout(linear, B, (c.filename, where.line, where.column, c.text)) if linear is not None else None

    def _eprop_scans(self, like: torch.Tensor) -> bool:
        """Whether a training call on tensors like `like` runs its steps on the layer's scan (CUDA, not
        float64); elsewhere the steps run one by one and the scan is not even loaded."""
        return like.device.type in core.SCAN_DEVICES and like.dtype != torch.float64

    @property
    def learning(self) -> str:
        return self.__dict__.get("_learning", "bptt")

    def _eprop_call(self, *args: Any) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
        """`_eprop_run`, which torch.compile runs as it is (a Python loop and kernels of its own)."""
        fn = _UNCOMPILED.get("run")
        if fn is None:  # (torch.compiler.disable imports torch._dynamo: only once a layer learns by e-prop)
            fn = _UNCOMPILED["run"] = torch.compiler.disable(EPropLearning._eprop_run)
        return fn(self, *args)

    def _eprop_run(self, x3: torch.Tensor, w_in: Any, bias: Any, w: torch.Tensor, s0: torch.Tensor,
                    all_inputs: Sequence[Any], states: Sequence[Any], params: Sequence[Any], scan: tuple
                    ) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
        """A training call: (outputs `[T, F, H]`, final states, final source); the eligibility kept.
        `all_inputs`: the model's inputs, None at the port; `scan`: the layer's scan (program, dense,
        whether s0 is zeros), which runs the steps on CUDA (`_scanned`)."""
        view = self.__dict__["_view"]
        inputs = [i for i in all_inputs if i is not None]
        decls = view.compiled.checked.inputs
        wants = [d for d, t in zip(decls, all_inputs) if isinstance(t, torch.Tensor) and t.requires_grad]
        if x3.requires_grad:
            wants.insert(0, next(i for i in decls if i.name == self.port))
        if wants:
            raise view.error(f"a layer that learns by e-prop gives its inputs no gradient, but input `{wants[0].name}` "
                             "requires one", wants[0].pos,
                             "detach it (x.detach()), or use learning='bptt' to train what is before")
        port, src = self.__dict__["_eprop_form"]
        F, H = s0.shape
        kept = self.__dict__["_kept"].get("eligibility")
        kept = kept.resolve().like(s0) if kept is not None else None
        if kept is not None and kept.batch() != F:
            raise view.error(f"the kept eligibility is of a batch of {kept.batch()}, this call's of {F}", None,
                             "call m.reset() before a batch of another size")
        diag = [] if w.dim() == 2 else ["rec"]
        prog = self.__dict__["_eprop"]
        meta = prog.meta
        learn = [meta["params"].index(n) for n in meta["learnable"]]
        diag += [f"param:{j}:{k}" for j, k in enumerate(learn)
                 if isinstance(params[k], torch.Tensor) and params[k].requires_grad]
        st = [s if isinstance(s, torch.Tensor) else torch.full((F, H), float(s), dtype=s0.dtype, device=s0.device)
              for s in states]
        inits = self._initial_tracked(view, s0)
        for k in inits:  # (after a reset the start is the initial value: its gradient goes by `init:k`)
            if view.m._states[view.m._state_names[k]] is None:
                st[k] = st[k].detach()
        diag += [f"init:{k}" for k in inits]
        f64 = x3.dtype == torch.float64  # (the kernel sums in float32: float64 runs torch's operations)
        plan = Plan(prog, port, src, w.dim() == 2, bias is not None, len(inputs), diag, kept,
                    None if f64 else programs.walker(x3), self._stepper(prog, port, w.dim() == 2, x3.is_cuda and not f64))
        c = view.compiled
        plan.at = (c.filename, c.checked.ast.pos.line, c.checked.ast.pos.column, c.text)
        if x3.shape[0] == 0:  # (no steps: no outputs, the states and the kept eligibility as they were;
            # the outputs in the weights' graph, so that a loss of them backpropagates: zeros, as BPTT's)
            zero = sum((t.reshape(-1)[:0].sum() for t in (w_in, bias, w, *params)
                        if isinstance(t, torch.Tensor) and t.requires_grad and torch.is_grad_enabled()), 0.0)
            return [s0.new_zeros((0, F, H)) + zero for _ in meta["outputs"]], st, s0
        if self._eprop_scans(x3):
            plan.scanned = self._scanned(x3, w_in, bias, w, s0, all_inputs, st, params, scan)
        res = EPropCall.apply(plan, x3, w_in, bias, w, s0, *params, *inputs, *st, *inits.values())
        n_out = len(meta["outputs"])
        self.__dict__["_kept"]["eligibility"] = plan.pending
        return list(res[:n_out]), list(res[n_out:]), res[src][-1]

    @staticmethod
    def _initial_tracked(view: Any, s0: torch.Tensor) -> dict[int, torch.Tensor]:
        """The states whose initial value a learnable param sets (`v = v_reset`), by index: that value
        `[F, H]` with its graph, the way of their gradient to the param in every call since the reset
        (the states' dependence on it carried by the eligibility `init:k`)."""
        if not torch.is_grad_enabled():
            return {}
        F, H = s0.shape
        vals = view.m._states_for(s0, torch.Size([F, H]), {})
        return {k: torch.broadcast_to(v, (F, H)) for k, v in enumerate(vals)
                if isinstance(v, torch.Tensor) and v.requires_grad}

    def _scanned(self, x3: torch.Tensor, w_in: Any, bias: Any, w: torch.Tensor, s0: torch.Tensor,
                 all_inputs: Sequence[Any], states: Sequence[torch.Tensor], params: Sequence[Any], scan: tuple):
        """The steps of a call by the layer's own scan (the compiled kernels), then the states before
        each step by the neuron's own kernels on the port's currents: `() -> (outputs, S, currents,
        states before each step, final states)`."""
        from ..backends import recurrent as scans

        prog, dense, s0_zero = scan
        view, src = self.__dict__["_view"], self.__dict__["_eprop_form"][1]

        def run():
            with torch.no_grad():
                outs, fins = scans.scan(prog, x3, w_in, bias, w, s0, list(all_inputs), list(states), list(params),
                                        dense, None, s0_zero=s0_zero)
                S = torch.cat([s0[None], outs[src]])
                ix = x3 @ w_in.t() if w_in is not None else x3
                ix = ix + bias if bias is not None else ix
                cur = ix + (S[:-1] @ w.t() if w.dim() == 2 else S[:-1] * w)
                ins = [cur if i is None else i for i in all_inputs]
                neuron = view.m
                given = dict(zip(neuron._state_names, states))
                _, res = neuron._run(ins, given, True)
                hs = [torch.cat([h0[None], q[:-1]]) for h0, q in zip(states, res.seqs)]
            return outs, S, cur, hs, fins

        return run

    def _stepper(self, prog: programs.EPropProgram, port: int, dense_rec: bool, compiled: bool):
        """One step of the layer (`stepper`), compiled on CUDA with FLEXDSL_EPROP_COMPILE=1."""
        key = (id(prog), port, dense_rec, compiled and settings_compile())
        cache = self.__dict__.setdefault("_steppers", {})
        if key not in cache:
            cache[key] = stepper(prog, port, dense_rec, key[-1])
        return cache[key]


def settings_compile() -> bool:
    """Whether the steps one by one run compiled on CUDA (FLEXDSL_EPROP_COMPILE=1; by default eagerly:
    there they are the rare fallback of the scan's steps, not worth a compilation)."""
    return env_choice("FLEXDSL_EPROP_COMPILE") == "1"


__all__ = ["EPropLearning", "Readout"]
