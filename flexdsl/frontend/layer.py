"""Checking a layer: `A.Layer` (a `.layer` file, or the layer `flexdsl.recurrent` and
`flexdsl.feedforward` describe) against its neuron's `CheckedModel` -> `CheckedLayer`.

A layer is a population of `size` neurons of one model plus its synaptic inputs. Each
`synapses W from PRE to PORT` carries PRE (a layer input, or one of the neuron's outputs, which
arrives one step late: recurrent) into the neuron's input PORT through the weights `W`
(connectivity `dense` `[size, size_of(PRE)]`, `one_to_one` `[size]`, or `mask`: dense times a fixed
0/1 mask given at load), optionally plus a bias. A neuron input no synapse feeds is a direct input
of the layer (`[T, *batch, size]`). Every rule is a located `FlexDSLError`.
"""

from __future__ import annotations

import keyword
import math
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import FlexDSLError, did_you_mean
from . import ast as A
from .model import CheckedModel

CONNECT = {"dense": "dense", "all": "dense", "all_to_all": "dense", "one_to_one": "one_to_one",
           "mask": "mask"}
MAX_DELAY = 100_000  # steps a delay may reach (the layer keeps that many steps of its input)
MAX_WEIGHTS = 2**32  # weights of one dense synapse group (16 GiB in float32)
_RESERVED = ("neuron", "feedback", "mask", "size", "hidden", "in_features")


@dataclass(frozen=True)
class CheckedSynapse:
    name: str  # the weight's name (a parameter of the layer's module)
    pre: str
    port: str
    port_index: int  # among the neuron's inputs
    recurrent: bool  # PRE is an output of the neuron, delivered one step late
    pre_index: int  # among the layer's inputs, or (recurrent) the neuron's outputs
    pre_size: int
    connect: str  # "dense", "one_to_one" or "mask"
    bias: str | None  # the bias' name, if any
    pos: A.Pos
    connect_pos: A.Pos
    delay_kind: str | None = None  # None, "uniform" (every connection `delay` steps), "axonal", "synaptic", "dendritic"
    delay: int = 0  # the delay in steps (uniform), or the largest one (the others: given at load)
    delay_pos: A.Pos | None = None
    delay_interp: str | None = None  # learnable delays: "gauss" or "linear" (their relaxation); None: fixed
    rule: str | None = None  # the plasticity rule's reference (`rule stdp`, `rule "my.rule"`), None: static weights
    rule_is_path: bool = False
    rule_mode: str = "window"  # "window" (weights held over a call) or "online" (changed every step)
    rule_pos: A.Pos | None = None

    @property
    def delay_learnable(self) -> bool:
        return self.delay_interp is not None

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.pre_size,) if self.connect == "one_to_one" else (-1, self.pre_size)


@dataclass(frozen=True)
class CheckedLayer:
    ast: A.Layer
    neuron: CheckedModel
    size: int
    inputs: tuple[tuple[str, int, A.Pos], ...]  # (name, size, where declared)
    synapses: tuple[CheckedSynapse, ...]
    direct: tuple[str, ...]  # the neuron's inputs no synapse feeds: the layer takes them as they are

    @property
    def name(self) -> str:
        return self.ast.name

    @property
    def recurrent(self) -> CheckedSynapse | None:
        return next((s for s in self.synapses if s.recurrent), None)

    def error(self, msg: str, pos: A.Pos | None, hint: str | None = None) -> FlexDSLError:
        p = pos or self.ast.pos
        return FlexDSLError(msg, self.ast.filename, p.line, p.column, self.ast.source, hint)

    def weight_shape(self, syn: CheckedSynapse) -> tuple[int, ...]:
        return (self.size,) if syn.connect == "one_to_one" else (self.size, syn.pre_size)


