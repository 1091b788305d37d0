"""The packaged model library (neurons/*.neuron): every model loads and runs, the files are
documented and pass `flexdsl check`, and the SpikingJelly-derived models reproduce
SpikingJelly 2.0.0 exactly (spikes) and to 1e-5 (input and parameter gradients).

The reference is the installed SpikingJelly itself (its CPU kernels / torch reference path),
never values produced by flexdsl. The snnTorch and Norse models are checked in
test_library_snntorch_norse.py, the ODE models against Brian2 and closed forms in
test_library_ode.py.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

import flexdsl

from tolerances import assert_close, scan_ops

warnings.filterwarnings("ignore", module="spikingjelly")
from spikingjelly.activation_based import functional as sj_functional  # noqa: E402
from spikingjelly.activation_based import neuron as sj_neuron  # noqa: E402
from spikingjelly.activation_based import surrogate as sj_surrogate  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NEURONS = ROOT / "neurons"
STEMS = sorted(p.stem for p in NEURONS.glob("*.neuron"))

# The models the library promises (file stems).
REQUIRED = {
    "if",
    "lif",
    "plif",
    "qif",
    "eif",
    "izhikevich",
    "cuba_lif",
    "snn_leaky",
    "snn_synaptic",
    "lapicque",
    "norse_lif",
    "li",
    "adex",
    "izhikevich_2003",
    "alif",
    "resonate_fire",
    "hodgkin_huxley",
    "lif_soft",
    "lif_no_decay_input",
    "klif",
}


def text_of(stem: str) -> str:
    return (NEURONS / f"{stem}.neuron").read_text()


def declared(text: str, kind: str) -> list[str]:
    """Names declared by `input`/`param`/`state` lines (read from the text, not from flexdsl)."""
    names: list[str] = []
    for line in text.splitlines():
        m = re.match(rf"\s+{kind}\s+(.+)", line)
        if m:
            head = m.group(1).split('"')[0]
            if kind == "input":
                names += [n.strip() for n in head.split(",") if n.strip()]
            else:
                names.append(head.split("=")[0].strip())
    return names


def is_spiking(text: str) -> bool:
    return re.search(r"^\s+spike\s+when\b", text, re.M) is not None


_SURROGATE_CLAUSE = re.compile(r"(^\s+spike\s+when\b.*?\bsurrogate\s+)\w+\s*\([^)]*\)", re.M)


def with_surrogate(text: str, clause: str) -> str:
    """The model text with the surrogate of its spike rule replaced by `clause`."""
    new, n = _SURROGATE_CLAUSE.subn(lambda m: m.group(1) + clause, text)
    assert n == 1, "expected exactly one spike rule with a surrogate clause"
    return new


def as_tuple(out) -> tuple[torch.Tensor, ...]:
    return out if isinstance(out, tuple) else (out,)


# ---------------------------------------------------------------------------------------------
# The library as a whole
# ---------------------------------------------------------------------------------------------


def test_library_lists_every_file():
    lib = set(flexdsl.library())
    assert REQUIRED <= set(STEMS), f"missing files: {sorted(REQUIRED - set(STEMS))}"
    assert set(STEMS) <= lib, f"files not listed by flexdsl.library(): {sorted(set(STEMS) - lib)}"


@pytest.mark.parametrize("stem", STEMS)
def test_file_is_documented(stem):
    """Docstring naming a reference, a description string on every input, param and state, and
    its unit: written with the value (a model with units) or in parentheses in the description."""
    text = text_of(stem)
    assert re.search(r'^neuron \w+:\n\s+"""', text, re.M), "the docstring must open the body"
    doc = text.split('"""')[1]
    assert "Reference" in doc, "the docstring must name its reference"
    checked = flexdsl.compile(stem).checked
    for line in text.splitlines():
        if re.match(r"\s+(input|param|state)\s", line):
            m = re.search(r'"([^"]+)"\s*$', line)
            assert m, f"undocumented declaration: {line.strip()}"
            if checked.units is None:
                assert re.search(r"\([^)]+\)", m.group(1)), f"no unit in parentheses: {line.strip()}"
    if checked.units is not None:  # every declaration has a unit ("1": dimensionless)
        for decl in [*checked.inputs, *checked.params, *checked.states]:
            assert decl.meta.get("unit"), decl.name


