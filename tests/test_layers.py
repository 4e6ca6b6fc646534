"""The package's layers, checked statically (``ast``, nothing imported):
no import cycle between quantcore modules and no import from a lower layer
to a higher one (docs/ARCHITECTURE.md, "Layers").  Imports inside functions
(lazy imports) count too, unless ``ALLOWED`` names them with a reason.

The layers, bottom up::

    0 kernels   quantcore._cpu.*, quantcore_gpu.*, _arrays, _warn, _switches, _files,
                _signals, _locks
    1 core      ops, qparams, torch_numerics
    2 stateful  observers, fake_quantize, calib, formats, state, checkpoints, gguf
    3 compat    compat.*, the interop wrappers (quantcore.torch, .jax, .dask)
    4 api       quantcore (the package's __init__: the public names)
    5 app       cli*, compare, demo, onnx and engines (the packages), __main__

An import may go down or stay in its layer (without closing a cycle).
"""
import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("quantcore", "quantcore_gpu")

#: (module prefix, layer); the longest matching prefix wins
LAYERS = (
    ("quantcore_gpu", 0), ("quantcore._cpu", 0), ("quantcore._arrays", 0),
    ("quantcore._warn", 0), ("quantcore._switches", 0), ("quantcore._files", 0),
    ("quantcore._signals", 0), ("quantcore._locks", 0),
    ("quantcore.ops", 1), ("quantcore.qparams", 1), ("quantcore.torch_numerics", 1),
    ("quantcore.observers", 2), ("quantcore.fake_quantize", 2), ("quantcore.calib", 2),
    ("quantcore.formats", 2), ("quantcore.mx", 2), ("quantcore.formats_observers", 2),
    ("quantcore.state", 2), ("quantcore.checkpoints", 2), ("quantcore.gguf", 2),
    ("quantcore.compat", 3), ("quantcore.torch", 3), ("quantcore.jax", 3),
    ("quantcore.dask", 3),
    ("quantcore", 4),
    ("quantcore.cli", 5), ("quantcore.cli_files", 5), ("quantcore.cli_onnx", 5),
    ("quantcore.cli_plot", 5), ("quantcore.cli_quantize", 5), ("quantcore.cli_calibrate", 5),
    ("quantcore.cli_common", 5), ("quantcore.cli_compare", 5), ("quantcore.compare", 5),
    ("quantcore.demo", 5), ("quantcore.onnx", 5), ("quantcore.__main__", 5),
    ("quantcore.engines", 5),
)
LAYER_NAMES = ("kernels", "core", "stateful", "compat", "api", "app")

#: (importer, imported) edges allowed although they go up or close a cycle,
#: each with its reason.  Keep this short: an entry is a design debt.
ALLOWED = {
}


def _modules():
    """{module name: path} of every .py file of the packages."""
    mods = {}
    for pkg in PACKAGES:
        for dirpath, _, files in os.walk(os.path.join(ROOT, pkg)):
            for f in files:
                if not f.endswith((".py", ".pyx")):  # (.pyx: an extension, a leaf)
                    continue
                rel = os.path.relpath(os.path.join(dirpath, f), ROOT).split(os.sep)
                rel[-1] = rel[-1].rpartition(".")[0]
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                mods[".".join(rel)] = os.path.join(dirpath, f)
    return mods


MODULES = _modules()


def _resolve(name):
    """The module ``name`` refers to: itself, or the package above it when
    ``name`` is an attribute (``from .ops import _ew`` -> quantcore.ops)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(mod, path):
    """{imported quantcore module: first line} of one module (top level and
    lazy imports alike)."""
    if path.endswith(".pyx"):
        return {}
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    is_pkg = os.path.basename(path) == "__init__.py"
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    found = {}

    def add(target, line):
        target = _resolve(target)
        if target is not None and target != mod:
            found.setdefault(target, line)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                add(a.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parent = base[:len(base) - node.level + 1]
                src = ".".join(parent + ([node.module] if node.module else []))
            else:
                src = node.module or ""
            if src.split(".")[0] not in PACKAGES:
                continue
            for a in node.names:  # ``from . import ops`` names a module
                full = f"{src}.{a.name}"
                add(full if full in MODULES else src, node.lineno)
    return found


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def layer_of(mod):
    best = None
    for prefix, layer in LAYERS:
        if mod == prefix or mod.startswith(prefix + "."):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, layer)
    return None if best is None else best[1]


def test_every_module_has_a_layer():
    assert [m for m in MODULES if layer_of(m) is None] == []


def test_allow_list_entries_are_live():
    """An allowed edge that no longer exists is dropped from ALLOWED."""
    stale = [e for e in ALLOWED if e[1] not in GRAPH.get(e[0], {})]
    assert stale == []


def test_no_upward_import():
    bad = []
    for mod, deps in GRAPH.items():
        for dep, line in deps.items():
            lo, hi = layer_of(mod), layer_of(dep)
            if hi > lo and (mod, dep) not in ALLOWED:
                bad.append(f"{MODULES[mod]}:{line}: {mod} ({LAYER_NAMES[lo]}) imports "
                           f"{dep} ({LAYER_NAMES[hi]})")
    assert bad == []


def _cycles():
    """The strongly connected components of more than one module
    (Tarjan), over the edges not allowed."""
    index, low, stack, on, comps = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if (v, w) in ALLOWED:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))
    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return comps


def test_no_import_cycle():
    assert _cycles() == []


@pytest.mark.parametrize("src, want", [
    ("import quantcore.ops\n", {"quantcore.ops"}),
    ("from .ops import _ew\n", {"quantcore.ops"}),
    ("def f():\n    from . import calib\n", {"quantcore.calib"}),
    ("from .compat import torch as T\n", {"quantcore.compat.torch"}),
])
def test_the_scanner_sees_imports(tmp_path, src, want):
    """The scanner finds top-level, relative, lazy and submodule imports (a
    checker that saw none would pass everything)."""
    p = tmp_path / "mod.py"
    p.write_text(src)
    assert set(_imports("quantcore.fake_module", str(p))) == want