def neuron_ref(layer: A.Layer) -> A.LayerNeuron:
    """The layer's one `neuron` line."""
    refs = layer.of(A.LayerNeuron)
    if not refs:
        raise _err(layer, f"layer `{layer.name}` names no neuron model", layer.pos,
                   "add a line `neuron lif` (a library model) or `neuron \"my.neuron\"` (a file)")
    if len(refs) > 1:
        raise _err(layer, "a layer has one neuron model; this is a second `neuron` line", refs[1].pos,
                   "one population per layer: make a layer per model")
    if refs[0].is_path and not refs[0].ref.endswith(".neuron"):  # (a layer's text names model files only)
        raise _err(layer, f"`{refs[0].ref}` is not a `.neuron` file", refs[0].pos,
                   "a layer's neuron is a library model (`neuron lif`) or a file ending in .neuron")
    return refs[0]


def check_layer(layer: A.Layer, neuron: CheckedModel, size: int | None = None,
                input_sizes: Mapping[str, int] | None = None, dt: float | None = None,
                reserved: frozenset[str] = frozenset()) -> CheckedLayer:
    """The layer checked against its neuron (`size`, `input_sizes`: given at load, where the file
    leaves them out; a value the file also gives must agree; `dt`: the neuron's step in base
    units, which a delay in time units is divided by, None where the model has no `dt`;
    `reserved`: the names the layer's module has, no weight's or bias's)."""
    neuron_ref(layer)
    n = _size(layer, size)
    inputs = _inputs(layer, input_sizes or {})
    outs = [o for o, _ in neuron.outputs]
    for name, _, pos in inputs:  # (`from spike` would read the input, never the neuron's output)
        if name in outs:
            raise _err(layer, f"input `{name}` has the name of `{neuron.name}`'s output `{name}`: a synapse "
                              f"`from {name}` could mean either", pos, f"rename the input, e.g. `input {name}_in`")
    ports = [i.name for i in neuron.inputs]
    syns = layer.of(A.Synapses)
    if not syns:
        raise _err(layer, f"layer `{layer.name}` has no synapses", layer.pos,
                   "add one: `synapses W from <input> to " + (ports[0] if ports else "<neuron input>") + "`")
    _unique_names(layer, neuron, syns, [i[0] for i in inputs], reserved)
    checked = [_synapse(layer, neuron, s, inputs, outs, ports, n, dt) for s in syns]
    total = sum(n if c.connect == "one_to_one" else n * c.pre_size for c in checked)
    if total > MAX_WEIGHTS:  # (the layer's weights together: one limit, before anything is allocated)
        raise _err(layer, f"layer `{layer.name}` would hold {total:,} weights in its synapse groups together (the "
                          f"limit is {MAX_WEIGHTS:,}: {MAX_WEIGHTS * 4 // 2**30} GiB in float32)", layer.pos,
                   "a smaller layer, or fewer or one_to_one synapse groups")
    rec = [s for s in checked if s.recurrent]
    if len(rec) > 1:
        raise _err(layer, "a layer has at most one recurrent synapse (from an output of its own neuron)",
                   rec[1].pos, f"`{rec[0].name}` is one already; sum the feedback into one weight")
    used = {s.pre for s in checked}
    for name, _, pos in inputs:
        if name not in used:
            raise _err(layer, f"input `{name}` feeds no synapse", pos,
                       f"add `synapses W from {name} to {ports[0] if ports else '<port>'}`, or remove it")
    fed = {s.port for s in checked}
    direct = tuple(p for p in ports if p not in fed)
    return CheckedLayer(layer, neuron, n, tuple(inputs), tuple(checked), direct)


def _err(layer: A.Layer, msg: str, pos: A.Pos | None, hint: str | None = None) -> FlexDSLError:
    p = pos or layer.pos
    return FlexDSLError(msg, layer.filename, p.line, p.column, layer.source, hint)


