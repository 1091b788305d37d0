"""flexdsl modules under the PyTorch tools users reach for every day: torch.compile and
torch.export on the first call, copies and checkpoints (also in a new process), extra state,
per-channel params at load, SpikingJelly's net utilities and truncated BPTT, the functional
state-passing form, autocast. References: the eager torch backend, SpikingJelly's LIFNode,
and hand-derived values."""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import flexdsl  # noqa: E402
from flexdsl.backends.triton import LAUNCHES  # noqa: E402

from tolerances import assert_close, scan_ops  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = ["torch", "triton"]


def _x(T=6, shape=(3, 5), seed=0, scale=2.0):
    return torch.rand(T, *shape, generator=torch.Generator().manual_seed(seed)) * scale


def _fwd_bwd(m, x):
    x = x.detach().clone().requires_grad_(True)
    out = m(x)
    out = out[0] if isinstance(out, tuple) else out
    w = torch.linspace(-1, 1, out.numel()).reshape(out.shape)
    (out * w).sum().backward()
    return out.detach(), x.grad


# ------------------------------------------------------------------ torch.compile / export
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("compiler", ["aot_eager", "inductor"])
def test_compile_on_the_first_call(backend, compiler):
    torch._dynamo.reset()
    m = flexdsl.load("plif", backend=backend)  # a learnable param: its gradient must flow too
    ref = flexdsl.load("plif", backend="torch")
    x = _x()
    explanation = torch._dynamo.explain(flexdsl.load("plif", backend=backend))(x)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    torch._dynamo.reset()
    before = LAUNCHES["fwd"]
    cm = torch.compile(m, fullgraph=True, backend=compiler)
    out, gx = _fwd_bwd(cm, x)  # the first call is compiled: no eager warm-up
    out_r, gx_r = _fwd_bwd(ref, x)
    assert torch.equal(out, out_r)
    assert_close(gx, gx_r, ops=scan_ops("plif", x.shape[0]))
    assert_close(m.w.grad, ref.w.grad, ops=scan_ops("plif", x.shape[0], x.numel()))
    if backend == "triton":
        assert LAUNCHES["fwd"] > before  # the kernels ran inside the compiled graph


@pytest.mark.parametrize("backend", BACKENDS)
def test_export_strict(backend):
    m = flexdsl.load("lif", backend=backend)
    x = _x()
    ep = torch.export.export(m, (x,), strict=True)
    assert torch.equal(ep.module()(x), flexdsl.load("lif", backend="torch")(x))


# ------------------------------------------------------------------ copies and checkpoints
def _trained(backend="torch"):
    """A model in a state worth copying: a learned param, a non-default fixed param, kept states."""
    m = flexdsl.load("plif", backend=backend, v_threshold=0.8)
    with torch.no_grad():
        m.w.fill_(-0.3)
    m(_x(seed=3))
    return m


def _same(a, b, x):
    for m in (a, b):
        m.reset()
        m.w.grad = None
    oa, ga = _fwd_bwd(a, x)
    ob, gb = _fwd_bwd(b, x)
    assert torch.equal(oa, ob)
    assert torch.equal(ga, gb)
    assert torch.equal(a.w.grad, b.w.grad)


@pytest.mark.parametrize("backend", BACKENDS)
def test_deepcopy_pickle_averaged_model(backend):
    m = _trained(backend)
    x = _x(seed=4)
    c = copy.deepcopy(m)
    assert torch.equal(c.v, m.v) and c.v_threshold == 0.8
    p = pickle.loads(pickle.dumps(m))
    assert torch.equal(p.v, m.v)
    _same(m, c, x)
    _same(m, p, x)
    avg = torch.optim.swa_utils.AveragedModel(m)
    avg.update_parameters(m)
    m.reset()
    avg.module.reset()
    assert torch.equal(avg(x), m(x))  # (a copy of the same values: the same numbers)


