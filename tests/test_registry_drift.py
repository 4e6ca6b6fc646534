"""Hand-written copies of the registries against the registries themselves.

Each registry is declared once (the rounding modes in qc_elementwise.h's
QC_ROUNDING_MODES, the minifloat formats in formats/_common.py's
MINIFLOATS, the observers in ObserverBase.REGISTRY, the public names in
``quantcore.__all__``); where a copy cannot be derived from it (a docstring's
list of choices, a header's list of the modes with their own CPU loop, the
documentation) a test here fails when the copy drifts.  Each test was
checked by hand to fail with a fake member added to its table.
"""
import pathlib
import re

import numpy as np
import pytest

import quantcore as qc
from quantcore import engines, ops
from quantcore.formats import _common as FC
from quantcore.formats import mx
from quantcore.observers import ObserverBase

ROOT = pathlib.Path(__file__).resolve().parent.parent
PKG = ROOT / "quantcore"

#: a numpydoc ``name : {"a", "b"}`` line of choices
_CHOICES = re.compile(r'^\s*(\w+) : \{([^}]*)\}', re.M)

#: (file under quantcore/ or None for every file, parameter) -> its table
DOC_TABLES = {
    (None, "rounding"): lambda: ops.ROUNDING,
    ("formats/fp8.py", "fmt"): lambda: FC.FP8_FORMATS,
    ("formats/observers.py", "fmt"): lambda: FC.FP8_FORMATS,
    ("formats/mx.py", "elem"): lambda: mx.MX_ELEMENTS,
    ("formats/mx.py", "elem_rounding"): lambda: mx._ROUNDINGS,
    ("engines/__init__.py", "fmt"): lambda: engines.ENGINE_FORMATS,
}


def docstring_choice_lists():
    """[(file, parameter, [the names listed], open-ended)] of every choice
    list of a parameter DOC_TABLES knows, in quantcore's sources."""
    found = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        for m in _CHOICES.finditer(path.read_text()):
            if (rel, m.group(1)) not in DOC_TABLES and (None, m.group(1)) not in DOC_TABLES:
                continue
            items = [t.strip() for t in m.group(2).split(",")]
            names = [t.strip("\"'") for t in items if t != "..."]
            found.append((rel, m.group(1), names, "..." in items))
    return found


def test_docstring_choice_lists_are_their_tables():
    """Every ``rounding : {...}``, ``fmt : {...}`` ... line names exactly
    its table's members (a prefix of them where it ends with ``...``)."""
    seen = set()
    for rel, param, names, open_ended in docstring_choice_lists():
        key = (rel, param) if (rel, param) in DOC_TABLES else (None, param)
        seen.add(key)
        table = list(DOC_TABLES[key]())
        if open_ended:
            assert names == table[:len(names)], f"quantcore/{rel}: {param} lists {names}"
        else:
            assert sorted(names) == sorted(table), \
                f"quantcore/{rel}: {param} lists {names}, its table has {table}"
    assert seen == set(DOC_TABLES)  # (every table's docstring list was found)


def test_onnx_output_types_docstring_is_the_type_tables():
    """quantize_linear's ``output`` list: the integer types, the FP8 and
    FP4 types of the format table (ONNX_FP8_FORMATS, ONNX_FP4_FORMATS)."""
    text = (PKG / "formats" / "onnx_qdq.py").read_text()
    para = text.split("    output : str, optional\n", 1)[1].split("Default", 1)[0]
    listed = re.findall(r"\b(u?int\d+|float\d_\w+)\b", para)
    want = list(FC.INT_TYPES) + ["float8_" + n for n in FC.ONNX_FP8_FORMATS] + \
        ["float4_" + n for n in FC.ONNX_FP4_FORMATS]
    assert sorted(listed) == sorted(want)


def _fp8_casts():
    text = (PKG / "include" / "qc_format_families.h").read_text()
    m = re.search(r"#define QC_FP8_CASTS ([0-9, ]+)\n", text)
    return [int(v) for v in m.group(1).split(",")]