def test_check_cli_accepts_the_library():
    files = [str(NEURONS / f"{s}.neuron") for s in STEMS]
    r = subprocess.run(
        [sys.executable, "-m", "flexdsl", "check", *files],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("stem", STEMS)
def test_model_runs_with_defaults(stem, dtype):
    text = text_of(stem)
    m = flexdsl.load(stem, backend="torch")
    g = torch.Generator().manual_seed(1)
    xs = [
        (torch.rand(20, 3, 5, generator=g, dtype=torch.float64) * 2).to(dtype).requires_grad_(True)
        for _ in declared(text, "input")
    ]
    outs = as_tuple(m(*xs))
    assert len(outs) >= 1
    for o in outs:
        assert o.shape == (20, 3, 5)
        assert o.dtype == dtype
        assert torch.isfinite(o).all()
    for s in declared(text, "state"):
        assert torch.isfinite(torch.as_tensor(getattr(m, s))).all()
    if is_spiking(text):
        assert set(torch.unique(outs[0].detach()).tolist()) <= {0.0, 1.0}
        sum(o.sum() for o in outs).backward()
        for x in xs:
            assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("stem", STEMS)
def test_reset_restores_initial_state(stem):
    text = text_of(stem)
    m = flexdsl.load(stem, backend="torch")
    g = torch.Generator().manual_seed(2)
    xs = [torch.rand(12, 4, generator=g) * 2 for _ in declared(text, "input")]
    first = [o.clone() for o in as_tuple(m(*xs))]
    m.reset()
    second = as_tuple(m(*xs))
    for a, b in zip(first, second):
        assert torch.equal(a, b)


# ---------------------------------------------------------------------------------------------
# SpikingJelly 2.0.0
# ---------------------------------------------------------------------------------------------

# SpikingJelly surrogate -> the same surrogate in the .neuron language (docs/language.md, section 6).
# "default" keeps the file's own surrogate clause and SpikingJelly's default surrogate of the class.
SJ_SURROGATES: dict[str, tuple[Callable[[], object] | None, str | None]] = {
    "default": (None, None),
    "sigmoid": (lambda: sj_surrogate.Sigmoid(alpha=4.0), "sigmoid(alpha=4.0)"),
    "atan": (lambda: sj_surrogate.ATan(alpha=2.0), "atan(alpha=2.0)"),
    "sigmoid_alpha2": (lambda: sj_surrogate.Sigmoid(alpha=2.0), "sigmoid(alpha=2.0)"),
    "atan_alpha3": (lambda: sj_surrogate.ATan(alpha=3.0), "atan(alpha=3.0)"),
    "piecewise_quadratic": (
        lambda: sj_surrogate.PiecewiseQuadratic(alpha=1.0),
        "piecewise_quadratic(alpha=1.0)",
    ),
    "piecewise_exp": (lambda: sj_surrogate.PiecewiseExp(alpha=1.0), "piecewise_exp(alpha=1.0)"),
    "soft_sign": (lambda: sj_surrogate.SoftSign(alpha=2.0), "soft_sign(alpha=2.0)"),
    "super_spike": (lambda: sj_surrogate.SuperSpike(alpha=1.0), "super_spike(alpha=1.0)"),
    "erf": (lambda: sj_surrogate.Erf(alpha=2.0), "erf(alpha=2.0)"),
    "rect": (lambda: sj_surrogate.Rect(alpha=1.0), "rect(alpha=1.0)"),
}


def _sj(cls, surrogate_function, detach_reset, **kw):
    """A SpikingJelly node in multi-step mode (CPU: its torch reference / CPU kernels).
    surrogate_function=None: the class's default surrogate."""
    if surrogate_function is not None:
        kw = dict(kw, surrogate_function=surrogate_function)
    try:
        node = cls(detach_reset=detach_reset, step_mode="m", **kw)
    except TypeError:  # CUBALIFNode takes neither step_mode nor detach_reset
        node = cls(**kw)
        node.step_mode = "m"
        node.detach_reset = detach_reset
    return node


@dataclass
class SJCase:
    stem: str
    cls: type
    sj_kwargs: dict = field(default_factory=dict)
    overrides: dict = field(default_factory=dict)  # flexdsl param overrides for the same model
    scale: float = 3.0  # input = rand * scale + offset
    offset: float = 0.0
    normal: bool = False  # input = randn * scale + offset
    params: dict = field(default_factory=dict)  # flexdsl learnable param -> SpikingJelly parameter
    states: dict = field(default_factory=lambda: {"v": "v"})
    detach_ok: bool = True  # False where SpikingJelly's detach_reset differs by design (see file)

    def make_sj(self, surrogate_function, detach_reset):
        return _sj(self.cls, surrogate_function, detach_reset, **self.sj_kwargs)

    def inputs(self, g, dtype, T=32, shape=(4, 8)):
        if self.normal:
            x = torch.randn(T, *shape, generator=g, dtype=torch.float64)
        else:
            x = torch.rand(T, *shape, generator=g, dtype=torch.float64)
        return (x * self.scale + self.offset).to(dtype)


SJ_CASES = {
    "if": SJCase("if", sj_neuron.IFNode, scale=1.0),
    "if_soft": SJCase("if_soft", sj_neuron.IFNode, dict(v_reset=None), scale=1.0),
    "lif": SJCase("lif", sj_neuron.LIFNode),
    "lif_tau3_vreset": SJCase(
        "lif", sj_neuron.LIFNode, dict(tau=3.0, v_reset=-0.2), dict(tau=3.0, v_reset=-0.2), scale=3.5
    ),
    "lif_soft": SJCase("lif_soft", sj_neuron.LIFNode, dict(v_reset=None)),
    "lif_soft_tau4": SJCase("lif_soft", sj_neuron.LIFNode, dict(tau=4.0, v_reset=None), dict(tau=4.0)),
    "lif_no_decay_input": SJCase("lif_no_decay_input", sj_neuron.LIFNode, dict(decay_input=False), scale=1.2),
    "plif": SJCase("plif", sj_neuron.ParametricLIFNode, params={"w": "w"}),
    "plif_init_tau3": SJCase(
        "plif",
        sj_neuron.ParametricLIFNode,
        dict(init_tau=3.0),
        dict(init_tau=3.0),
        scale=3.5,
        params={"w": "w"},
    ),
    "plif_soft": SJCase(
        "plif_soft",
        sj_neuron.ParametricLIFNode,
        dict(init_tau=3.0, v_reset=None),
        dict(init_tau=3.0),
        params={"w": "w"},
    ),
    "qif": SJCase("qif", sj_neuron.QIFNode, scale=1.5),
    "eif": SJCase("eif", sj_neuron.EIFNode, scale=1.5),
    "izhikevich": SJCase("izhikevich", sj_neuron.IzhikevichNode, scale=2.0, states={"v": "v", "w": "w"}),
    "izhikevich_adapt": SJCase(
        "izhikevich",
        sj_neuron.IzhikevichNode,
        dict(a=0.3, b=0.2, tau_w=3.0),
        dict(a=0.3, b=0.2, tau_w=3.0),
        scale=2.5,
        states={"v": "v", "w": "w"},
        detach_ok=False,
    ),
    "cuba_lif": SJCase("cuba_lif", sj_neuron.CUBALIFNode, scale=0.45, states={"v": "v", "c": "c"}),
    "klif": SJCase("klif", sj_neuron.KLIFNode, params={"k": "k"}),
    "raf": SJCase("raf", sj_neuron.RAFNode, scale=1.0, normal=True, states={"v": "v", "u": "u"}),
}


def run_against_sj(case: SJCase, sg: str, detach: bool, dtype, seed: int = 0, state_loss: bool = False):
    sj_sg, clause = SJ_SURROGATES[sg]
    g = torch.Generator().manual_seed(seed)
    x = case.inputs(g, dtype)

    ref = case.make_sj(sj_sg() if sj_sg is not None else None, detach).to(dtype)
    sj_functional.reset_net(ref)
    text = text_of(case.stem) if clause is None else with_surrogate(text_of(case.stem), clause)
    m = flexdsl.loads(text, step_mode="m", backend="torch", detach_reset=detach, **case.overrides).to(dtype)

    x_ref = x.clone().requires_grad_(True)
    x_m = x.clone().requires_grad_(True)
    s_ref = ref(x_ref)
    s_m = m(x_m)
    s_m = as_tuple(s_m)[0]

    assert s_m.shape == s_ref.shape
    assert s_m.dtype == dtype
    rate = s_ref.double().mean().item()
    assert 0.03 < rate < 0.97, f"input scaling gives a degenerate spike rate {rate}"
    mism = (s_m.to(s_ref.dtype) != s_ref).nonzero()
    assert mism.numel() == 0, f"{len(mism)} spikes differ from SpikingJelly, first at {mism[:3].tolist()}"

    T, opts = x.shape[0], dict(detach_reset=detach)
    for mine, theirs in case.states.items():
        assert_close(getattr(m, mine), getattr(ref, theirs).to(dtype), ops=scan_ops(text, T, backward=False, **opts),
                     what=mine)

    w_s = torch.randn(x.shape, generator=g, dtype=torch.float64).to(dtype)
    loss_ref = (s_ref * w_s).sum()
    loss_m = (s_m * w_s).sum()
    if state_loss:
        w_v = torch.randn(x.shape[1:], generator=g, dtype=torch.float64).to(dtype)
        loss_ref = loss_ref + (ref.v * w_v).sum()
        loss_m = loss_m + (m.v * w_v).sum()
    loss_ref.backward()
    loss_m.backward()
    assert x_ref.grad is not None and x_m.grad is not None
    assert x_ref.grad.abs().sum() > 0
    assert_close(x_m.grad, x_ref.grad, ops=scan_ops(text, T, **opts), what="x.grad")
    for mine, theirs in case.params.items():
        p_m, p_ref = getattr(m, mine), getattr(ref, theirs)
        assert isinstance(p_m, torch.nn.Parameter), f"{mine} must be an nn.Parameter"
        assert_close(p_m.to(dtype), p_ref.to(dtype), ops=1, what=mine)
        assert p_m.grad is not None, f"learnable {mine} got no gradient"
        # a param's gradient sums its T-step gradient over every element of the input
        assert_close(p_m.grad.to(dtype), p_ref.grad.to(dtype), ops=scan_ops(text, T, x.numel(), **opts),
                     what=f"{mine}.grad")
    return m, ref


_SJ_MATRIX = [
    pytest.param(
        case, sg, detach, dtype, id=f"{case}-{sg}-{'detach' if detach else 'nodetach'}-{str(dtype)[6:]}"
    )
    for case, c in SJ_CASES.items()
    for sg in ("default", "sigmoid", "atan")
    for detach in (False, True)
    for dtype in (torch.float32, torch.float64)
    if c.detach_ok or not detach
]


@pytest.mark.parametrize("case,sg,detach,dtype", _SJ_MATRIX)
def test_matches_spikingjelly(case, sg, detach, dtype):
    run_against_sj(SJ_CASES[case], sg, detach, dtype)


@pytest.mark.parametrize("sg", sorted(SJ_SURROGATES))
def test_lif_surrogates_match_spikingjelly(sg):
    run_against_sj(SJ_CASES["lif"], sg, False, torch.float32, seed=3)
    run_against_sj(SJ_CASES["lif_soft"], sg, True, torch.float32, seed=4)


@pytest.mark.parametrize("case", ["lif", "plif", "izhikevich_adapt"])
def test_final_state_gradient_matches_spikingjelly(case):
    """A loss on the final membrane potential (m.v after a call) back-propagates like SpikingJelly's."""
    run_against_sj(SJ_CASES[case], "sigmoid", False, torch.float32, seed=6, state_loss=True)


def test_lif_single_step_mode_matches_spikingjelly():
    g = torch.Generator().manual_seed(7)
    x = torch.rand(24, 4, 8, generator=g) * 3
    ref = sj_neuron.LIFNode(step_mode="s")
    m = flexdsl.load("lif", step_mode="s", backend="torch")
    xr, xm = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    sr = torch.stack([ref(xt) for xt in xr])
    sm = torch.stack([m(xt) for xt in xm])
    assert torch.equal(sm, sr)
    assert_close(m.v, ref.v, ops=scan_ops("lif", 24, backward=False))
    w = torch.randn(x.shape, generator=g)
    (sr * w).sum().backward()
    (sm * w).sum().backward()
    assert_close(xm.grad, xr.grad, ops=scan_ops("lif", 24))


@pytest.mark.parametrize(
    "stem,cls,kw", [("lif", sj_neuron.LIFNode, {}), ("izhikevich", sj_neuron.IzhikevichNode, {})]
)
def test_state_sequences_match_spikingjelly(stem, cls, kw):
    g = torch.Generator().manual_seed(8)
    x = torch.rand(20, 3, 5, generator=g) * 3
    ref = cls(step_mode="m", store_v_seq=True, **kw)
    m = flexdsl.load(stem, backend="torch", store_state_seqs=True)
    with torch.no_grad():
        sr, sm = ref(x), m(x)
    assert torch.equal(sm, sr)
    assert m.state_seqs["v"].shape == (20, 3, 5)
    assert_close(m.state_seqs["v"], ref.v_seq, ops=scan_ops(stem, 20, backward=False))


def test_reset_between_sequences_matches_spikingjelly():
    """Two sequences, with reset in between (SpikingJelly's reset_net), and a carried-over state without."""
    g = torch.Generator().manual_seed(9)
    x1, x2 = torch.rand(10, 6, generator=g) * 3, torch.rand(10, 6, generator=g) * 3
    ref = sj_neuron.LIFNode(step_mode="m")
    m = flexdsl.load("lif", backend="torch")
    with torch.no_grad():
        assert torch.equal(m(x1), ref(x1))
        assert torch.equal(m(x2), ref(x2))  # continues from the state left by x1
        sj_functional.reset_net(ref)
        sj_functional.reset_net(m)
        assert torch.equal(m(x2), ref(x2))


@pytest.mark.parametrize(
    "stem,bad",
    [
        ("lif", dict(tau=0.5)),
        ("lif", dict(v_reset=1.5)),  # reset above the threshold
        ("plif", dict(init_tau=1.0)),
        ("cuba_lif", dict(c_decay=1.5)),
        ("snn_leaky", dict(beta=1.2)),
        ("snn_synaptic", dict(alpha=-0.1)),
        ("norse_lif", dict(dt=0.0)),
        ("adex", dict(C=-281.0)),
        ("hodgkin_huxley", dict(g_Na=-1.0)),
        ("resonate_fire", dict(b=0.5)),  # an undamped oscillator is not the model
        ("alif", dict(tau_a=0.0)),
    ],
)
def test_where_constraints_reject_bad_parameters(stem, bad):
    with pytest.raises(flexdsl.FlexDSLError):
        flexdsl.load(stem, backend="torch", **bad)


def test_izhikevich_single_step_mode_matches_spikingjelly():
    g = torch.Generator().manual_seed(10)
    x = torch.rand(24, 4, 8, generator=g) * 2.5
    kw = dict(a=0.3, b=0.2, tau_w=3.0)
    ref = sj_neuron.IzhikevichNode(step_mode="s", **kw)
    m = flexdsl.load("izhikevich", step_mode="s", backend="torch", **kw)
    xr, xm = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    sr = torch.stack([ref(xt) for xt in xr])
    sm = torch.stack([m(xt) for xt in xm])
    assert torch.equal(sm, sr)
    assert_close(m.w, ref.w, ops=scan_ops("izhikevich", 24, backward=False))
    w = torch.randn(x.shape, generator=g)
    (sr * w).sum().backward()
    (sm * w).sum().backward()
    assert_close(xm.grad, xr.grad, ops=scan_ops("izhikevich", 24))


def test_plif_per_channel_time_constant_matches_spikingjelly_per_channel():
    """param_shapes={"w": (C, 1)}: one learnable w per channel; each channel behaves like its own
    SpikingJelly ParametricLIFNode(init_tau=tau_c), and receives that node's gradient."""
    taus = [1.5, 2.0, 4.0]
    g = torch.Generator().manual_seed(16)
    x = torch.rand(24, len(taus), 8, generator=g) * 3
    m = flexdsl.load("plif", backend="torch", param_shapes={"w": (len(taus), 1)})
    assert isinstance(m.w, torch.nn.Parameter) and tuple(m.w.shape) == (len(taus), 1)
    with torch.no_grad():
        m.w.copy_(torch.tensor([[-math.log(t - 1.0)] for t in taus]))
    xm = x.clone().requires_grad_(True)
    s_m = m(xm)
    w_s = torch.randn(x.shape, generator=g)
    (s_m * w_s).sum().backward()
    for c, tau in enumerate(taus):
        ref = sj_neuron.ParametricLIFNode(init_tau=tau, step_mode="m")
        xr = x[:, c].clone().requires_grad_(True)
        s_r = ref(xr)
        (s_r * w_s[:, c]).sum().backward()
        assert torch.equal(s_m[:, c], s_r)
        assert_close(xm.grad[:, c], xr.grad, ops=scan_ops("plif", 24))
        assert_close(m.w.grad[c, 0], ref.w.grad, ops=scan_ops("plif", 24, xr.numel()))