def test_torch_save_and_pickle_in_a_new_process(tmp_path):
    m = _trained()
    x = _x(seed=5)
    torch.save(m, tmp_path / "model.pt")
    (tmp_path / "model.pkl").write_bytes(pickle.dumps(m))
    m.reset()
    expected, _ = _fwd_bwd(m, x)
    torch.save({"x": x, "expected": expected, "grad": m.w.grad}, tmp_path / "ref.pt")
    code = """
import pickle, sys, torch
d = torch.load(sys.argv[1] + "/ref.pt")
for m in (torch.load(sys.argv[1] + "/model.pt", weights_only=False),
          pickle.loads(open(sys.argv[1] + "/model.pkl", "rb").read())):
    m.reset()
    out = m(d["x"])
    (out * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum().backward()
    assert torch.equal(out, d["expected"]) and torch.equal(m.w.grad, d["grad"]), "differs"
    assert m.v_threshold == 0.8
print("same")
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "same" in r.stdout, r.stderr


def test_checkpoint_restores_non_learnable_params():
    src = flexdsl.load("lif", tau=5.0, v_threshold=0.7)
    dst = flexdsl.load("lif")
    assert "_extra_state" in src.state_dict()
    dst.load_state_dict(src.state_dict())
    assert dst.tau == 5.0 and dst.v_threshold == 0.7
    x = _x(seed=6)
    assert torch.equal(dst(x), src(x))
    # per-channel buffers and learnable params travel too
    a = flexdsl.load("plif", param_shapes={"w": (5,)}, v_threshold=torch.tensor([0.5, 0.6, 0.7, 0.8, 0.9]))
    with torch.no_grad():
        a.w.copy_(torch.linspace(-1, 1, 5))
    b = flexdsl.load("plif", param_shapes={"w": (5,)}, v_threshold=torch.ones(5))
    b.load_state_dict(a.state_dict())
    assert torch.equal(b(x), a(x))


def test_checkpoint_restores_the_exact_model_across_scalar_and_per_channel_params():
    x = _x(shape=(3, 4), seed=8)
    per = flexdsl.load("lif", tau=torch.tensor([2.0, 3.0, 4.0, 5.0]))
    scalar = flexdsl.load("lif")
    scalar.load_state_dict(per.state_dict())  # per-channel checkpoint into a scalar model
    assert torch.equal(scalar(x), per(x)) and torch.equal(scalar.tau, per.tau)
    per2 = flexdsl.load("lif", tau=torch.tensor([2.0, 3.0, 4.0, 5.0]))
    per2.load_state_dict(flexdsl.load("lif", tau=7.0).state_dict())  # and the reverse
    assert per2.tau == 7.0 and torch.equal(per2(x), flexdsl.load("lif", tau=7.0)(x))
    # a learnable per-channel param into a scalar one
    a = flexdsl.load("plif", param_shapes={"w": (4,)})
    with torch.no_grad():
        a.w.copy_(torch.tensor([0.1, 0.2, -0.3, 0.4]))
    b = flexdsl.load("plif")
    b.load_state_dict(a.state_dict())
    assert b.w.shape == (4,) and torch.equal(b(x), a(x))
    # a damaged extra state is a located error, not a raw ValueError
    sd = flexdsl.load("lif").state_dict()
    sd["_extra_state"]["params"]["tau"] = "abc"
    with pytest.raises(flexdsl.FlexDSLError, match="`tau` is not a number"):
        flexdsl.load("lif").load_state_dict(sd)


def test_load_state_dict_checks_constraints_before_copying():
    m = flexdsl.load("lif", tau=3.0)
    bad = flexdsl.load("lif", tau=3.0).state_dict()
    bad["_extra_state"]["params"]["tau"] = 0.5  # violates `where tau > 1`
    with pytest.raises(flexdsl.FlexDSLError, match="tau"):
        m.load_state_dict(bad)
    assert m.tau == 3.0  # nothing was copied


# ------------------------------------------------------------------ per-channel values at load
def test_per_channel_values_at_load():
    x = _x(shape=(4, 2), seed=7)
    m = flexdsl.load("lif", tau=torch.tensor([2.0, 3.0]), backend="torch")
    out = m(x)
    for c, tau in enumerate((2.0, 3.0)):
        ref = flexdsl.load("lif", tau=tau, backend="torch")
        assert torch.equal(out[..., c], ref(x[..., c].contiguous()))
    with pytest.raises(flexdsl.FlexDSLError, match="violates the constraint of `tau`"):
        flexdsl.load("lif", tau=torch.tensor([2.0, 0.5]))
    with pytest.raises(flexdsl.FlexDSLError, match="takes a number"):
        flexdsl.load("lif", tau="fast")
    with pytest.raises(flexdsl.FlexDSLError, match="not learnable, so a tensor that requires grad"):
        flexdsl.load("lif", tau=torch.tensor([2.0, 3.0], requires_grad=True))


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_per_channel_values_must_broadcast_to_the_input(backend):
    m = flexdsl.load("lif", tau=torch.tensor([2.0, 3.0]), backend=backend)
    with pytest.raises(flexdsl.FlexDSLError, match=r"`tau` has shape \(2,\), which does not broadcast"):
        m(torch.ones(3, 5))
    with pytest.raises(flexdsl.FlexDSLError, match="does not broadcast"):
        m(torch.ones(3, 2, 1))  # would broadcast *up* to [3, 2, 2]: not one step of this input
    assert m(torch.ones(3, 4, 2)).shape == (3, 4, 2)


# ------------------------------------------------------------------ SpikingJelly habits
def test_spikingjelly_reset_step_mode_and_tbptt():
    from loguru import logger
    from spikingjelly.activation_based import base, functional, neuron, surrogate

    assert isinstance(flexdsl.load("lif"), base.MemoryModule)  # SpikingJelly's own kind of stateful module
    logged: list[str] = []
    sink = logger.add(lambda msg: logged.append(str(msg)), level="WARNING")

    torch.manual_seed(0)
    lin = torch.nn.Linear(5, 5)
    ours = torch.nn.Sequential(copy.deepcopy(lin), flexdsl.load("lif", backend="torch"))
    ref = torch.nn.Sequential(copy.deepcopy(lin), neuron.LIFNode(tau=2.0, surrogate_function=surrogate.Sigmoid(4.0),
                                                                 step_mode="m"))
    x = _x(T=12, shape=(3, 5), seed=8)
    for net in (ours, ref):
        functional.set_step_mode(net, "m")
        functional.reset_net(net)
        for chunk in x.split(4):  # truncated BPTT: backward per chunk, states detached between
            net(chunk).sum().backward()
            functional.detach_net(net)
    assert ours[1].step_mode == "m"
    # three chunks of 4 steps, through the Linear's 5 terms; the weight's gradient sums 12 x 3 rows
    assert_close(ours[0].weight.grad, ref[0].weight.grad, ops=scan_ops("lif", 12, 12 * 3) + 5)
    functional.reset_net(ours)
    assert ours[1]._states["v"] is None
    functional.set_step_mode(ours, "s")
    assert ours[1].step_mode == "s" and ours[1](x[0]).shape == x[0].shape
    assert dict(base.named_memories(ours)).keys() == {"1.v"}
    logger.remove(sink)
    assert not logged, logged  # no "not a MemoryModule" warnings


# ------------------------------------------------------------------ state passing
@pytest.mark.parametrize("backend", BACKENDS)
def test_functional_step_equals_the_module(backend):
    x = _x(T=9, seed=9)
    m = flexdsl.load("alif", backend=backend)
    full = m(x)
    kept = {k: v.clone() for k, v in m._states.items()}
    f = flexdsl.load("alif", backend=backend)
    assert f.state_names == ["v", "a"]
    state = f.initial_state(x)
    assert set(state) == {"v", "a"} and state["v"].shape == x.shape[1:]
    outs = []
    for chunk in x.split(4):
        out, state = f.step(chunk, state)
        outs.append(out)
    assert torch.equal(torch.cat(outs), full)
    assert torch.equal(state["v"], kept["v"]) and torch.equal(state["a"], kept["a"])
    assert f._states["v"] is None  # the module's own states are untouched
    out2, state2 = f(x, None)  # the snnTorch/Norse form m(x, state)
    assert torch.equal(out2, full) and torch.equal(state2["a"], kept["a"])
    # params are read live
    f.v_th = 0.5
    out3, _ = f.step(x)
    assert not torch.equal(out3, full)
    assert torch.equal(out3, flexdsl.load("alif", backend=backend, v_th=0.5)(x))


def test_core_reads_live_params():
    m = flexdsl.load("lif", backend="torch")
    core = m.core
    x, v = torch.tensor([1.0]), torch.tensor([0.0])
    assert core(x, v)[1].item() == pytest.approx(0.5)  # v + (x - v)/tau with tau = 2
    m.tau = 4.0
    assert core(x, v)[1].item() == pytest.approx(0.25)


# ------------------------------------------------------------------ autocast
@pytest.mark.parametrize("backend", BACKENDS)
def test_autocast_bfloat16_on_cpu(backend):
    torch.manual_seed(1)
    net = torch.nn.Sequential(torch.nn.Linear(5, 5), flexdsl.load("lif", backend=backend))
    x = _x(shape=(3, 5), seed=10).requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = net(x)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    # the same bf16 activations outside autocast give the same spikes
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        h = net[0](x)
    net[1].reset()
    assert torch.equal(net[1](h.detach()), out.detach())


# ------------------------------------------------------------------ misuse gets a clear error
def test_non_floating_inputs_are_rejected():
    m = flexdsl.load("lif")
    for bad in (torch.ones(4, 3, dtype=torch.int64), torch.ones(4, 3, dtype=torch.bool),
                torch.ones(4, 3, dtype=torch.complex64)):
        with pytest.raises(flexdsl.FlexDSLError, match="floating point"):
            m(bad)
    with pytest.raises(flexdsl.FlexDSLError, match="must be a torch.Tensor"):
        m([[1.0, 2.0]])


def test_inputs_must_agree_on_T_and_broadcast():
    text = """neuron Two:
    input x, y
    state v = 0.0
    update:
        v = v + x + y
    output v