def _size(layer: A.Layer, given: int | None) -> int:
    sizes = layer.of(A.LayerSize)
    if len(sizes) > 1:
        raise _err(layer, "the layer's size is given twice", sizes[1].pos, "keep one `size N` line")
    written = sizes[0].value if sizes else None
    if given is not None and written is not None and given != written:
        raise _err(layer, f"the layer's size is {written} here, but {given} was given at load", sizes[0].pos,
                   "give one of them")
    n = given if given is not None else written
    if n is None:
        raise _err(layer, f"layer `{layer.name}` has no size (its number of neurons)", layer.pos,
                   "write `size 256` in the layer, or give it at load: flexdsl.load(path, hidden=256)")
    return n


def _inputs(layer: A.Layer, given: Mapping[str, int]) -> list[tuple[str, int, A.Pos]]:
    decls = layer.of(A.LayerInput)
    names = [d.name for d in decls]
    for k in given:
        if k not in names:
            raise _err(layer, f"a size was given at load for `{k}`, which is not an input of layer `{layer.name}`",
                       layer.pos, did_you_mean(k, names) or f"its inputs: {', '.join(names) or 'none'}")
    out: list[tuple[str, int, A.Pos]] = []
    for d in decls:
        if d.name in [o[0] for o in out]:
            raise _err(layer, f"input `{d.name}` is declared twice", d.pos, "give each input its own name")
        g = given.get(d.name)
        if g is not None and d.size is not None and g != d.size:
            raise _err(layer, f"input `{d.name}` has size {d.size} here, but {g} was given at load", d.size_pos,
                       "give one of them")
        size = g if g is not None else d.size
        if size is None:
            raise _err(layer, f"input `{d.name}` has no size", d.pos,
                       f"write `input {d.name} size N`, or give it at load: in_features=N")
        out.append((d.name, size, d.pos))
    return out


def _unique_names(layer: A.Layer, neuron: CheckedModel, syns: list[A.Synapses], inputs: list[str],
                  reserved: frozenset[str]) -> None:
    taken: dict[str, str] = {n: "a layer input" for n in inputs}
    taken.update({p.name: "a param of the neuron" for p in neuron.params})
    taken.update({s.name: "a state of the neuron" for s in neuron.states})
    taken.update({n: "a name the layer's module uses" for n in _RESERVED})
    made = {f"{s.name}{suffix}": s.name for s in syns for suffix in ("_delay", "_delay_width", "_mask")}
    for s in syns:
        for name, pos in ((s.name, s.pos), (s.bias, s.bias_pos)):
            if name is None:
                continue
            if name in taken:
                raise _err(layer, f"`{name}` is {taken[name]} already; a weight or bias needs its own name", pos,
                           "rename it, e.g. W_" + name)
            if name in made:
                raise _err(layer, f"`{name}` is the name of synapses `{made[name]}`'s delays or mask; a weight or bias "
                                  "needs its own name", pos, "rename it")
            if name in reserved or name.startswith("_") or keyword.iskeyword(name):
                raise _err(layer, f"`{name}` is a name the layer's module (a torch nn.Module) uses already, or one "
                                  "Python reserves; a weight or bias needs its own name", pos, "rename it, e.g. W_" +
                           name.lstrip("_"))
            taken[name] = "a weight or bias of this layer"


