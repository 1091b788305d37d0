"""torch.compile of flexdsl layers, against the eager modules: a compiled first call in a fresh
process with empty caches, the time loop as one graph node (the graph does not grow with T),
no recompilation when a non-learnable param changes (and none of flexdsl's own when the grad
mode switches), and compiled outputs and gradients equal to eager for the library models on
every backend (torch, the CPU kernels, Triton through its interpreter); the Triton launch
plans under a trace (params as tensors), the kernels on channels_last steps, and the recurrent
layer as one graph node.

Every library model is compiled on every backend in the default run, with the `aot_eager`
compiler (Dynamo and AOTAutograd: the graph, the custom ops' fake implementations and autograd
formulas, the traced params and states; about a second a model and backend on 2 cores). What
Inductor adds is its code generation for the ops around the neuron (which is an opaque node for
every model alike): the default run compiles with Inductor one model per property that reaches
that code (`INDUCTOR`: learnable params, several states and outputs, derived params computed in
the graph, bookkeeping states, rk4) on every backend; every model with Inductor is
`python -m pytest -m compile_all tests/test_compile.py` (about 10 s a model on 2 cores)."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import uuid
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402

import flexdsl  # noqa: E402
from flexdsl import backends  # noqa: E402

from tolerances import assert_close, layer_ops, module_condition, scan_ops  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = ["torch", "cpu", "triton"]
if not backends.get("cpu").available():  # (no C++ compiler here: test_cpu_backend checks the fallback)
    BACKENDS.remove("cpu")

SCALE = {"hodgkin_huxley": 15.0, "morris_lecar": 60.0, "izhikevich": 20.0, "izhikevich_2003": 20.0, "adex": 2e-9,
         "eif": 3.0, "qif": 3.0, "resonate_fire": 3.0}


def _x(T=6, shape=(3, 5), seed=0, scale=2.0, dtype=torch.float32):
    return (torch.rand(T, *shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
            * scale).to(dtype)


def _fwd_bwd(m, x):
    x = x.detach().clone().requires_grad_(True)
    out = m(x)
    outs = out if isinstance(out, tuple) else (out,)
    loss = sum((o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).reshape(o.shape)).sum() for o in outs)
    loss.backward()
    mod = getattr(m, "_orig_mod", m)  # (a compiled module's own names)
    return [o.detach() for o in outs], x.grad, {n: p.grad.clone() for n, p in mod.named_parameters()
                                                if p.grad is not None}


def _condition(model: str, x: torch.Tensor) -> float:
    """The condition of `_fwd_bwd` of a library model at `x` and at its params' values
    (tolerances.module_condition, float64 on the torch backend): a steep surrogate or a stiff model
    amplifies a rounding difference."""
    out = flexdsl.load(model, backend="torch")(x)
    outs = out if isinstance(out, tuple) else (out,)
    w = [torch.linspace(-1, 1, o.numel(), dtype=torch.float64).reshape(o.shape) for o in outs]
    return module_condition(lambda **kw: flexdsl.load(model, backend="torch", **kw), x, w)


def _fresh_text(model: str) -> str:
    """The model's text with a unique comment: a model no earlier test has compiled (no program,
    no custom op in this process)."""
    from flexdsl.library import resolve

    text, _ = resolve(model)
    return f"# {uuid.uuid4().hex}\n{text}"


# ------------------------------------------------------------------ the first call, in a fresh process
FIRST_CALL = """
import copy, os, sys, time
import torch
from torch import nn
import flexdsl
backend, compiler = sys.argv[1], sys.argv[2]
assert not os.listdir(os.environ["FLEXDSL_CACHE_DIR"]) and not os.listdir(os.environ["TORCHINDUCTOR_CACHE_DIR"])
torch.manual_seed(0)
net = nn.Sequential(nn.Flatten(2), nn.Linear(64, 32), flexdsl.load("lif", backend=backend), nn.Linear(32, 10))
ref = copy.deepcopy(net)
ref[2].backend = "torch"
x = torch.rand(5, 4, 8, 8)
t0 = time.perf_counter()
cm = torch.compile(net, fullgraph=True, backend=compiler)
out = cm(x)  # the first call of the process is a compiled one
out.square().sum().backward()
t1 = time.perf_counter()
ref_out = ref(x)
ref_out.square().sum().backward()
from tolerances import assert_close, scan_ops
# Linear(64) -> 5 steps of LIF -> Linear(32): the dot products, the scan, a weight's sum over 5 * 4 rows
ops = 64 + 32 + scan_ops("lif", 5, 5 * 4)
assert_close(out, ref_out, ops=ops, what="out")
for (name, p), q in zip(net.named_parameters(), ref.parameters()):
    assert_close(p.grad, q.grad, ops=ops, what=name)