"""
    m = flexdsl.loads(text)
    with pytest.raises(flexdsl.FlexDSLError, match="has 5 steps but `x` has 3"):
        m(torch.rand(3, 4), torch.rand(5, 4))
    with pytest.raises(flexdsl.FlexDSLError, match="do not broadcast"):
        m(torch.rand(3, 4), torch.rand(3, 5))
    x, y = torch.rand(3, 2, 4), torch.rand(3, 1, 4)  # y broadcasts over the batch
    assert_close(flexdsl.loads(text)(x, y), torch.cumsum(x + y, 0), ops=2 * 3)  # 3 steps of 2 additions
    mt = flexdsl.loads(text, backend="triton")
    assert_close(mt(x, y), torch.cumsum(x + y, 0), ops=2 * 3)


def test_batch_or_device_change_without_reset_is_an_error():
    m = flexdsl.load("lif")
    m(torch.rand(3, 4))
    with pytest.raises(flexdsl.FlexDSLError, match=r"call m.reset\(\)"):
        m(torch.rand(3, 1))
    m.reset()
    assert m(torch.rand(3, 1)).shape == (3, 1)
    # a kept state that would broadcast is no licence: [T, 1] -> [T, 4], [T, 3] -> [T, 2, 3], [T, 4] -> [T, 3]
    for first, then in (((3, 1), (3, 4)), ((3, 3), (3, 2, 3)), ((3, 4), (3, 3))):
        m.reset()
        m(torch.rand(*first))
        with pytest.raises(flexdsl.FlexDSLError, match=r"call m.reset\(\)"):
            m(torch.rand(*then))
    with pytest.raises(flexdsl.FlexDSLError, match=r"has shape \(4,\) \(as given\)"):
        m.step(torch.rand(5, 3), {"v": torch.zeros(4)})
    m.reset()
    m(torch.rand(3, 1))
    with pytest.raises(flexdsl.FlexDSLError, match="is on cpu but the input is on meta"):
        m(torch.rand(3, 1, device="meta"))


def test_every_constraint_is_checked_on_assignment():
    text = """neuron Th:
    input x
    param v_reset = 0.0
    param v_threshold = 1.0 where v_threshold > v_reset
    state v = v_reset
    update:
        v = v + x
    spike when v >= v_threshold
    on spike:
        v = v_reset