def _synapse(layer: A.Layer, neuron: CheckedModel, s: A.Synapses, inputs: list[tuple[str, int, A.Pos]],
             outs: list[str], ports: list[str], n: int, dt: float | None = None) -> CheckedSynapse:
    if s.port not in ports:
        raise _err(layer, f"`{neuron.name}` has no input `{s.port}` for synapses `{s.name}`", s.port_pos,
                   did_you_mean(s.port, ports) or f"its inputs: {', '.join(ports) or 'none'}")
    in_names = [i[0] for i in inputs]
    if s.pre in in_names:
        recurrent, index, pre_size = False, in_names.index(s.pre), inputs[in_names.index(s.pre)][1]
    elif s.pre in outs:
        recurrent, index, pre_size = True, outs.index(s.pre), n
    else:
        states = [st.name for st in neuron.states] + list(neuron.locals)
        if s.pre in states:
            raise _err(layer, f"`{s.pre}` is not an output of `{neuron.name}`; a recurrent synapse carries an output",
                       s.pre_pos, f"add it to the neuron's `output` line, or carry one of: {', '.join(outs)}")
        raise _err(layer, f"synapses `{s.name}` come from `{s.pre}`, which is neither an input of the layer nor an "
                          f"output of `{neuron.name}`", s.pre_pos,
                   did_you_mean(s.pre, [*in_names, *outs]) or
                   f"declare it: `input {s.pre} size N`; the neuron's outputs: {', '.join(outs)}")
    connect = "dense"
    if s.connect is not None:
        connect = CONNECT.get(s.connect, "")
        if not connect:
            raise _err(layer, f"unknown connectivity `{s.connect}`", s.connect_pos,
                       did_you_mean(s.connect, CONNECT) or "dense, one_to_one or mask")
    if connect == "one_to_one" and pre_size != n:
        raise _err(layer, f"one_to_one synapses `{s.name}` connect `{s.pre}` ({pre_size} values) to {n} neurons",
                   s.connect_pos or s.pos, "one_to_one needs as many presynaptic values as neurons; use dense")
    if connect != "one_to_one" and n * pre_size > MAX_WEIGHTS:
        raise _err(layer, f"synapses `{s.name}` would hold {n:,} x {pre_size:,} = {n * pre_size:,} weights (the limit "
                          f"is {MAX_WEIGHTS:,}: {MAX_WEIGHTS * 4 // 2**30} GiB in float32)", s.pos,
                   "a smaller layer, or one_to_one synapses")
    _not_yet(layer, neuron, s)
    kind, steps, interp = _delay(layer, s, recurrent, neuron, dt)
    mode = _rule(layer, neuron, s, recurrent, connect, kind)
    return CheckedSynapse(s.name, s.pre, s.port, ports.index(s.port), recurrent, index, pre_size, connect, s.bias,
                          s.pos, s.connect_pos or s.pos, kind, steps, s.delay_pos, interp, s.rule, s.rule_is_path,
                          mode, s.rule_pos)


RULE_MODES = ("window", "online")


def _rule(layer: A.Layer, neuron: CheckedModel, s: A.Synapses, recurrent: bool, connect: str, delay: str | None
          ) -> str:
    """The semantics of a synapse group's plasticity rule (`rule stdp online`), where it can run."""
    if s.rule is None:
        return "window"
    mode = s.rule_mode or "window"
    if s.rule_is_path and not s.rule.endswith(".rule"):  # (a layer's text names rule files only)
        raise _err(layer, f"`{s.rule}` is not a `.rule` file", s.rule_pos,
                   "a library rule (`rule stdp_additive`) or a file ending in .rule")
    if mode not in RULE_MODES:
        raise _err(layer, f"unknown plasticity semantics `{mode}`", s.rule_mode_pos,
                   did_you_mean(mode, RULE_MODES) or "`window` (weights held over a call, the change added after "
                   "it: the default) or `online` (the weights change every step)")
    if recurrent:
        raise _err(layer, f"a plasticity rule on the recurrent synapses `{s.name}` is not compiled yet: rules run on a "
                          "layer's input synapses", s.rule_pos, "move the rule to a synapse group from a layer input")
    if connect == "one_to_one":
        raise _err(layer, f"a plasticity rule needs a weight per connection; `{s.name}` are one_to_one", s.rule_pos,
                   "connect dense (or mask)")
    if delay is not None:
        raise _err(layer, f"a plasticity rule on delayed synapses (`{s.name}`) is not compiled yet", s.rule_pos,
                   "remove the delay or the rule")
    return mode  # (a rule that reads `post` needs a neuron with spikes: checked where the rule is loaded)