def test_fp8_casts_are_every_cast_format_under_every_policy():
    """qc_format_families.h's QC_FP8_CASTS (the cast modes with their own
    CPU loop) is each cast format under each overflow policy, and each
    NaN-encoded format with the ml_dtypes NaN too: a format added to
    MINIFLOATS without its modes there would run the generic loop."""
    want = {fid | ovf for fid in FC.FP8_FORMATS.values() for ovf in FC.OVERFLOW.values()}
    want |= {FC.FP8_FORMATS[name] | ovf | FC.NAN_ENCODING["ml_dtypes"]
             for name in FC.NAN_ENCODED_FORMATS for ovf in FC.OVERFLOW.values()}
    casts = _fp8_casts()
    assert len(casts) == len(set(casts))
    assert sorted(casts) == sorted(want)


def test_nan_encoded_formats_are_those_with_infinities():
    """The NaN encoding option matters for a format with several NaN codes:
    the IEEE-like ones, with infinities (ml_dtypes' own dtypes say which)."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    with np.errstate(all="ignore"):
        ieee = {name for name in FC.FP8_FORMATS
                if np.isinf(np.array(np.inf).astype(getattr(ml_dtypes, "float8_" + name)))}
    assert ieee == set(FC.NAN_ENCODED_FORMATS)


def test_nan_encoding_changes_exactly_the_nan_encoded_formats():
    x = np.array([np.nan, -np.nan, 1.0], np.float32)
    for name in FC.FP8_FORMATS:
        a = qc.cast_fp8(x, name, nan="sign")
        b = qc.cast_fp8(x, name, nan="ml_dtypes")
        assert (name in FC.NAN_ENCODED_FORMATS) == (not np.array_equal(a.view(np.uint8),
                                                                       b.view(np.uint8))), name


def test_every_public_name_exists_and_is_documented():
    """Each name of ``quantcore.__all__`` exists and README.md or docs/*.md
    mentions it; each function API.md's core section requires is in it."""
    docs = (ROOT / "README.md").read_text() + "".join(
        p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
    for name in qc.__all__:
        assert hasattr(qc, name), name
        if name != "__version__":
            assert re.search(rf"(`|quantcore\.|qc\.){re.escape(name)}\b", docs), \
                f"{name} (quantcore.__all__) is in neither README.md nor docs/*.md"
    assert len(set(qc.__all__)) == len(qc.__all__)
    api = ROOT.parent / "shared" / "API.md"
    if api.exists():
        core = api.read_text().split("## Core API: `quantcore`", 1)[1].split("\n## ", 1)[0]
        required = set(re.findall(r"`(\w+)\(", core))
        # (the observers' methods it names: state_dict(), merge(other) ...)
        missing = {n for n in required if n not in qc.__all__ and
                   not all(hasattr(c, n) for c in ObserverBase.REGISTRY.values())}
        assert required and not missing, missing


def test_every_observer_is_public():
    """Every registered observer class is exported (the parity tests and
    the state files take them from the registry)."""
    assert set(ObserverBase.REGISTRY) <= set(qc.__all__)
    for name, cls in ObserverBase.REGISTRY.items():
        assert getattr(qc, name) is cls


# ------------------------------------------------ ARCHITECTURE's recipes
def _recipes():
    """{recipe title: its text} of docs/ARCHITECTURE.md's recipe section."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    section = text.split("## Recipes: where a change goes", 1)[1].split("\n## ", 1)[0]
    return {m.group(1): m.group(2) for m in
            re.finditer(r"^- \*\*(.+?)\*\*(.*?)(?=^- \*\*|\Z)", section, re.M | re.S)}


def _source_text():
    """The project's code (quantcore, quantcore_gpu, tests, setup.py) as one text."""
    exts = {".py", ".pyx", ".pxi", ".pxd", ".h", ".cpp", ".cu"}
    paths = [p for d in ("quantcore", "quantcore_gpu", "tests") for p in (ROOT / d).rglob("*")
             if p.suffix in exts and p.is_file() and "data" not in p.parts and
             p.name != pathlib.Path(__file__).name]   # (not the names this file makes up)
    return "\n".join(p.read_text(errors="replace") for p in paths + [ROOT / "setup.py"])


#: other projects' code a recipe cites (llama.cpp's converter, in the sdist
#: of llama.cpp's Python package), not this project's
EXTERNAL = {"vendor/llama.cpp/conversion/*.py", "modify_tensors"}


def _find_paths(name):
    """The files a recipe's path names (a ``<...>`` part or ``*`` matches any)."""
    pattern = re.sub(r"<[^>]*>", "*", name).rstrip("/")
    found = []
    for base in ("", "quantcore", "quantcore/include", "quantcore/_cpu", "tests", "docs"):
        found += [p for p in (ROOT / base).glob(pattern)] if "*" in pattern else \
            [ROOT / base / pattern] if (ROOT / base / pattern).exists() else []
    return found


def _resolves(dotted):
    """``a.b.c`` names a module or attribute (of quantcore, its extension or
    its observers module)."""
    import importlib
    for base in ("", "quantcore.", "quantcore._cpu.", "quantcore.observers."):
        parts = (base + dotted).split(".")
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            try:
                for attr in parts[cut:]:
                    obj = getattr(obj, attr)
                return True
            except AttributeError:
                break
    return False


def recipe_names_missing():
    """[(recipe, name)] of each backticked code name of a recipe that names
    nothing in the project: a path that does not exist, a ``file::function``
    without that function, a ``module.name`` that does not resolve, an
    identifier (``QC_*``, ``qc_*``, ``DEVICE_RULE`` ...; ``<NAME>`` is any
    word) found nowhere in the code, a private one (``_FIELDS``) in none of
    the files its recipe names."""
    code, missing = _source_text(), []
    words = set(re.findall(r"\w+", code))
    for title, text in _recipes().items():
        named = [f for raw in re.findall(r"`([^`]+)`", text) if "/" in raw or re.fullmatch(
            r"[\w/.*<>]+\.(py|h|cpp|pyx)", raw) for f in _find_paths(raw.split("::")[0])]
        for raw in re.findall(r"`([^`]+)`", text):
            name = re.sub(r"\s+", "", raw.split("(")[0]) if not raw.startswith("{") else ""
            if not name or name[0] in "\"'-" or name.endswith("=") or "{" in name or \
                    "[" in name or re.fullmatch(r"float\d_\*", name) or name in EXTERNAL:
                continue   # a string value, an option, a keyword argument, an expression
            path, _, func = name.partition("::") if "/" in name or "." in name.split("::")[0] \
                and name.split("::")[0].rsplit(".", 1)[-1] in ("py", "h", "cpp", "pyx", "md") \
                else ("", "", "")
            if path or "/" in name:
                files = _find_paths(path or name)
                ok = bool(files) and (not func or any(
                    re.search(rf"\b{re.escape(func)}\b", f.read_text()) for f in files))
            elif "::" in name:      # a C++ member: Class::member
                ok = all(w in words for w in name.split("::"))
            elif "." in name:
                ok = _resolves(name)
            elif "<" in name:       # a template: QC_ROUND_<NAME>
                word = re.compile(re.sub(r"<[^>]*>", r"\\w*", re.escape(name).replace(
                    re.escape("<"), "<").replace(re.escape(">"), ">")))
                ok = any(word.fullmatch(w) for w in words)
            elif name.startswith("_"):   # private: in a file of its recipe
                ok = any(re.search(rf"\b{name}\b", f.read_text()) for f in named
                         if f.is_file())
            else:
                ok = name in words
            if not ok:
                missing.append((title, raw))
    return missing


def test_recipes_name_only_code_that_exists():
    assert len(_recipes()) >= 8
    cited = "".join(re.sub(r"\s+", "", t) for t in _recipes().values())
    assert all(e in cited for e in EXTERNAL)   # (the list of other projects' names is live)
    assert recipe_names_missing() == []


def test_recipe_counts_are_their_numbered_places():
    """A recipe saying "(N places" numbers its places (1) .. (N)."""
    for title, text in _recipes().items():
        m = re.search(r"\((\d+) places", title + text)
        if m:
            numbered = [int(k) for k in re.findall(r"\((\d)\)", text)]
            assert numbered and max(numbered) == int(m.group(1)), (title, numbered)


def test_the_recipe_checker_sees_a_missing_name(monkeypatch):
    """(the checker is not vacuous: a recipe naming absent code fails)"""
    real = _recipes()
    fake = {**real, "Add a thing": " (1) `quantcore/no_such.py`, `ops.NO_SUCH`, `qc_no_such`, "
                                   "`tests/test_formats.py::no_such_test`, `QcNoSuch::x`"}
    monkeypatch.setitem(globals(), "_recipes", lambda: fake)
    assert [n for t, n in recipe_names_missing() if t == "Add a thing"] == [
        "quantcore/no_such.py", "ops.NO_SUCH", "qc_no_such",
        "tests/test_formats.py::no_such_test", "QcNoSuch::x"]
