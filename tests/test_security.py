"""Nothing from a model file or the cache runs unvalidated: injection through file names,
names, docstrings and the cache never creates a sentinel file; every name, however it clashes
with generated code or with nn.Module, either works or is a located error; a damaged or
untrusted cache is rejected and regenerated; the parser is thread-safe."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import warnings
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import flexdsl  # noqa: E402
from flexdsl import cli  # noqa: E402
from flexdsl.runtime.compiler import compile_model, compile_text  # noqa: E402
from flexdsl.store import cache  # noqa: E402

from tolerances import assert_close, scan_ops  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LIF = (ROOT / "neurons" / "lif.neuron").read_text()


def _sentinel_code(path: Path) -> str:
    return f'__import__("pathlib").Path({str(path)!r}).touch()'


# ------------------------------------------------------------------ file names
HOSTILE_NAMES = [
    'm"""; {code}; """.neuron',
    "m'''; {code}; '''.neuron",
    "m\\\\n{code}.neuron",
    "m\n{code}\n#.neuron",
    "m\r{code}.neuron",
    "m\u2028{code}.neuron",
]


@pytest.mark.parametrize("pattern", HOSTILE_NAMES)
def test_file_names_never_run(tmp_path, monkeypatch, pattern):
    monkeypatch.chdir(tmp_path)
    sentinel = tmp_path / "SENTINEL"
    name = pattern.format(code=_sentinel_code(Path("SENTINEL")))  # a relative path: no "/" in the name
    monkeypatch.setenv("FLEXDSL_CACHE_DIR", str(tmp_path / "cache"))
    # as a label (any string can name a model) ...
    c = compile_text(LIF, name)
    m = flexdsl.NeuronModule(c, backend="torch")
    m(torch.rand(3, 2))
    mt = flexdsl.NeuronModule(c, backend="triton")
    mt(torch.rand(3, 2))
    assert c.torch_source and c.triton_source
    # ... and as a real file where the file system allows the name
    if "\n" not in name and "\r" not in name:
        p = tmp_path / name
        p.write_text(LIF)
        flexdsl.load(str(p), backend="torch")(torch.rand(3, 2))
        assert cli.main(["run", str(p), "--T", "5"]) == 0
        assert cli.main(["show", str(p), "--triton"]) == 0
    assert not sentinel.exists()


def test_windows_paths_and_long_names(tmp_path):
    for label in [r"C:\Users\me\lif.neuron", "C:\\Users\\me\\" + '"""' + ".neuron", "x" * 300 + ".neuron"]:
        c = compile_text(LIF, label)
        m = flexdsl.NeuronModule(c, backend="triton")
        assert m(torch.ones(2, 3) * 2).sum() > 0
        assert repr(label) in c.torch_source  # a repr() literal, nothing else
    long = LIF.replace("neuron LIF:", "neuron " + "L" * 300 + ":")
    m = flexdsl.loads(long, backend="triton")
    assert m(torch.ones(2, 3) * 2).shape == (2, 3)