"""
    m = flexdsl.loads(text)
    with pytest.raises(flexdsl.FlexDSLError, match="v_reset = 2"):
        m.v_reset = 2.0  # breaks the constraint of *another* param
    assert m.v_reset == 0.0
    m.v_reset = -1.0
    assert m.v_reset == -1.0


def test_a_gradient_is_never_dropped_silently():
    m = flexdsl.load("lif")
    with pytest.raises(flexdsl.FlexDSLError, match="not learnable"):
        m.tau = torch.tensor(3.0, requires_grad=True)
    m.tau = torch.tensor(3.0)  # without grad it is a value
    assert m.tau == 3.0


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_check_finite_under_torch_compile_fullgraph(backend):
    """check_finite cannot name the step inside a compiled graph (no branching on values), but
    it still stops the call: one traced assertion, no graph break."""
    torch._dynamo.reset()
    m = flexdsl.load("lif", check_finite=True, backend=backend)
    cm = torch.compile(m, fullgraph=True, backend="aot_eager")
    x = torch.rand(4, 3)
    assert torch.equal(cm(x), flexdsl.load("lif", backend=backend)(x))
    m.reset()
    with pytest.raises(RuntimeError, match="check_finite: a NaN or inf appeared in a call of LIF"):
        cm(torch.full((4, 3), float("nan")))
