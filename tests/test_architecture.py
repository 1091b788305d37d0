"""The package's shape, computed from its source with `ast` (imports inside functions and under
`TYPE_CHECKING` count): the layers frontend < ir < store < backends < runtime < interop/docs < cli
import only downward, no import cycles (the store's generated-module finder pair excepted), no
function over 80 lines, no module over 600 lines.

    python tests/test_architecture.py        # the numbers: layers, cycles, largest functions and modules
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "flexdsl"

# the layers, lowest first; a module's layer is the first prefix of its dotted name listed here
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("frontend", ("flexdsl.errors", "flexdsl._paths", "flexdsl._version", "flexdsl.library", "flexdsl.settings", "flexdsl._sympy",
                  "flexdsl.frontend")),
    ("ir", ("flexdsl.ir",)),
    ("store", ("flexdsl.store", "flexdsl._generated")),
    ("backends", ("flexdsl.backends",)),
    ("runtime", ("flexdsl.runtime", "flexdsl.api")),
    ("interop/docs", ("flexdsl.nir", "flexdsl.docs")),
    ("cli", ("flexdsl.cli", "flexdsl.cli_files", "flexdsl.__main__", "flexdsl")),
]
# the one cycle allowed: the generated modules' package installs the store's import finder,
# and the store's loader imports that package
ALLOWED_CYCLES = [{"flexdsl._generated", "flexdsl.store.generated"}]
MAX_FUNCTION = 80
MAX_MODULE = 600


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PKG.rglob("*.py")) if "__pycache__" not in p.parts}


def layer_of(name: str) -> int:
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if name == p or name.startswith(p + "."):
                if p == "flexdsl" and name != "flexdsl":
                    continue
                return i
    raise AssertionError(f"{name} is in no layer: add it to LAYERS")


def _resolve(mod: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(known: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the flexdsl modules it imports (anywhere in its source)."""
    graph: dict[str, set[str]] = {}
    for mod, path in known.items():
        is_pkg = path.name == "__init__.py"
        out: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(mod, is_pkg, node)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            for t in targets:
                while t and t not in known:  # `import flexdsl.x.y` of a name inside a module
                    t = t.rpartition(".")[0]
                if t and t != mod:
                    out.add(t)
        graph[mod] = out
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    out: list[set[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(comp)
    return out


def functions(path: Path) -> list[tuple[str, int]]:
    """(qualified name, lines) of every function and method."""
    out: list[tuple[str, int]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                out.append((f"{prefix}{child.name}", child.end_lineno - first + 1))  # type: ignore[operator]
                walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            else:
                walk(child, prefix)

    walk(ast.parse(path.read_text(encoding="utf-8")), "")
    return out


def upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((a, b) for a, deps in graph.items() for b in deps if layer_of(b) > layer_of(a))


def long_functions(known: dict[str, Path]) -> list[tuple[str, int]]:
    return sorted(((f"{m}:{f}", n) for m, p in known.items() for f, n in functions(p) if n > MAX_FUNCTION),
                  key=lambda x: -x[1])


def long_modules(known: dict[str, Path]) -> list[tuple[str, int]]:
    sizes = {m: len(p.read_text(encoding="utf-8").splitlines()) for m, p in known.items()}
    return sorted(((m, n) for m, n in sizes.items() if n > MAX_MODULE), key=lambda x: -x[1])


# ---------------------------------------------------------------------------------------------- the tests
def test_every_module_has_a_layer():
    for m in modules():
        layer_of(m)


def test_no_import_cycles():
    found = [c for c in cycles(imports(modules())) if c not in ALLOWED_CYCLES]
    assert not found, f"import cycles: {found}"


def test_imports_run_downward_only():
    bad = upward(imports(modules()))
    assert not bad, "imports from a lower layer to a higher one:\n" + "\n".join(
        f"  {a} ({LAYERS[layer_of(a)][0]}) -> {b} ({LAYERS[layer_of(b)][0]})" for a, b in bad)


def test_no_function_over_80_lines():
    bad = list(long_functions(modules()))
    assert not bad, f"functions over {MAX_FUNCTION} lines: {bad}"


def test_no_module_over_600_lines():
    bad = long_modules(modules())
    assert not bad, f"modules over {MAX_MODULE} lines: {bad}"


def test_generated_triton_kernels_import_no_frontend():
    """The Triton kernels' module imports triton and the standard library only."""
    template = PKG / "backends" / "triton" / "templates" / "kernels.py.j2"
    assert "flexdsl" not in "".join(ln for ln in template.read_text().splitlines(True) if "import" in ln)


def test_the_checker_sees_the_graph():
    """The analysis itself: a lazy import inside a function and a TYPE_CHECKING import count."""
    graph = imports(modules())
    assert "flexdsl.runtime.compiler" in graph["flexdsl.api"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


# ---------------------------------------------------------------------------------- the host evaluator
RESONATE = """neuron Resonator:
    input I
    param dt = 0.1
    param b = -0.2 learnable
    param omega = 3.0
    state x = 0
    state y = 0
    equations method exact:
        dx/dt = b * x - omega * y + I
        dy/dt = omega * x + b * y
    output y
"""


def test_derived_params_are_the_matrix_exponential_with_gradients():
    """The host program's derived params (coupled exact states) against scipy's expm, and their
    gradient to a learnable param against a central difference, in float64."""
    import numpy as np
    import scipy.linalg
    import torch

    import flexdsl
    from flexdsl.ir.host import derived_values

    c = flexdsl.compile(RESONATE)
    dt, b, om = 0.1, -0.2, 3.0
    big = np.zeros((3, 3))
    big[:2, :2] = np.array([[b, -om], [om, b]]) * dt
    big[0, 2] = dt
    want = scipy.linalg.expm(big)
    names = c.derived_names
    vals = dict(zip(names, c.with_derived([dt, b, om])[3:]))
    assert vals["E_x_x"] == pytest.approx(want[0, 0], rel=1e-13) and vals["E_y_x"] == pytest.approx(want[1, 0], rel=1e-13)
    assert vals["F_x_x"] == pytest.approx(want[0, 2], rel=1e-13) and vals["F_y_x"] == pytest.approx(want[1, 2], rel=1e-13)
    bt = torch.tensor(b, dtype=torch.float64, requires_grad=True)
    e_xx = derived_values(c.host, [dt, bt, om])[names.index("E_x_x")]
    (g,) = torch.autograd.grad(e_xx.sum(), bt)
    h = 1e-6
    fd = (dict(zip(names, c.with_derived([dt, b + h, om])[3:]))["E_x_x"]
          - dict(zip(names, c.with_derived([dt, b - h, om])[3:]))["E_x_x"]) / (2 * h)
    assert float(g) == pytest.approx(fd, rel=1e-7)


def test_the_host_program_is_data_and_loads_without_sympy(tmp_path):
    """A second process loads a model with derived params from the disk cache (its host program
    is JSON in the store) and runs it without importing sympy, with the first process's result."""
    import json
    import os
    import subprocess

    code = ("import sys, json, torch, flexdsl; m = flexdsl.load(sys.argv[1], backend='torch'); "
            "x = torch.linspace(0, 2, 30, dtype=torch.float64).reshape(10, 3); y = m(x); "
            "print(json.dumps(['sympy' in sys.modules, y.tolist()]))")
    env = {**os.environ, "FLEXDSL_CACHE_DIR": str(tmp_path / "cache")}
    runs = [subprocess.run([sys.executable, "-c", code, RESONATE], capture_output=True, text=True, env=env,
                           cwd=PKG.parent) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr + runs[1].stderr
    (used1, y1), (used2, y2) = (json.loads(r.stdout.strip().splitlines()[-1]) for r in runs)
    assert used1 is True and used2 is False and y1 == y2


def test_the_runtime_shows_models_through_the_registry_the_docs_fill():
    """Notebook display: a compiled model and a loaded module render as HTML and LaTeX with
    nothing imported by hand, and the runtime itself never imports the docs."""
    import subprocess

    code = ("import flexdsl; m = flexdsl.load('lif', tau=3.0); "
            "h = m._repr_html_(); l = m.compiled._repr_latex_(); "
            "assert h.startswith('<div class=\"flexdsl-doc\">') and 'current value' in h, h[:80]; "
            "assert l.startswith('$$\\\\begin{aligned}'), l[:40]; print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PKG.parent)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
    graph = imports(modules())
    assert not any(d.startswith("flexdsl.docs") for m in graph if m.startswith("flexdsl.runtime") for d in graph[m])


def _report() -> None:
    known = modules()
    graph = imports(known)
    print(f"{len(known)} modules, {sum(len(v) for v in graph.values())} imports between them")
    for i, (name, _) in enumerate(LAYERS):
        ms = [m for m in known if layer_of(m) == i]
        lines = sum(len(known[m].read_text().splitlines()) for m in ms)
        print(f"  {name:13s} {len(ms):3d} modules {lines:6d} lines")
    print("cycles:", cycles(graph))
    print("upward:", upward(graph))
    funcs = sorted(((f"{m}:{f}", n) for m, p in known.items() for f, n in functions(p)), key=lambda x: -x[1])
    print("largest functions:", funcs[:5])
    sizes = sorted(((m, len(p.read_text().splitlines())) for m, p in known.items()), key=lambda x: -x[1])
    print("largest modules:", sizes[:5])


if __name__ == "__main__":
    _report()
    sys.exit(0)


def test_no_module_outside_backends_imports_a_backends_package():
    """A backend is the only owner of its knowledge: the runtime, the CLI and the docs ask the
    registry (`backends.get(name)`), never import `flexdsl.backends.<name>` (issue 31)."""
    packages = {p.name for p in (PKG / "backends").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    found = []
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG)
        if rel.parts[0] == "backends":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                parts = node.module.split(".")
                names = [a.name for a in node.names]
                if "backends" in parts:
                    after = parts[parts.index("backends") + 1:]
                    if (after and after[0] in packages) or (not after and set(names) & packages):
                        found.append(f"{rel}:{node.lineno}")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    p = a.name.split(".")
                    if "backends" in p and p[p.index("backends") + 1:][:1] and p[p.index("backends") + 1] in packages:
                        found.append(f"{rel}:{node.lineno}")
    assert packages >= {"torch", "triton", "cpu"}
    assert not found, found


def _builtin_backend_names() -> list[str]:
    """The keys of the built-in registry (`_FACTORIES` in flexdsl/backends/__init__.py, read as
    source: a test's registered backend is not one)."""
    tree = ast.parse((PKG / "backends" / "__init__.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "_FACTORIES":
            return [k.value for k in node.value.keys]  # type: ignore[union-attr]
    raise AssertionError("no _FACTORIES in flexdsl/backends/__init__.py")


_DEVICE_WORDS = ("device", "device_type")


def _device_or_module(node: ast.Constant, parents: dict[int, ast.AST]) -> bool:
    """Whether a string is a torch device type or a module name here, not a backend's name: compared
    with a `.type` (`x.device.type == "cpu"`, also inside a tuple), a `device=` keyword, the value
    of a variable named `device...` (an `if`-expression's branch too), or the name in
    `sys.modules.get(...)` / `import_module(...)`."""
    up = parents.get(id(node))
    while isinstance(up, (ast.Tuple, ast.List, ast.Set, ast.IfExp)):
        up = parents.get(id(up))
    if isinstance(up, ast.Compare):
        return any(isinstance(s, ast.Attribute) and s.attr == "type" for s in [up.left, *up.comparators])
    if isinstance(up, ast.keyword):
        return up.arg in _DEVICE_WORDS
    if isinstance(up, ast.Assign):
        return all(isinstance(t, ast.Name) and t.id.startswith("device") for t in up.targets)
    if isinstance(up, ast.Call):
        f = up.func
        return (isinstance(f, ast.Attribute) and f.attr in ("get", "device") and ast.unparse(f.value) in
                ("sys.modules", "torch")) or ast.unparse(f).endswith("import_module")
    return False


def backend_names_outside_backends() -> list[str]:
    """Where code outside flexdsl/backends/ names a built-in backend (issue 31: each backend the
    only owner of its knowledge; the rest asks the registry, `backends.REFERENCE`, capabilities).

    The rule, computed with `ast` (comments and docstrings are prose, not code):
    - an identifier (a name, attribute, function, class, argument or keyword) with a backend's name
      as one of its `_`-separated words (`triton_available`, `torch_source`), except `torch` itself
      (the library the backend is named after) and attributes torch's tensors have (`x.cpu()`,
      `is_cpu`: torch's API, not a backend);
    - a string equal to a backend's name, except a torch device type ("cpu" compared with
      `x.device.type`, a `device=` keyword, a `device...` variable) or a module name
      (`sys.modules.get("torch")`), see `_device_or_module`;
    - a string naming a backend inside a text: quoted (`'triton'`, "`cpu`"), as a flag (`--triton`)
      or as an option value (`backend=triton`).
    """
    import torch

    names = _builtin_backend_names()
    quoted = [re.compile(rf"(['\"`]{n}['\"`]|--{n}\b|backend\s*=\s*['\"]?{n}\b)") for n in names]
    found = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        if rel.parts[0] in ("backends", "_generated"):
            continue
        tree = ast.parse(path.read_text())
        parents = {id(c): p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
        docs = {id(n.body[0].value) for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body
                and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for n in ast.walk(tree):
            ident = {ast.Name: "id", ast.Attribute: "attr", ast.FunctionDef: "name", ast.ClassDef: "name",
                     ast.arg: "arg", ast.keyword: "arg"}.get(type(n))
            s = getattr(n, ident, None) if ident else None
            if isinstance(s, str) and s != "torch" and set(s.lower().split("_")) & set(names):
                if not (isinstance(n, ast.Attribute) and hasattr(torch.Tensor, s)):
                    found.append(f"{rel}:{n.lineno}: identifier {s}")
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
                if n.value in names and not _device_or_module(n, parents):
                    found.append(f"{rel}:{n.lineno}: string {n.value!r}")
                elif any(q.search(n.value) for q in quoted):
                    found.append(f"{rel}:{n.lineno}: text {n.value[:60]!r}")
    return found


def test_no_backend_name_outside_backends():
    assert set(_builtin_backend_names()) >= {"torch", "triton", "cpu"}
    found = backend_names_outside_backends()
    assert not found, "\n".join(found)


# what defines a torch.library op (or launches a kernel from one): names, as a call or an attribute
LIBRARY_NAMES = {"custom_op", "triton_op", "register_fake", "register_autograd", "register_kernel", "impl_abstract",
                 "Library", "wrap_triton", "infer_schema"}


def library_uses(tree: ast.AST) -> list[int]:
    """The lines of `torch.library` calls in a module: `torch.library.*`, an import from it, a name
    of `LIBRARY_NAMES`, or `.define(`/`.impl(` on a library (a receiver named `lib...`)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "library" and isinstance(node.value, ast.Name) \
                and node.value.id == "torch":
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module and (
                node.module.startswith(("torch.library", "torch._library"))
                or (node.module == "torch" and any(a.name in ("library", "_library") for a in node.names))):
            lines.append(node.lineno)
        elif isinstance(node, ast.Import) and any(a.name.startswith(("torch.library", "torch._library"))
                                                  for a in node.names):
            lines.append(node.lineno)
        elif (isinstance(node, ast.Attribute) and node.attr in LIBRARY_NAMES) or \
                (isinstance(node, ast.Name) and node.id in LIBRARY_NAMES):
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("define", "impl") and "lib" in ast.unparse(node.func.value).lower():
            lines.append(node.lineno)
    return lines


def test_torch_library_ops_are_defined_in_one_module():
    """Every torch.library op (custom_op, Library fragments, triton_op, fakes, autograd, wrap_triton)
    is built by `backends/ops.py`; the other modules describe their ops and call it (issue 31)."""
    home = PKG / "backends" / "ops.py"
    found = {str(p.relative_to(PKG)): lines for p in sorted(PKG.rglob("*.py")) if p != home
             for lines in [library_uses(ast.parse(p.read_text(encoding="utf-8")))] if lines}
    assert not found, f"torch.library outside backends/ops.py (module: lines): {found}"
    assert library_uses(ast.parse(home.read_text(encoding="utf-8")))  # (the scan sees them where they are)
