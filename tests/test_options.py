"""Load-time options (issue 19): `surrogate=` and `learnable=` in `flexdsl.load`, `loads`,
`compile`, `recurrent`, the CLI (`--surrogate`, `--learnable`) and `flexdsl.nir.load`.

References: SpikingJelly 2.0.0's nodes with its surrogate objects, snnTorch's `Leaky` with its
surrogate closures (each mapped class: the same gradients), the same model with the surrogate
written in its file (bit-identical), hand-written expectations for the options' semantics, and
a fresh process sharing the disk cache (an option is part of every cache key)."""

from __future__ import annotations

import inspect
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import flexdsl
from flexdsl.runtime import options as opts

from tolerances import assert_close, module_condition, scan_ops

ROOT = Path(__file__).resolve().parent.parent
LIF_TEXT = (ROOT / "neurons" / "lif.neuron").read_text()


def _grads(m, x, w=None):
    if hasattr(m, "reset"):
        m.reset()
    x = x.detach().clone().requires_grad_(True)
    out = m(x)
    out = out[0] if isinstance(out, tuple) else out
    w = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape) if w is None else w
    (out * w).sum().backward()
    return out.detach(), x.grad


def _x(T=12, shape=(3, 5), seed=0, scale=2.5, dtype=torch.float64):
    return torch.rand(T, *shape, generator=torch.Generator().manual_seed(seed), dtype=dtype) * scale


# ------------------------------------------------------------------ surrogate= as text
def test_surrogate_text_equals_the_model_written_with_it():
    """surrogate="atan(alpha=3.0)" compiles the model as if its file said so: bit-identical outputs
    and input gradients, on the torch backend and the CPU kernels."""
    written = flexdsl.loads(LIF_TEXT.replace("sigmoid(alpha=4.0)", "atan(alpha=3.0)"), backend="torch").double()
    x = _x()
    ref = _grads(written, x)
    for backend in ("torch", "auto"):
        m = flexdsl.load("lif", surrogate="atan(alpha=3.0)", backend=backend).double()
        out, gx = _grads(m, x)
        assert torch.equal(out, ref[0])
        torch.testing.assert_close(gx, ref[1], rtol=1e-12, atol=1e-12)
    plain = _grads(flexdsl.load("lif", backend="torch").double(), x)
    assert not torch.allclose(plain[1], ref[1])  # (the surrogate did change the gradient)


def test_a_bare_name_takes_the_defaults_and_keywords_may_use_params():
    a = flexdsl.load("lif", surrogate="atan", backend="torch").double()
    b = flexdsl.load("lif", surrogate="atan(alpha=2.0)", backend="torch").double()
    c = flexdsl.load("lif", surrogate="atan(alpha=2 * v_threshold)", backend="torch", v_threshold=1.0).double()
    x = _x()
    assert torch.equal(_grads(a, x)[1], _grads(b, x)[1])
    assert torch.equal(_grads(b, x)[1], _grads(c, x)[1])


def test_a_surrogate_defined_in_the_option_text():
    """The text may declare a user surrogate, as a model does (used with its defaults; it takes
    the place of the model's surrogate of that name)."""
    box = "box(x, width=0.25) = where(abs(x) < width, 1/(2*width), 0)"
    m = flexdsl.load("lif", surrogate=box, backend="torch").double()
    ref = flexdsl.loads(LIF_TEXT.replace("    spike when", f"    surrogate {box}\n    spike when").replace(
        "surrogate sigmoid(alpha=4.0)", "surrogate box()"), backend="torch").double()
    x = _x()
    assert torch.equal(_grads(m, x)[1], _grads(ref, x)[1])
    assert f"Chosen at load: surrogate={box}" in m.compiled.torch_source
    with pytest.raises(flexdsl.FlexDSLError) as e:
        flexdsl.load("lif", surrogate="box(x, width=0.25) = where(abs(x) < widht, 1, 0)")
    assert (e.value.filename, e.value.column) == ("<load option>", 47) and "did you mean `width`" in e.value.hint
    with pytest.raises(flexdsl.FlexDSLError, match="`v` cannot be used in the surrogate formula"):
        flexdsl.load("lif", surrogate="g(u) = exp(-v*v)")


