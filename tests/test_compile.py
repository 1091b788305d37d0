"""torch.compile of flexdsl layers, against the eager modules: a compiled first call in a fresh
process with empty caches, the time loop as one graph node (the graph does not grow with T),
no recompilation when a non-learnable param changes (and none of flexdsl's own when the grad
mode switches), and compiled outputs and gradients equal to eager for the library models on
every backend (torch, the CPU kernels, Triton through its interpreter).

The library-wide comparison runs a representative subset by default; every model runs with
`python -m pytest -m compile_all tests/test_compile.py` (compiling is slow on 2 cores)."""

from __future__ import annotations

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

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = ["torch", "cpu", "triton"]
if not backends.get("cpu").available():  # (no C++ compiler here: test_cpu_backend checks the fallback)
    BACKENDS.remove("cpu")

# models with what the others lack between them: learnable params (plif, klif), several states and
# outputs (snn_synaptic, hodgkin_huxley: rk4), derived params (resonate_fire), bookkeeping states
# (lif_refractory), exp in the step (eif)
SUBSET = ["lif", "plif", "klif", "snn_synaptic", "hodgkin_huxley", "resonate_fire", "lif_refractory", "eif"]
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
torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-6)
for (name, p), q in zip(net.named_parameters(), ref.parameters()):
    torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)
print(f"ok {t1 - t0:.1f} s")
"""


@pytest.mark.parametrize("backend,compiler", [("auto", "inductor"), ("torch", "aot_eager"), ("triton", "aot_eager")])
def test_compiled_first_call_in_a_fresh_process_with_empty_caches(tmp_path, backend, compiler):
    """`torch.compile(fullgraph=True)` of a network whose first call ever is the compiled one:
    nothing was generated, built, loaded or registered before (empty flexdsl and Inductor caches,
    a new process). "auto" is the CPU kernels here (built during the trace)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FLEXDSL_CACHE_DIR": str(tmp_path / "flexdsl"),
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
    torch.testing.assert_close(gx, gx_r, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gp["w"], gp_r["w"], rtol=1e-5, atol=1e-6)


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
        torch.testing.assert_close(out[0], out_r[0])
        torch.testing.assert_close(gx, gx_r, rtol=1e-5, atol=1e-6)
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
def _compile_params():
    out = []
    for model in flexdsl.library():
        marks = [] if model in SUBSET else [pytest.mark.compile_all]
        for backend in BACKENDS:
            for compiler in ("aot_eager", "inductor"):
                # inductor on the default run: two models per backend (the neuron is an opaque node
                # there, so the compiler's choice matters for the code around it)
                m = marks if compiler == "aot_eager" or model in ("plif", "snn_synaptic") else \
                    [pytest.mark.compile_all]
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
    for a, b in zip(out, out_r):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6 * float(b.abs().max().clamp(min=1e-30)))
    scale = float(gx_r.abs().max().clamp(min=1e-30))
    torch.testing.assert_close(gx, gx_r, rtol=1e-4, atol=1e-5 * scale)
    assert gp.keys() == gp_r.keys()
    for k in gp:
        torch.testing.assert_close(gp[k], gp_r[k], rtol=1e-4, atol=1e-5 * float(gp_r[k].abs().max()))
    for k, v in ref._states.items():  # the kept states too
        torch.testing.assert_close(m._states[k], v, rtol=1e-5, atol=1e-6 * float(v.abs().max().clamp(min=1e-30)))