DELAY_RELAXATIONS = ("gauss", "linear")


def _delay(layer: A.Layer, s: A.Synapses, recurrent: bool, neuron: CheckedModel, dt: float | None
           ) -> tuple[str | None, int, str | None]:
    """(kind, steps, relaxation) of a synapse's `delay` line: a whole number of steps (or a time
    that is one, in steps of the neuron's `dt`), at most `MAX_DELAY`; the relaxation of a learnable
    delay (None: fixed)."""
    if s.delay is None and s.delay_kind is None:
        return None, 0, None
    if s.delay is None:
        ex = f"delay {s.delay_kind} max 20" + (" learnable" if s.delay_learnable else "")
        raise _err(layer, f"{s.delay_kind} delays of `{s.name}` need a maximum: the layer keeps that many steps",
                   s.delay_pos, f"e.g. `{ex}`")
    if s.delay_learnable and s.delay_kind is None:
        raise _err(layer, f"a learnable delay of `{s.name}` needs a kind and a maximum: one delay per presynaptic "
                          "neuron, connection or postsynaptic neuron, trained within [0, max]", s.delay_pos,
                   "e.g. `delay axonal max 20 learnable` or `delay synaptic max 20 learnable`")
    interp = None
    if s.delay_learnable:
        interp = s.delay_interp or "gauss"
        if interp not in DELAY_RELAXATIONS:
            raise _err(layer, f"unknown relaxation `{interp}` for the learnable delays of `{s.name}`",
                       s.delay_interp_pos, did_you_mean(interp, DELAY_RELAXATIONS) or
                       "`learnable gauss` (DCLS's Gaussian over the steps, default) or `learnable linear` (two steps)")
    e, pos = s.delay, s.delay_pos
    what = f"the maximum delay of `{s.name}`" if s.delay_kind else f"the delay of `{s.name}`"
    neg = e if isinstance(e, A.Neg) and isinstance(e.operand, A.Num | A.Quantity) else None
    if neg is not None:  # `-3`, `-1 ms` (a time's sign too), `-0` (zero)
        e = neg.operand
        shown = e.text if isinstance(e, A.Num) else f"{e.text} {e.unit}" + (f"**{e.ptext}" if e.power != 1 else "")
    if isinstance(e, A.Quantity):
        e = _in_steps(layer, s, e, what, neuron, dt)
    if neg is not None and isinstance(e, A.Num) and e.value != 0:
        raise _err(layer, f"{what} is negative (-{shown}); a delay is 0 or more steps", neg.pos,
                   f"`delay {shown}`: the input arrives that much later")
    if isinstance(e, A.Name) and e.id in ("learnable", "max"):
        raise _err(layer, f"`delay {e.id}` of `{s.name}` needs a kind and a maximum first", e.pos,
                   "e.g. `delay synaptic max 20 learnable` (or axonal, dendritic)")
    if not isinstance(e, A.Num):
        raise _err(layer, f"{what} must be a number of steps", getattr(e, "pos", pos),
                   "e.g. `delay 3`, or `delay axonal max 20` with the delays given at load")
    if e.value != int(e.value) or e.value > MAX_DELAY:
        raise _err(layer, f"{what} must be a whole number of steps from 0 to {MAX_DELAY:,}, not {e.text}", e.pos)
    if interp is not None and int(e.value) == 0:
        raise _err(layer, f"the learnable delays of `{s.name}` have a maximum of 0 steps: nothing to learn", e.pos,
                   "a maximum of 1 step or more")
    return (s.delay_kind or "uniform"), int(e.value), interp