def test_a_user_surrogate_of_the_file_is_chosen_by_name():
    text = LIF_TEXT.replace("    spike when", "    surrogate box(x, width=0.5) = where(abs(x) < width, 1/(2*width), 0)\n"
                                             "    spike when")
    m = flexdsl.loads(text, surrogate="box(width=0.25)", backend="torch").double()
    ref = flexdsl.loads(text.replace("surrogate sigmoid(alpha=4.0)", "surrogate box(width=0.25)"),
                        backend="torch").double()
    x = _x()
    assert torch.equal(_grads(m, x)[1], _grads(ref, x)[1])


BAD_TEXT = [
    ("atn(alpha=2.0)", 11, "unknown surrogate `atn`", "did you mean `atan`?"),
    ("atan(beta=2.0)", 16, "unknown keyword `beta` for surrogate `atan`", "`atan` takes `alpha`"),
    ("atan(alpha=v)", 22, "`v` cannot be used in a surrogate keyword", None),
    ("atan(alpha=tua)", 22, "unknown name `tua`", "did you mean `tau`?"),
    ("atan(alpha=2.0", 25, "unexpected end of the text", None),
    ("atan(alpha=2.0, alpha=3.0)", 27, "keyword `alpha` given twice", None),
    ("os.system('x')", 13, "unexpected character `.`", None),
    ("atan(alpha=2.0)\nimport os", 26, "one line", None),
    ("", 11, "the surrogate text is empty", None),
    ("sin(alpha=1)", 11, "unknown surrogate `sin`", None),
    ("atan(alpha=_x)", 22, "`_x` cannot be a name here", None),
    ("atan(alpha=2\x1b[31m)", 23, "invalid character U+001B", None),
]


@pytest.mark.parametrize("text,col,msg,hint", BAD_TEXT, ids=[b[2][:30] for b in BAD_TEXT])
def test_bad_surrogate_text_is_located_in_the_text(text, col, msg, hint):
    with pytest.raises(flexdsl.FlexDSLError) as e:
        flexdsl.load("lif", surrogate=text)
    err = e.value
    assert (err.filename, err.line, err.column) == ("<load option>", 1, col), str(err)
    assert msg in err.reason
    shown = ("surrogate=" + text).split("\n")[0]
    assert str(err).split("\n")[1].startswith(shown[:20])  # the text, then a caret under the column
    assert str(err).split("\n")[2] == " " * (col - 1) + "^"
    if hint:
        assert hint in (err.hint or "")


def test_surrogate_errors_in_a_model_with_units_are_located_in_the_text():
    with pytest.raises(flexdsl.FlexDSLError) as e:
        flexdsl.load("adex", surrogate="atan(alpha=2.0)")  # u is a voltage: alpha needs 1/voltage
    assert (e.value.filename, e.value.column) == ("<load option>", 22)
    assert "`alpha` of the surrogate `atan` must be" in e.value.reason and "alpha=2.0/mV" in e.value.hint
    m = flexdsl.load("adex", surrogate="atan(alpha=2/mV)")  # with a unit: fine
    assert "atan" in m.compiled.torch_source


def test_surrogate_on_a_model_without_a_spike_rule_is_an_error():
    with pytest.raises(flexdsl.FlexDSLError, match="has no spike rule") as e:
        flexdsl.load("li", surrogate="atan")
    assert e.value.filename.endswith("li.neuron") and e.value.line > 0


# ------------------------------------------------------------------ SpikingJelly's and snnTorch's objects
SJ_CASES = [
    ("Sigmoid", {}), ("Sigmoid", {"alpha": 2.5}), ("ATan", {}), ("ATan", {"alpha": 3.0}),
    ("PiecewiseQuadratic", {"alpha": 1.5}), ("PiecewiseExp", {"alpha": 2.0}), ("SoftSign", {"alpha": 1.5}),
    ("SuperSpike", {"alpha": 2.0}), ("Erf", {"alpha": 1.5}), ("Rect", {"alpha": 0.75}), ("Rect", {"alpha": 0.3}),
    ("DeterministicPass", {}), ("PiecewiseLeakyReLU", {"w": 0.7, "c": 0.0}),
    # without a built-in equivalent: a user surrogate with SpikingJelly's derivative
    ("PiecewiseLeakyReLU", {"w": 0.7, "c": 0.05}), ("S2NN", {}), ("S2NN", {"alpha": 3.0, "beta": 0.5}),
    ("QPseudoSpike", {}), ("QPseudoSpike", {"alpha": 3.5}), ("LeakyKReLU", {"leak": 0.1, "k": 0.8}),
    ("NonzeroSignLogAbs", {"alpha": 2.0}), ("LogTailedReLU", {"alpha": 0.1}), ("FakeNumericalGradient", {}),
    ("FakeNumericalGradient", {"alpha": 2.0}), ("SquarewaveFourierSeries", {}),
    ("SquarewaveFourierSeries", {"n": 4, "T_period": 6.0}),
]