def test_docstrings_and_descriptions_are_data(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = "__import__('pathlib').Path('SENTINEL').touch()"
    text = f'''neuron Doc:
    """Docstring with code: {code}
    # and a comment line
    \'\'\'; {code}; \'\'\'
    \\"; {code}"""
    input x "{code}"
    param tau = 2.0 "');{code};('"
    state v = 0.0 "\\n; {code}"
    update:
        v = v + (x - v) / tau
    output v
'''
    c = flexdsl.compile(text)
    assert c.checked.ast.doc.startswith("Docstring with code")
    for backend in ("torch", "triton"):
        flexdsl.loads(text, backend=backend)(torch.rand(3, 2))
    assert c.torch_source and c.triton_source
    assert not (tmp_path / "SENTINEL").exists()


# ------------------------------------------------------------------ names
def test_names_that_clash_with_generated_code():
    """Inputs, params, states and locals named like the modules generated code imports,
    Python builtins, derived kernel names, and near-misses of those: all compute correctly."""
    text = """neuron Clash:
    input torch, torch_, v_fin, v_seq, out_v
    param tl = 2.0
    param triton = 0.5
    param ops = 1.0
    param math = 0.25
    param libdevice = 3.0
    param range = 0.1
    param tl_ = 1.5
    state v = 0.0
    state ops_ = 0.0
    update:
        let len = torch * tl + torch_ * triton
        let print = v_fin * ops + v_seq * math + out_v * libdevice
        v = v + len + print - range * v
        ops_ = ops_ + tl_
    output v, ops_
"""
    x = [torch.rand(4, 3, generator=torch.Generator().manual_seed(i)) for i in range(5)]
    v = torch.zeros(3)
    vs = []
    for t in range(4):
        v = v + (x[0][t] * 2.0 + x[1][t] * 0.5) + (x[2][t] * 1.0 + x[3][t] * 0.25 + x[4][t] * 3.0) - 0.1 * v
        vs.append(v)
    expected = torch.stack(vs)
    for backend in ("torch", "triton"):
        m = flexdsl.loads(text, backend=backend)
        out_v, out_ops = m(*x)
        assert_close(out_v, expected, ops=scan_ops(text, 4, backward=False))
        assert out_ops[-1].tolist() == [6.0] * 3  # (a count: exact)


@pytest.mark.parametrize("name", ["float", "to", "reset", "backend", "step_mode", "core", "compiled",
                                  "detach_reset", "state_seqs", "training", "forward", "state_dict"])
def test_module_attribute_names_are_located_errors(name):
    for decl in (f"param {name} = 0.5", f"state {name} = 0.5"):
        text = f"neuron A:\n    input x\n    {decl}\n    state w = 0.0\n    update:\n        w = w + x*{name}\n"
        with pytest.raises(flexdsl.FlexDSLError) as e:
            flexdsl.loads(text)
        assert e.value.line == 3 and e.value.column == len(decl.split()[0]) + 6
        # a short hint (issue 23: not a list of ~90 names) that says where the list is
        hint = e.value.hint or ""
        assert f"`{name}_`" in hint and "section 13" in hint and len(hint) < 300, hint


def test_every_public_attribute_of_the_module_is_reserved():
    """A param or state named like any public attribute of the loaded module (nn.Module's,
    SpikingJelly's MemoryModule's or flexdsl's own) would shadow it: each is a reserved name."""
    from flexdsl.frontend.catalog import MODULE_ATTRIBUTES
    from flexdsl.runtime.module import NeuronModule

    public = {a for a in dir(NeuronModule) if not a.startswith("_")}
    public |= {a for a in vars(flexdsl.load("lif")) if not a.startswith("_")}
    assert public <= MODULE_ATTRIBUTES, sorted(public - MODULE_ATTRIBUTES)
    with pytest.raises(flexdsl.FlexDSLError, match="neuron_text"):
        flexdsl.loads("neuron A:\n    input x\n    param neuron_text = 0.5 learnable\n    state v = 0.0\n"
                      "    update:\n        v = v + x*neuron_text\n")


@pytest.mark.parametrize("name", ["backend", "state_seqs", "step_mode", "training", "forward", "to", "check_finite",
                                  "store_state_seqs", "register_buffer", "T_destination"])
def test_module_attribute_names_are_refused_at_load_whatever_the_list_holds(name, monkeypatch):
    """The checker's list of taken names is documentation; the module itself refuses a param or a
    state that a class attribute or an attribute it sets would shadow (a new torch or SpikingJelly
    version adds names): with the list emptied, each is still a located error at the declaration
    naming the clash, before anything is set (a learnable param, a float param, a state)."""
    import flexdsl.frontend.check as check

    monkeypatch.setattr(check, "MODULE_ATTRIBUTES", frozenset())
    for decl in (f"param {name} = 0.5 learnable", f"param {name} = 0.5", f"state {name} = 0.5"):
        text = f"neuron A{abs(hash(decl))}:\n    input x\n    {decl}\n    state w = 0.0\n    update:\n" \
               f"        w = w + x*{name}\n"
        with pytest.raises(flexdsl.FlexDSLError, match=f"`{name}` cannot name a (param|state): the loaded torch "
                                                       f"module has an attribute `{name}`") as e:
            flexdsl.loads(text, backend="torch")
        assert (e.value.line, e.value.column) == (3, len(decl.split()[0]) + 6)


def test_the_module_sets_no_attribute_the_name_check_does_not_know():
    """`SET_IN_INIT` (what the module sets on itself besides torch's attributes, refused as names
    before it sets them) is complete: a loaded module, a trained one and one after a call have no
    other public instance attribute."""
    from torch import nn

    from flexdsl.runtime.module import SET_IN_INIT

    torch_own = {a for a in vars(nn.Module()) if not a.startswith("_")}
    for m in (flexdsl.load("lif"), flexdsl.load("plif", store_state_seqs=True, check_finite=True)):
        m(torch.rand(3, 2, 4, requires_grad=True)).sum().backward()
        m.reset()
        assert {a for a in vars(m) if not a.startswith("_")} <= SET_IN_INIT | torch_own


@pytest.mark.parametrize("decl", ["param v_seq = 0.5", "state v_seq = 0.0", "param v_seq = 0.5 learnable"])
def test_a_name_that_is_a_state_sequence_is_refused(decl):
    """`m.v_seq` is the sequence of state `v` over a call (SpikingJelly's `store_v_seq`): a param or
    state of that name would hide it (or be hidden), so it is a located error at its declaration."""
    text = f"neuron A:\n    input x\n    state v = 0.0\n    {decl}\n    update:\n        v = v + x*v_seq\n"
    with pytest.raises(flexdsl.FlexDSLError, match="sequence of state `v`") as e:
        flexdsl.loads(text, store_state_seqs=True)
    assert (e.value.line, e.value.column) == (4, len(decl.split()[0]) + 6)


# ------------------------------------------------------------------ the cache
def _entry(tmp_path: Path) -> Path:
    files = list((tmp_path / "v1").glob("*.json"))
    assert len(files) == 1
    return files[0]


def _fresh(monkeypatch, tmp_path):
    monkeypatch.setenv("FLEXDSL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cache, "_memory", {})


def _unique_model(tag: str) -> str:
    return LIF.replace("neuron LIF:", f"neuron LIF{tag}:")


def test_tampered_cache_entry_is_rejected_and_regenerated(tmp_path, monkeypatch):
    _fresh(monkeypatch, tmp_path)
    sentinel = tmp_path / "SENTINEL"
    text = _unique_model("Tampered")
    compile_text(text).artefact("torch")
    p = _entry(tmp_path)
    doc = json.loads(p.read_text())
    doc["payload"]["source"] += f"\n{_sentinel_code(sentinel)}\n"  # code added, hash left as it was
    p.write_text(json.dumps(doc))
    monkeypatch.setattr(cache, "_memory", {})
    art = cache.read(p.stem)
    assert art is None and not p.exists()  # rejected and deleted
    from flexdsl.runtime.compiler import Compiled

    c = Compiled(text, "<string>", False)
    m = flexdsl.NeuronModule(c, backend="torch")
    assert torch.equal(m(torch.ones(3, 2) * 2), flexdsl.load("lif", backend="torch")(torch.ones(3, 2) * 2))
    assert not sentinel.exists()
    assert p.exists()  # regenerated


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty", "wrong_key", "deep", "not_a_dict"])
def test_damaged_cache_entries(tmp_path, monkeypatch, damage):
    _fresh(monkeypatch, tmp_path)
    text = _unique_model("Damaged" + damage.capitalize().replace("_", ""))
    c = compile_text(text)
    src = c.artefact("triton").source
    p = _entry(tmp_path)
    raw = p.read_text()
    if damage == "truncate":
        p.write_text(raw[: len(raw) // 2])
    elif damage == "garbage":
        p.write_bytes(b"\xff\xfe\x00 not json")
    elif damage == "empty":
        p.write_text("")
    elif damage == "deep":  # the JSON reader recurses: RecursionError, not ValueError
        p.write_text("[" * 100000 + "]" * 100000)
    elif damage == "not_a_dict":
        p.write_text('{"payload": [1, 2], "format": 1}')
    else:
        p.rename(p.with_name("0" * 32 + ".json"))  # a valid entry under another key
        p = p.with_name("0" * 32 + ".json")
    monkeypatch.setattr(cache, "_memory", {})
    assert cache.read(p.stem) is None
    from flexdsl.runtime.compiler import Compiled

    c2 = Compiled(text, "<string>", False)
    assert c2.artefact("triton").source == src
    m = flexdsl.NeuronModule(c2, backend="triton")
    ref = flexdsl.load("lif", backend="torch")
    x = torch.rand(5, 7) * 2
    assert torch.equal(m(x), ref(x))


def test_untrusted_or_unusable_cache_falls_back_to_memory(tmp_path, monkeypatch):
    # a folder others can write to is refused
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    _fresh(monkeypatch, shared)
    monkeypatch.setattr(cache, "_warned", set())
    with pytest.warns(UserWarning, match="writable by other users"):
        m = flexdsl.loads(_unique_model("Shared"), backend="triton")
    assert m(torch.ones(2, 3) * 2).sum() > 0
    assert not list(shared.rglob("*.json"))
    # FLEXDSL_CACHE_DIR pointing at a file
    f = tmp_path / "a_file"
    f.write_text("x")
    _fresh(monkeypatch, f)
    monkeypatch.setattr(cache, "_warned", set())
    with pytest.warns(UserWarning, match="cache folder"):
        m = flexdsl.loads(_unique_model("File"), backend="triton")
    assert m(torch.ones(2, 3) * 2).sum() > 0


def test_no_unpickling_anywhere():
    src = "\n".join(p.read_text() for p in (ROOT / "flexdsl").rglob("*.py"))
    for bad in ("pickle.load", "pickle.loads", "marshal.load", "cache=True", "shelve"):
        assert bad not in src, bad


def test_generated_modules_are_importable_by_name(tmp_path, monkeypatch):
    """A new process imports a generated module by its name from the verified cache."""
    _fresh(monkeypatch, tmp_path)
    name = compile_text(_unique_model("Importable")).torch_module.__name__
    assert name.startswith("flexdsl._generated.torch_")
    env = {**os.environ, "FLEXDSL_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    second = subprocess.run([sys.executable, "-c", f"import importlib; m = importlib.import_module({name!r}); "
                             "print(callable(m.core))"], capture_output=True, text=True, env=env)
    assert second.stdout.strip() == "True", second.stderr


# ------------------------------------------------------------------ threads
def test_parse_and_compile_are_thread_safe():
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            for i in range(300):
                text = f"neuron T{k}x{i}:\n    input x\n    param tau = {2 + i / 1000}\n    state v = 0.0\n" \
                       f"    update:\n        v = v + (x - v) / tau\n    spike when v >= 1\n"
                c = compile_model(text)
                assert c.name == f"T{k}x{i}" and [p.name for p in c.checked.params] == ["tau"]
        except BaseException as e:  # noqa: BLE001 - collected and reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]


def test_runtime_warnings_do_not_hide_errors():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        flexdsl.load("lif")(torch.rand(2, 2))
