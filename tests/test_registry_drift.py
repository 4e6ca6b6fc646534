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