@pytest.mark.parametrize("cls,kw", SJ_CASES, ids=[f"{c}{kw or ''}" for c, kw in SJ_CASES])
def test_spikingjelly_surrogates_give_spikingjellys_gradients(cls, kw):
    """Each SpikingJelly surrogate class flexdsl maps: `flexdsl.load("lif", surrogate=obj)` equals
    SpikingJelly's LIFNode(surrogate_function=obj): spikes, and input gradients (float64)."""
    from spikingjelly.activation_based import neuron, surrogate

    obj = getattr(surrogate, cls)(**kw)
    x = _x(seed=3) - 0.5  # (u on both sides of 0, and near it)
    w = torch.linspace(-1, 1, x.numel(), dtype=x.dtype).reshape(x.shape)
    sj = neuron.LIFNode(surrogate_function=obj, step_mode="m")
    ref = _grads(sj, x, w)
    for backend in ("torch", "auto"):
        m = flexdsl.load("lif", surrogate=obj, backend=backend).double()
        out, gx = _grads(m, x, w)
        assert torch.equal(out, ref[0])
        torch.testing.assert_close(gx, ref[1], rtol=1e-10, atol=1e-12)
    assert cls in m.compiled.options.origin  # the notes say how it was given
    assert (gx != 0).sum() > 10


def test_every_spikingjelly_surrogate_class_is_mapped_or_refused_by_name():
    """Every surrogate class of SpikingJelly 2.0.0: mapped (tested above), or (its forward pass is
    no step: PoissonPass draws, MultiLevelSpikeCount counts) a located error listing the classes
    understood; never a raw exception."""
    from spikingjelly.activation_based import surrogate

    classes = [c for _, c in inspect.getmembers(surrogate, inspect.isclass)
               if issubclass(c, surrogate.SurrogateFunctionBase) and c is not surrogate.SurrogateFunctionBase]
    assert len(classes) >= 15
    refused = []
    for c in classes:
        try:
            obj = c()
        except TypeError:  # (a class that needs arguments: not a surrogate a user passes bare)
            continue
        if c.__name__ in opts.SPIKINGJELLY or c.__name__ in opts.SPIKINGJELLY_DEFINED:
            assert flexdsl.load("lif", surrogate=obj).compiled.options.surrogate
            continue
        with pytest.raises(flexdsl.FlexDSLError) as e:
            flexdsl.load("lif", surrogate=obj)
        assert e.value.filename.endswith("lif.neuron") and e.value.line == 24  # at the spike rule
        assert "surrogate.ATan" in (e.value.hint or "") and "surrogate.S2NN" in e.value.hint
        refused.append(c.__name__)
    assert refused == ["PoissonPass"]
    with pytest.raises(flexdsl.FlexDSLError, match="MultiLevelSpikeCount"):
        flexdsl.load("lif", surrogate=surrogate.MultiLevelSpikeCount(max_spike_count=4))
    with pytest.raises(flexdsl.FlexDSLError, match="spiking=False"):
        flexdsl.load("lif", surrogate=surrogate.ATan(spiking=False))
    with pytest.raises(flexdsl.FlexDSLError, match="is a class; pass an instance"):
        flexdsl.load("lif", surrogate=surrogate.ATan)


SNN_CASES = [("atan", {}), ("atan", {"alpha": 3.0}), ("fast_sigmoid", {"slope": 10}), ("sigmoid", {"slope": 5}),
             ("straight_through_estimator", {}), ("spike_rate_escape", {}), ("spike_rate_escape", {"beta": 0.5, "slope": 3}),
             # without a built-in equivalent (issue 37): a user surrogate with snnTorch's derivative
             ("triangular", {}), ("triangular", {"threshold": 0.7}), ("heaviside", {}), ("SFS", {"slope": 5, "B": 0.2}),
             ("SFS", {"slope": 25, "B": -0.3})]