print(f"ok {t1 - t0:.1f} s")
"""


@pytest.mark.parametrize("backend,compiler", [("auto", "inductor"), ("torch", "aot_eager"), ("triton", "aot_eager")])
def test_compiled_first_call_in_a_fresh_process_with_empty_caches(tmp_path, backend, compiler):
    """`torch.compile(fullgraph=True)` of a network whose first call ever is the compiled one:
    nothing was generated, built, loaded or registered before (empty flexdsl and Inductor caches,
    a new process). "auto" is the CPU kernels here (built during the trace)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]), "FLEXDSL_CACHE_DIR": str(tmp_path / "flexdsl"),
           "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "TRITON_CACHE_DIR": str(tmp_path / "triton"),
           "TRITON_INTERPRET": "1"}
    for k in ("flexdsl", "inductor", "triton"):
        (tmp_path / k).mkdir()
    r = subprocess.run([sys.executable, "-c", FIRST_CALL, backend, compiler], capture_output=True, text=True, env=env,
                       timeout=900)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stderr[-3000:]
    if backend == "auto" and "cpu" in BACKENDS:  # the kernel library was built into the empty cache
        assert any(p.suffix == ".so" for p in (tmp_path / "flexdsl").rglob("*"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_compile_on_the_first_call_of_a_model_never_run(backend):
    """In this process too: a model text nothing has compiled, traced with fullgraph=True on its
    first call (no eager warm-up, no other module of the model run before)."""
    torch._dynamo.reset()
    text = _fresh_text("plif")
    m = flexdsl.loads(text, backend=backend)
    cm = torch.compile(m, fullgraph=True, backend="aot_eager")
    x = _x()
    out, gx, gp = _fwd_bwd(cm, x)
    ref = flexdsl.load("plif", backend="torch")
    out_r, gx_r, gp_r = _fwd_bwd(ref, x)
    assert torch.equal(out[0], out_r[0])
    assert_close(gx, gx_r, ops=scan_ops("plif", x.shape[0]))
    assert_close(gp["w"], gp_r["w"], ops=scan_ops("plif", x.shape[0], x.numel()))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_network_of_several_models_compiles_on_its_first_call(backend):
    """Several models that nothing has compiled, and a recurrent layer, in one graph traced on its
    first call: each model's program is resolved during the same trace (a regression: the second
    model's program was looked up in a table the trace had read before it was resolved)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(8, 8), flexdsl.loads(_fresh_text("lif"), backend=backend),
        torch.nn.Linear(8, 8), flexdsl.loads(_fresh_text("plif"), backend=backend),
        flexdsl.recurrent(flexdsl.loads(_fresh_text("alif")), 8, 6, backend=backend))
    ref = copy.deepcopy(net)
    x = torch.rand(6, 3, 8)
    cm = torch.compile(net, fullgraph=True, backend="aot_eager")
    outs = []
    for model in (cm, ref):
        out = model(x)
        out = out[0] if isinstance(out, tuple) else out
        (out * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum().backward()
        outs.append(out.detach())
    assert torch.equal(outs[0], outs[1])
    # the gradients pass back through ALIF's layer, two Linear+neuron pairs: each a scan of 6 steps
    # and a dot product of 8; a weight's gradient sums over 6 * 3 rows
    ops = sum(scan_ops(name, 6) + 8 for name in ("lif", "plif")) + layer_ops("alif", 6, 3, 8, 6) + 6 * 3
    for (name, p), q in zip(net.named_parameters(), ref.parameters()):
        assert_close(p.grad, q.grad, ops=ops, what=name)


# ------------------------------------------------------------------ the time loop is one node
def _captured_graphs(m, x):
    graphs = []

    def backend(gm, inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(m, fullgraph=True, backend=backend)(x)
    assert len(graphs) == 1
    return graphs[0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_time_loop_is_one_graph_node(backend):
    """The traced graph is the same for T = 3 and T = 50: one custom op for the whole loop (so
    compile time does not grow with T), never an unrolled step."""
    sizes = {}
    for T in (3, 50):
        m = flexdsl.load("alif", backend=backend)
        g = _captured_graphs(m, _x(T=T))
        targets = [str(n.target) for n in g.graph.nodes if n.op == "call_function"]
        flex = [t for t in targets if t.startswith("flexdsl_")]
        assert len(flex) == 1, targets
        sizes[T] = len(targets)
    assert sizes[3] == sizes[50]


# ------------------------------------------------------------------ no recompilation
@pytest.mark.parametrize("backend", BACKENDS)
def test_no_recompilation_when_params_change(backend):
    """Non-learnable params are inputs of the graph, not guards: 20 values of `tau` (and of
    `v_threshold`) compile nothing after the first call, with fullgraph=True (whose recompile
    limit would raise), and every call gives the eager result for its values."""
    torch._dynamo.reset()
    m = flexdsl.load("lif", backend=backend)
    ref = flexdsl.load("lif", backend="torch")
    cm = torch.compile(m, fullgraph=True, backend="aot_eager")
    x = _x(T=8, scale=3.0)
    _fwd_bwd(cm, x)  # (the first call compiles)
    counters.clear()
    for i in range(20):
        for mod in (m, ref):
            mod.tau = 1.5 + 0.25 * i
            mod.v_threshold = 0.6 + 0.05 * i
            mod.reset()
        out, gx, _ = _fwd_bwd(cm, x)
        out_r, gx_r, _ = _fwd_bwd(ref, x)
        assert torch.equal(out[0], out_r[0])
        assert_close(gx, gx_r, ops=scan_ops("lif", x.shape[0]))
    assert counters["stats"]["unique_graphs"] == 0, dict(counters["stats"])
    # a per-channel buffer changed in place is an input too
    pc = flexdsl.load("lif", backend=backend, tau=torch.tensor([2.0, 3.0, 4.0, 5.0, 6.0]))
    cpc = torch.compile(pc, fullgraph=True, backend="aot_eager")
    cpc(x)
    pc.reset()
    counters.clear()
    for i in range(5):
        pc.tau = torch.tensor([2.0, 3.0, 4.0, 5.0, 6.0]) + i
        pc.reset()
        assert torch.equal(cpc(x), flexdsl.load("lif", backend="torch", tau=pc.tau)(x))
    assert counters["stats"]["unique_graphs"] == 0, dict(counters["stats"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_grad_mode_switches_add_no_recompilation(backend):
    """Dynamo guards the global grad mode of every compiled frame (a compiled `nn.Linear` alone
    compiles one graph per mode, measured here as the baseline); flexdsl adds nothing to that:
    the same number of graphs as for the Linear, and switching back and forth (with new param
    values) compiles nothing more."""

    def graphs_for(net):
        torch._dynamo.reset()
        counters.clear()
        cm = torch.compile(net, fullgraph=True, backend="aot_eager")
        x = _x(T=5, shape=(3, 5), scale=3.0)
        for i in range(6):
            if hasattr(net[-1], "tau"):
                net[-1].tau = 2.0 + i
                net[-1].reset()
            cm(x).sum().backward()
            with torch.no_grad():
                cm(x)
        return counters["stats"]["unique_graphs"]

    torch.manual_seed(0)
    baseline = graphs_for(torch.nn.Sequential(torch.nn.Linear(5, 5)))
    ours = graphs_for(torch.nn.Sequential(torch.nn.Linear(5, 5), flexdsl.load("lif", backend=backend)))
    assert baseline == 2 and ours == baseline


# ------------------------------------------------------------------ compiled equals eager
# Inductor in the default run: learnable params (plif), several states and outputs (snn_synaptic),
# derived params computed in the graph (resonate_fire), rk4 (hodgkin_huxley)
INDUCTOR = ["plif", "snn_synaptic", "resonate_fire", "hodgkin_huxley"]


def _compile_params():
    out = []
    for model in flexdsl.library():
        for backend in BACKENDS:
            for compiler in ("aot_eager", "inductor"):
                m = [] if compiler == "aot_eager" or model in INDUCTOR else [pytest.mark.compile_all]
                out.append(pytest.param(model, backend, compiler, marks=m, id=f"{model}-{backend}-{compiler}"))
    return out


@pytest.mark.parametrize("model,backend,compiler", _compile_params())
def test_compiled_equals_eager(model, backend, compiler):
    torch._dynamo.reset()
    x = _x(T=7, shape=(2, 3), scale=SCALE.get(model, 2.0))
    m = flexdsl.load(model, backend=backend)
    ref = flexdsl.load(model, backend=backend)
    out, gx, gp = _fwd_bwd(torch.compile(m, fullgraph=True, backend=compiler), x)
    out_r, gx_r, gp_r = _fwd_bwd(ref, x)
    # the same program, with the loss's ops around it fused or not: T steps' roundings forward and
    # back, and a param's gradient summed over the input's elements
    T, cond = x.shape[0], _condition(model, x)
    for a, b in zip(out, out_r):
        assert_close(a, b, ops=scan_ops(model, T, backward=False), cond=cond, what="output")
    assert_close(gx, gx_r, ops=scan_ops(model, T), cond=cond, what="x.grad")
    assert gp.keys() == gp_r.keys()
    for k in gp:
        assert_close(gp[k], gp_r[k], ops=scan_ops(model, T, x.numel()), cond=cond, what=k)
    for k, v in ref._states.items():  # the kept states too
        assert_close(m._states[k], v, ops=scan_ops(model, T, backward=False), cond=cond, what=k)


# ------------------------------------------------------------------ Triton under a trace: launch plans
def test_triton_launch_plans_under_a_trace_do_not_depend_on_param_values():
    """Under torch.compile every param reaches the kernels as a tensor (an entry of the module's
    float64 tensor, at an offset of 8 bytes for odd entries: not 16-byte aligned). The launch
    plans that skip argument preparation are keyed by each tensor's kernel mode, dtype and
    alignment, not its value: 12 values of `tau` and `v_threshold` use the plans of the first
    call, and every call gives the eager result for its values."""
    torch._dynamo.reset()
    m = flexdsl.load("lif", backend="triton")
    ref = flexdsl.load("lif", backend="torch")
    prog = m.compiled.program("triton")
    cm = torch.compile(m, fullgraph=True, backend="aot_eager")
    x = _x(T=8, scale=3.0)
    _fwd_bwd(cm, x)
    prog.launch_plans.clear()
    for i in range(12):
        for mod in (m, ref):
            mod.tau = 1.5 + 0.25 * i
            mod.v_threshold = 0.6 + 0.05 * i
            mod.reset()
        out, gx, _ = _fwd_bwd(cm, x)
        out_r, gx_r, _ = _fwd_bwd(ref, x)
        assert torch.equal(out[0], out_r[0])
        assert_close(gx, gx_r, ops=scan_ops("lif", x.shape[0]))
        if i == 0:
            plans = dict(prog.launch_plans.plans)
    assert len(plans) == 2 and all(k[0] in ("t", "bwd") for k in plans)  # the forward's and the backward's
    assert prog.launch_plans.plans == plans  # (no plan per value)


# ------------------------------------------------------------------ layouts: channels_last steps
def _channels_last(x: torch.Tensor) -> torch.Tensor:
    """[T, B, C, H, W] with every step in NHWC order (as a channels_last network gives it)."""
    return x.permute(0, 1, 3, 4, 2).contiguous().permute(0, 1, 4, 2, 3)


@pytest.mark.parametrize("model", ["lif", "plif"])
def test_triton_kernels_run_on_channels_last_steps_and_keep_the_layout(model):
    """The kernels compute each element of a step alone, so an input whose steps are dense in
    another order (channels_last) is used as it is: the outputs, the kept states and the input's
    gradient come back in its layout (no copy to NCHW and back), with the values of the torch
    backend; a per-channel param and a kept state are read in that layout too, and a second
    call continues from the kept states."""
    x = _channels_last(_x(T=5, shape=(2, 3, 4, 5), scale=3.0))
    assert not x.is_contiguous() and x.stride(2) == 1
    extra = {"tau": torch.tensor([2.0, 3.0, 4.0]).reshape(3, 1, 1)} if model == "lif" else {}
    m = flexdsl.load(model, backend="triton", **extra)
    ref = flexdsl.load(model, backend="torch", **extra)
    for _call in range(2):  # (the second call starts from the kept states)
        m.detach()
        ref.detach()
        out, gx, gp = _fwd_bwd(m, x)
        out_r, gx_r, gp_r = _fwd_bwd(ref, x)
        assert torch.equal(out[0], out_r[0]) and out[0].sum() > 0
        assert out[0].stride() == x.stride() and gx.stride() == x.stride()
        assert m.v.stride() == x[0].stride()
        # two calls of 5 steps; a param's gradient sums over the input's elements
        assert_close(gx, gx_r, ops=scan_ops(model, 10))
        assert_close(m.v, ref.v, ops=scan_ops(model, 10, backward=False))
        for k in gp_r:
            assert_close(gp[k], gp_r[k], ops=scan_ops(model, 10, x.numel()), what=k)


def test_a_conversion_that_names_no_device_leaves_the_params_tensor_where_it_is():
    """`.to(memory_format=torch.channels_last)` (or `.half()`) converts a module's tensors where
    they are; the float params' tensor (what a trace reads) must stay on its device too, not
    come back to the CPU (on a GPU, a copy to the device in every compiled call, and an error
    under CUDA graphs). Here the tensor is put on the meta device to tell the two apart."""
    m = flexdsl.load("lif", backend="torch")
    m.__dict__["_fixed_t"] = m._fixed_t.to("meta")
    torch.nn.Sequential(m).to(memory_format=torch.channels_last)
    assert m._fixed_t.device.type == "meta"
    m.half()
    assert m._fixed_t.device.type == "meta" and m._fixed_t.dtype == torch.float64


# ------------------------------------------------------------------ the recurrent layer: one graph node
REC_BACKENDS = ["torch", "cpu", "triton"]


def _rec_fwd_bwd(m, x):
    for p in m.parameters():
        p.grad = None
    x = x.detach().clone().requires_grad_(True)
    out = m(x)
    (out * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum().backward()
    return out.detach(), x.grad, {n: p.grad.clone() for n, p in getattr(m, "_orig_mod", m).named_parameters()
                                  if p.grad is not None}


def _rec_x(T=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(T, 3, 12, generator=g) < 0.4).float() * 3 + torch.rand(T, 3, 12, generator=g)


@pytest.mark.parametrize("backend", REC_BACKENDS)
def test_the_recurrent_layer_is_one_graph_node(backend):
    """`torch.compile(fullgraph=True)` of a recurrent layer: one custom op for the whole scan (the
    graph the same for T = 3 and T = 40, never an unrolled step) and no graph break."""
    sizes = {}
    for T in (3, 40):
        torch.manual_seed(0)
        m = flexdsl.recurrent("alif", 12, 16, backend=backend)
        g = _captured_graphs(m, _rec_x(T))
        targets = [str(n.target) for n in g.graph.nodes if n.op == "call_function"]
        assert sum(t.startswith("flexdsl_rec_") for t in targets) == 1, targets
        sizes[T] = len(targets)
    assert sizes[3] == sizes[40]


@pytest.mark.parametrize("backend,compiler", [("torch", "aot_eager"), ("torch", "inductor"), ("cpu", "aot_eager"),
                                              ("cpu", "inductor"), ("triton", "aot_eager")])
def test_compiled_recurrent_layer_equals_eager(backend, compiler):
    """Outputs (exactly), the input's and every weight's and the neuron's learnable param's
    gradients and the kept states equal eager, over two calls (the second continues from the
    kept states: `feedback` and the neuron's), and new values of a neuron param compile nothing."""
    torch._dynamo.reset()
    torch.manual_seed(1)
    m = flexdsl.recurrent("plif", 12, 16, backend=backend)
    ref = copy.deepcopy(m)
    cm = torch.compile(m, fullgraph=True, backend=compiler)
    for call in range(3):
        m.detach()  # (truncated BPTT: the kept states continue, their graph does not)
        ref.detach()
        if call == 2:  # a new value of a non-learnable param: an input of the graph, not a guard
            counters.clear()
            m.neuron.v_threshold = ref.neuron.v_threshold = 0.8
        x = _rec_x(seed=call)
        out, gx, gp = _rec_fwd_bwd(cm, x)
        out_r, gx_r, gp_r = _rec_fwd_bwd(ref, x)
        assert torch.equal(out, out_r) and out.sum() > 0
        ops = layer_ops("plif", 6, 3, 12, 16)
        assert_close(gx, gx_r, ops=ops, what="x.grad")
        assert gp.keys() == gp_r.keys() and "neuron.w" in gp
        for k in gp:
            assert_close(gp[k], gp_r[k], ops=ops + x.numel(), what=k)
        assert torch.equal(m.feedback, ref.feedback)
        assert_close(m.neuron.v, ref.neuron.v, ops=3 * ops)  # (three calls)
    assert counters["stats"]["unique_graphs"] == 0, dict(counters["stats"])


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_compiled_recurrent_training_runs_the_scan_once(backend, monkeypatch):
    """Under torch.compile a training call runs the layer's forward scan once, keeping what the
    backward reads, as eagerly (the custom forward op returns it; the backward op used to run the
    whole forward again), and its gradients are eager's."""
    from flexdsl.backends import layercall

    seen = []
    real = layercall.forward

    def spy(prog, x, w, s0, w_in, b, xb, inputs, states, params, dense, save, *rest):
        seen.append(save)
        return real(prog, x, w, s0, w_in, b, xb, inputs, states, params, dense, save, *rest)

    monkeypatch.setattr(layercall, "forward", spy)
    torch._dynamo.reset()
    torch.manual_seed(3)
    m = flexdsl.recurrent("plif", 12, 16, backend=backend)
    ref = copy.deepcopy(m)
    cm = torch.compile(m, fullgraph=True, backend="aot_eager")
    got = _rec_fwd_bwd(cm, _rec_x())
    seen.clear()
    m.reset()
    got = _rec_fwd_bwd(cm, _rec_x())
    assert seen == [True]
    want = _rec_fwd_bwd(ref, _rec_x())
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    for k in want[2]:
        assert torch.equal(got[2][k], want[2][k]), k


@pytest.mark.parametrize("backend", ["torch", "cpu"])
def test_compiled_recurrent_layer_of_a_model_never_run(backend):
    """The first call of a model text nothing has loaded is a compiled one: the scan is chosen,
    generated (and on the CPU kernels built) and loaded (and its ops registered) at trace time,
    outside the graph."""
    torch._dynamo.reset()
    torch.manual_seed(2)
    m = flexdsl.recurrent(flexdsl.loads(_fresh_text("lif"), backend="torch"), 12, 8, backend=backend)
    ref = copy.deepcopy(m)
    out, gx, gp = _rec_fwd_bwd(torch.compile(m, fullgraph=True, backend="aot_eager"), _rec_x())
    out_r, gx_r, gp_r = _rec_fwd_bwd(ref, _rec_x())
    assert torch.equal(out, out_r)
    ops = layer_ops("lif", 6, 3, 12, 8)
    assert_close(gx, gx_r, ops=ops)
    assert_close(gp["W_rec"], gp_r["W_rec"], ops=ops)


def test_compiled_bfloat16_call_starts_from_the_initial_state_eager_starts_from():
    """An initial state computed from params (adex: v = E_L = -70.6 mV) is a float eagerly, which
    the kernels take in float32; under a trace it is a float64 tensor, which they load in float32
    too (it used to be rounded to the input's bfloat16 first: -70.5 mV)."""
    torch._dynamo.reset()
    x = torch.zeros(4, 3, dtype=torch.bfloat16)
    m = flexdsl.load("adex", backend="triton")
    ref = flexdsl.load("adex", backend="triton")
    with torch.no_grad():
        torch.compile(m, fullgraph=True, backend="aot_eager")(x)
        ref(x)
    # at rest from E_L, the adaptation current stays 0; from bfloat16's -70.5 mV it would not
    assert ref.w.abs().max() == 0
    assert torch.equal(m.v, ref.v) and torch.equal(m.w, ref.w)