def _in_steps(layer: A.Layer, s: A.Synapses, q: A.Quantity, what: str, neuron: CheckedModel, dt: float | None
              ) -> A.Num:
    """A delay written as a time (`delay 2 ms`), in steps of the neuron's `dt` (a whole number of them)."""
    from .catalog import unit_parts
    from .dims import unit

    shown = f"{q.text} {q.unit}" + (f"**{q.power:g}" if q.power != 1 else "")
    if unit_parts(q.unit) is None:
        raise _err(layer, f"{what} has the unknown unit `{q.unit}`", q.unit_pos, "a time unit: ms, us, s")
    factor, dim = unit(q.unit)
    if q.power != 1 or dim != unit("s")[1]:
        raise _err(layer, f"{what} is `{shown}`, which is not a time", q.pos, "a number of steps, or a time: `2 ms`")
    if dt is None:
        raise _err(layer, f"{what} is a time (`{shown}`), but the neuron `{neuron.name}` has no `dt` param to divide "
                          "it by: it counts in steps", q.pos, "write the delay in steps, e.g. `delay 20`")
    written = neuron.written.param("dt") if neuron.written is not None else None
    if written is None or not isinstance(written.default, A.Quantity):  # (`dt = 0.001`: seconds? ms? steps?)
        raise _err(layer, f"{what} is a time (`{shown}`), but the neuron `{neuron.name}` writes its `dt` without a unit: "
                          "how long a step is, it does not say", q.pos,
                          "write the delay in steps (e.g. `delay 20`), or use a neuron whose dt has a unit (`dt = 0.1 ms`)")
    steps = q.value * float(factor) / dt
    if not math.isfinite(steps) or abs(steps - round(steps)) > 1e-9 * max(1.0, abs(steps)):
        raise _err(layer, f"{what} is {shown} = {steps:g} steps of dt = {dt:g} (the neuron's, in its base time unit), "
                          "not a whole number of steps", q.pos, "a multiple of dt, or another dt at load")
    return A.Num(float(round(steps)), str(round(steps)), q.pos)


def _not_yet(layer: A.Layer, neuron: CheckedModel, s: A.Synapses) -> None:
    """Delays, synaptic state and plasticity events: their names checked, then a located refusal
    (the layer level has room for them; its kernels do not run them yet)."""
    known = {s.name, *(st.name for st in s.states), *(p.name for p in neuron.params),
             *(st.name for st in neuron.states)}
    for ev in s.events:
        if ev.kind not in ("pre", "post"):
            raise _err(layer, f"unknown synaptic event `on {ev.kind}`", ev.pos,
                       did_you_mean(ev.kind, ["pre", "post"]) or "`on pre:` or `on post:`")
        for st in ev.statements:
            if not st.is_let and st.target not in {s.name, *(x.name for x in s.states)}:
                raise _err(layer, f"`on {ev.kind}` of synapses `{s.name}` updates `{st.target}`, which is not a state "
                                  "of these synapses", st.pos,
                           did_you_mean(st.target, [s.name, *(x.name for x in s.states)]) or
                           f"declare it in the synapses block: `state {st.target} = 0`, or update the weight `{s.name}`")
            for node in A.nodes(st.value):
                if isinstance(node, A.Name) and node.id not in known:
                    raise _err(layer, f"unknown name `{node.id}` in `on {ev.kind}` of synapses `{s.name}`", node.pos,
                               did_you_mean(node.id, known))
    first = s.states[0].pos if s.states else (s.events[0].pos if s.events else None)
    if first is not None:
        raise _err(layer, "synaptic state and `on pre`/`on post` belong in a plasticity rule (a `.rule` file), which "
                          "the synapses name", first,
                   "write them in `my.rule` (`rule NAME:` with states, `on pre:`, `on post:`) and attach it here: "
                   "`rule \"my.rule\"` (or a library rule: `rule stdp_additive`)")


__all__ = ["CONNECT", "DELAY_RELAXATIONS", "RULE_MODES", "MAX_DELAY", "MAX_WEIGHTS", "CheckedLayer", "CheckedSynapse", "check_layer", "neuron_ref"]