@pytest.mark.parametrize("fn,kw", SNN_CASES, ids=[f"{f}{kw or ''}" for f, kw in SNN_CASES])
def test_snntorch_surrogates_give_snntorchs_gradients(fn, kw):
    """snnTorch's surrogate closures, read from their cells: `snn_leaky` with surrogate=obj equals
    snnTorch's Leaky(spike_grad=obj) (its default reset), spikes, membranes and gradients."""
    import snntorch
    from snntorch import surrogate

    obj = getattr(surrogate, fn)(**kw)
    x = _x(seed=4, dtype=torch.float32, scale=1.5)
    ref_m = snntorch.Leaky(beta=0.9, spike_grad=obj, init_hidden=False)
    xr = x.clone().requires_grad_(True)
    mem = torch.zeros_like(x[0])
    spk_seq = []
    for t in range(x.shape[0]):
        spk, mem = ref_m(xr[t], mem)
        spk_seq.append(spk)
    spk = torch.stack(spk_seq)
    w = torch.linspace(-1, 1, spk.numel()).reshape(spk.shape)
    (spk * w).sum().backward()
    for backend in ("torch", "auto"):
        m = flexdsl.load("snn_leaky", surrogate=obj, backend=backend)
        xm = x.clone().requires_grad_(True)
        s, _ = m(xm)
        (s * w).sum().backward()
        assert torch.equal(s, spk)
        cond = module_condition(lambda **kw: flexdsl.load("snn_leaky", surrogate=obj, backend="torch", **kw), x,
                                [w, 0 * w])
        assert_close(xm.grad, xr.grad, ops=scan_ops("snn_leaky", x.shape[0]), cond=cond)
    assert fn in m.compiled.options.origin and (xr.grad != 0).sum() > 10


def test_snntorch_surrogate_derivatives_equal_snntorchs_autograd():
    """Each mapped snnTorch surrogate's S'(u) is what snnTorch's own autograd gives for the same u
    (float64, u on both sides of 0, and at 0, where `>` and `>=` tell the forms apart)."""
    from snntorch import surrogate

    u = torch.tensor([-2.0, -0.8, -0.3, -0.05, 0.0, 0.1, 0.2, 0.35, 0.7, 1.0, 1.3, 3.0], dtype=torch.float64)
    # snnTorch's spikes are float32 whatever u is, so a backward that only scales the incoming
    # gradient by Python numbers (triangular, straight-through) is float32: one rounding, 2^-24;
    # otherwise the formulas differ in form only, the worst case the sigmoid's: flexdsl computes
    # sigma(z)*(1 - sigma(z)), whose 1 - sigma(z) loses log2(e^z) bits at z = slope*max|u| = 15, a
    # relative error of about e^15 * 2^-53 (a few operations more: 16x)
    rtol = 2.0**-24 + 16 * math.exp(15.0) * 2.0**-53
    text = "neuron S:\n    input x\n    state v = 0.0\n    update:\n        v = x\n    spike when v > 0\n"
    for fn, kw in SNN_CASES:
        obj = getattr(surrogate, fn)(**kw)
        ur = u.clone().requires_grad_(True)
        obj(ur).sum().backward()
        m = flexdsl.loads(text, surrogate=obj, backend="torch").double()
        um = u[None].clone().requires_grad_(True)
        m(um).sum().backward()
        torch.testing.assert_close(um.grad[0], ur.grad, rtol=rtol, atol=0, msg=f"{fn}{kw}")


def test_every_snntorch_surrogate_is_mapped_or_refused_by_name():
    """Every surrogate factory of snnTorch 1.0: mapped (tested above), or a located error saying why
    it has no closed form (SSO's gradient is random, LSO fails in snnTorch itself, custom_surrogate
    wraps Python code); never a raw exception."""
    from snntorch import surrogate

    factories = [n for n, f in inspect.getmembers(surrogate, inspect.isfunction) if f.__module__ == surrogate.__name__]
    assert len(factories) >= 10
    mapped = {*opts.SNNTORCH, *opts.SNNTORCH_DEFINED}
    for name in factories:
        if name in mapped:
            assert flexdsl.load("snn_leaky", surrogate=getattr(surrogate, name)()).compiled.options.surrogate
            continue
        obj = getattr(surrogate, name)(lambda *a: a[1]) if name == "custom_surrogate" else getattr(surrogate, name)()
        with pytest.raises(flexdsl.FlexDSLError, match="no closed form to map") as e:
            flexdsl.load("snn_leaky", surrogate=obj)
        assert e.value.filename.endswith("snn_leaky.neuron") and e.value.line > 0
        assert "surrogate.triangular()" in (e.value.hint or "") and "user surrogate" in e.value.hint
    assert sorted(set(factories) - mapped) == sorted(opts.SNNTORCH_REFUSED)
    with pytest.raises(flexdsl.FlexDSLError, match="takes text or a SpikingJelly or snnTorch surrogate object"):
        flexdsl.load("lif", surrogate=lambda u: u)


def test_the_zoo_keywords_are_accepted():
    """SpikingJelly's model zoo passes `surrogate_function=` and `detach_reset=` through
    `spiking_neuron=`; `store_v_seq=` is its name of store_state_seqs."""
    from spikingjelly.activation_based import surrogate

    m = flexdsl.load("lif", surrogate_function=surrogate.ATan(), detach_reset=True, store_v_seq=True)
    assert m.compiled.options.surrogate == "atan(alpha=2.0)" and m.detach_reset and m.store_state_seqs
    with pytest.raises(flexdsl.FlexDSLError, match="both surrogate= and surrogate_function="):
        flexdsl.load("lif", surrogate="atan", surrogate_function=surrogate.ATan())


# ------------------------------------------------------------------ learnable=
def test_learnable_names_a_list_or_all_overriding_the_file():
    names = lambda m: sorted(n for n, _ in m.named_parameters())  # noqa: E731
    assert names(flexdsl.load("plif")) == ["w"]
    assert names(flexdsl.load("plif", learnable=False)) == []
    assert names(flexdsl.load("klif", learnable="k")) == ["k"]
    assert names(flexdsl.load("plif", learnable="v_threshold")) == ["raw_v_threshold"]  # w no longer trained
    assert names(flexdsl.load("plif", learnable=["w", "v_threshold"])) == ["raw_v_threshold", "w"]
    # bounded params train as raw_<name>: init_tau > 1; v_reset < v_threshold bounds the last
    # learnable param it names, v_reset when both are learnable, else v_threshold (from below)
    assert names(flexdsl.load("plif", learnable=True)) == ["raw_init_tau", "raw_v_reset", "v_threshold", "w"]
    m = flexdsl.load("lif", learnable=["v_threshold"])
    assert m.tau == 2.0 and m.v_reset == 0.0 and m.v_threshold.item() == 1.0  # the others stay floats
    x = _x(dtype=torch.float32)
    m(x).sum().backward()
    assert m.raw_v_threshold.grad is not None


def test_learnable_with_per_channel_shapes():
    m = flexdsl.load("lif", learnable=["tau", "v_threshold"], param_shapes={"tau": (5,), "v_threshold": (5,)},
                     tau=torch.tensor([1.5, 2.0, 3.0, 4.0, 8.0]))
    assert m.raw_tau.shape == (5,) and m.raw_v_threshold.shape == (5,)  # (v_threshold > v_reset: bounded)
    assert torch.equal(m.tau.float(), torch.tensor([1.5, 2.0, 3.0, 4.0, 8.0]))
    x = _x(dtype=torch.float32)
    out = m(x)
    for c, tau in enumerate((1.5, 2.0, 3.0, 4.0, 8.0)):
        assert torch.equal(out[..., c], flexdsl.load("lif", tau=tau)(x[..., c].contiguous()))
    out.sum().backward()
    assert m.raw_tau.grad.shape == (5,) and m.raw_v_threshold.grad.shape == (5,)


@pytest.mark.parametrize("value,msg,hint", [
    ("tua", "learnable= names `tua`, which `LIF` does not declare", "did you mean `tau`?"),
    (["tau", "v"], "learnable= names `v`, which is a state of `LIF`, not a param", "only params are trained"),
    ("x", "which is an input of `LIF`", None),
    (3, "learnable= takes a param's name, a list of names, or True/False, not int", "learnable=['tau'"),
    (["tau", 2], "learnable= lists 2, which is not a param's name", None),
])
def test_bad_learnable_is_a_located_error(value, msg, hint):
    with pytest.raises(flexdsl.FlexDSLError) as e:
        flexdsl.load("lif", learnable=value)
    assert msg in e.value.reason
    assert e.value.filename.endswith("lif.neuron") and e.value.line == 2  # the `neuron LIF:` line
    if hint:
        assert hint in e.value.hint


def test_recurrent_layers_take_the_options():
    r = flexdsl.recurrent("lif", 3, 4, surrogate="atan(alpha=2.0)", learnable="tau", backend="torch")
    assert r.neuron.compiled.options.surrogate == "atan(alpha=2.0)"
    assert {"W_in", "W_rec", "bias", "neuron.raw_tau"} == {n for n, _ in r.named_parameters()}
    x = _x(shape=(2, 3), dtype=torch.float32)
    r(x).sum().backward()
    assert r.neuron.raw_tau.grad is not None
    with pytest.raises(flexdsl.FlexDSLError, match="set when the neuron is loaded"):
        flexdsl.recurrent(flexdsl.load("lif"), 3, 4, surrogate="atan")
    with pytest.raises(flexdsl.FlexDSLError, match="unknown surrogate"):
        flexdsl.recurrent("lif", 3, 4, surrogate="atn")


def test_nir_load_takes_the_same_options():
    from spikingjelly.activation_based import surrogate

    net = torch.nn.Sequential(torch.nn.Linear(3, 4), flexdsl.load("lif"))
    g = flexdsl.nir.export(net, torch.zeros(4, 1, 3), dt=1e-3)
    back = flexdsl.nir.load(g, surrogate=surrogate.ATan(alpha=3.0), learnable=True)
    neuron = next(m for m in back.modules() if isinstance(m, flexdsl.runtime.module.NeuronModule))
    assert neuron.compiled.options.surrogate == "atan(alpha=3.0)"
    assert {"raw_tau", "v_threshold"} <= {n for n, _ in neuron.named_parameters()}  # tau > 0: raw_tau
    with pytest.raises(flexdsl.FlexDSLError) as e:
        flexdsl.nir.load(g, surrogate="atan(alhpa=3)")
    assert e.value.filename == "<load option>" and "did you mean `alpha`" in e.value.hint
    with pytest.raises(flexdsl.FlexDSLError, match="takes a param's name"):
        flexdsl.nir.load(g, learnable=3)


# ------------------------------------------------------------------ what was chosen is stated
def test_the_generated_code_show_and_the_docs_state_the_options(tmp_path):
    from spikingjelly.activation_based import surrogate

    m = flexdsl.load("lif", surrogate=surrogate.ATan(alpha=3.0), learnable=["tau"])
    c = m.compiled
    note = "Chosen at load: surrogate=atan(alpha=3.0) (the model writes sigmoid(alpha=4.0), given as spikingjelly's"
    for src in (c.torch_source, c.triton_source, c.artefact("cpu").source):
        assert note in src
        assert "Chosen at load: learnable=['tau'] (trained: tau)" in src
        assert "tau = 1 + softplus(raw_tau)    (where tau > 1)" in src
    assert "surrogate='atan(alpha=3.0)', learnable=['tau']" in repr(m)
    html = m._repr_html_()
    assert "As loaded." in html and "flexdsl.load(&#39;lif&#39;, surrogate=&#39;atan(alpha=3.0)&#39;" in html
    md = flexdsl.docs.render_markdown(c)
    assert "**As loaded.**" in md and "atan" in md
    plain = flexdsl.compile("lif")
    assert "Chosen at load" not in plain.torch_source and "As loaded" not in flexdsl.docs.render_markdown(plain)
    r = _cli(["show", "lif", "--surrogate", "atan(alpha=3.0)", "--learnable", "tau,v_threshold"], tmp_path)
    assert r.returncode == 0 and "# Chosen at load: surrogate=atan(alpha=3.0)" in r.stdout
    assert "# Chosen at load: learnable=['tau', 'v_threshold'] (trained: tau, v_threshold)" in r.stdout


def _cli(args, tmp_path, env_extra=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FLEXDSL_CACHE_DIR": str(tmp_path / "cache"), **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "flexdsl", *args], capture_output=True, text=True, env=env,
                          timeout=600)


def test_the_cli_options_and_their_errors(tmp_path):
    r = _cli(["run", "lif", "--T", "30", "--surrogate", "atn(alpha=2.0)"], tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("<load option>:1:11: error: unknown surrogate `atn`")
    r = _cli(["run", "lif", "--T", "30", "--learnable", "all", "--surrogate", "atan"], tmp_path)
    assert r.returncode == 0 and "state v: final" in r.stdout, r.stderr
    r = _cli(["check", "lif", "--learnable", "tau,nope"], tmp_path)
    assert r.returncode == 1 and "learnable= names `nope`" in r.stderr and "Traceback" not in r.stderr
    r = _cli(["check", "lif", "--learnable", "tau,,x"], tmp_path)
    assert r.returncode == 1 and "bad --learnable" in r.stderr
    r = _cli(["doc", "lif", "-o", str(tmp_path / "site"), "--no-plots", "--surrogate", "atan"], tmp_path)
    assert r.returncode == 0, r.stderr
    page = next((tmp_path / "site").glob("lif*.md")).read_text()
    assert "Chosen at load: surrogate=atan" in page


# ------------------------------------------------------------------ caches key on the options
def test_every_cache_keys_on_the_options(tmp_path):
    """Two option sets of one model never share an artefact, a program, a custom op or a CPU
    library: in one process (the compiled-model cache, the programs, the ops' names), and across
    processes through the disk cache (each process's gradients equal the model written with its
    surrogate)."""
    from flexdsl.runtime.compiler import compile_model

    a = compile_model("lif", options=opts.make("atan(alpha=2.0)", None, lambda: None))
    b = compile_model("lif", options=opts.make("atan(alpha=3.0)", None, lambda: None))
    c = compile_model("lif", options=opts.make("atan(alpha=2.0)", ["tau"], lambda: None))
    plain = compile_model("lif")
    assert len({id(a), id(b), id(c), id(plain)}) == 4
    for backend in ("torch", "triton", "cpu"):
        keys = {x.key(flexdsl.backends.get(backend)) for x in (a, b, c, plain)}
        assert len(keys) == 4
    assert a.program("torch") is not b.program("torch")
    script = (
        "import sys, torch, flexdsl\n"
        "x = torch.rand(10, 2, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3\n"
        "for alpha in sys.argv[1:]:\n"
        "    for backend in ('torch', 'cpu'):\n"
        "        m = flexdsl.load('lif', surrogate=f'atan(alpha={alpha})', backend=backend).double()\n"
        "        xx = x.clone().requires_grad_(True); m(xx).sum().backward()\n"
        "        print(alpha, backend, repr(xx.grad.sum().item()))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FLEXDSL_CACHE_DIR": str(tmp_path / "cache")}
    runs = [subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env,
                           timeout=600) for args in (["2.0", "3.0"], ["3.0", "2.0"])]
    for r in runs:
        assert r.returncode == 0, r.stderr[-2000:]
    got = {tuple(ln.split()[:2]): float(ln.split()[2]) for r in runs for ln in r.stdout.splitlines()}
    for alpha in ("2.0", "3.0"):
        ref = flexdsl.loads(LIF_TEXT.replace("sigmoid(alpha=4.0)", f"atan(alpha={alpha})"),
                            backend="torch").double()
        xx = (torch.rand(10, 2, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 3
              ).requires_grad_(True)
        ref(xx).sum().backward()
        for backend in ("torch", "cpu"):
            assert got[(alpha, backend)] == pytest.approx(xx.grad.sum().item(), rel=1e-12)
    assert got[("2.0", "torch")] != got[("3.0", "torch")]


def test_pickling_and_copies_keep_the_options():
    import copy
    import io
    import pickle

    m = flexdsl.load("lif", surrogate="atan(alpha=3.0)", learnable=["tau"])
    for other in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert other.compiled.options == m.compiled.options
    buf = io.BytesIO()
    torch.save(m, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=False)
    assert back.compiled.options == m.compiled.options and "raw_tau" in dict(back.named_parameters())
    m.detach_reset = True  # the other compiled variant keeps the options
    assert m.compiled.options.surrogate == "atan(alpha=3.0)" and m.compiled.detach_reset


def test_the_readme_section_runs_and_shows_what_flexdsl_prints(tmp_path):
    """README's "Shape a model where it is used": its Python runs (SpikingJelly's zoo through the
    torchvision stand-in of tests/test_zoo.py), and the `flexdsl show` lines it quotes are printed."""
    import re

    from test_zoo import _zoo

    _zoo()
    section = (ROOT / "README.md").read_text().split("## Shape a model where it is used")[1].split("\n## ")[0]
    ns: dict = {}
    for block in re.findall(r"```python\n(.*?)```", section, re.S):
        exec(block, ns)  # noqa: S102 - the README's own example
    quoted = section.split("$ flexdsl show ")[1].split("```")[0].splitlines()
    args = quoted[0].split()
    r = _cli(["show", args[0], "--surrogate", args[2].strip("'"), "--learnable", args[4]], tmp_path)
    for line in quoted[1:]:
        if line.startswith("#"):
            assert line in r.stdout
