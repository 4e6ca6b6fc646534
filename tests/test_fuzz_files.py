"""Property-based fuzz of the file readers an attacker controls: the
safetensors reader (quantcore.checkpoints and the CLI's listing) and
``load_state``.

Properties: a file is either accepted or refused with a ValueError (the
CLI: CliError) of one line naming what is wrong -- never another
exception; an accepted safetensors file reads exactly as the reference
``safetensors`` package reads it (names, dtypes, shapes, bytes); an
accepted state file builds an object that computes finite output from
finite input whenever its scales are finite.

CI runs a few thousand cases (derandomized, well under 20 s).  The slow
run: ``QC_FUZZ_EXAMPLES=100000 python -m pytest -q tests/test_fuzz_files.py``
(10^5 cases per property, random seeds; 2 x 20,000 took 17 minutes on a
shared 2-core machine, so allow well over an hour).
"""
import json
import math
import os
import struct
import tempfile
import warnings

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import quantcore as qc  # noqa: E402
from quantcore import checkpoints as CK  # noqa: E402
from quantcore.cli_files import CliError, list_tensors  # noqa: E402

safetensors = pytest.importorskip("safetensors")

_SLOW = int(os.environ.get("QC_FUZZ_EXAMPLES", "0"))
_FUZZ = settings(max_examples=_SLOW or 1200, deadline=None, derandomize=not _SLOW,
                 suppress_health_check=list(HealthCheck), database=None)
_FUZZ_STATE = settings(_FUZZ, max_examples=_SLOW or 600)

_DTYPES = list(CK.DTYPES) + list(CK.SUBBYTE)
_ODD = [-1, -(2 ** 63), 2 ** 63, 2 ** 64, 2 ** 70, 1.0, 2.5, "8", True, None, [1], {"a": 1},
        float("inf")]

_dim = st.one_of(st.integers(0, 6), st.integers(0, 6), st.sampled_from(_ODD))
_shape = st.one_of(st.lists(st.integers(0, 5), max_size=3), st.lists(_dim, max_size=3),
                   st.sampled_from(["x", 3, None, {"a": 1}]))
_text = st.text(st.characters(codec="utf-8"), max_size=6)
_metadata = st.one_of(st.none(), st.dictionaries(_text, _text, max_size=3),
                      st.dictionaries(_text, st.sampled_from(_ODD), min_size=1, max_size=2),
                      st.sampled_from([[], "x", 1]))


@st.composite
def safetensors_files(draw):
    """Bytes of a safetensors file: mostly well-formed structure with one or
    more fields broken, sometimes corrupted at the byte level."""
    n = draw(st.integers(0, 4))
    names = draw(st.lists(st.one_of(st.sampled_from(["a", "b", "w.0"]), _text),
                          min_size=n, max_size=n))
    header, data, offset = [], b"", 0
    for name in names:
        dtype = draw(st.one_of(st.sampled_from(_DTYPES), st.sampled_from(_DTYPES),
                               st.sampled_from(["F128", "f32", "", 4, ["F32"], None])))
        shape = draw(_shape)
        try:
            nbytes = int(CK._bits(dtype) * math.prod(shape)) // 8
        except Exception:  # noqa: BLE001 - a broken dtype or shape: any byte count
            nbytes = draw(st.integers(0, 8))
        nbytes = min(max(nbytes, 0), 64)
        offsets = [offset, offset + nbytes]
        if draw(st.integers(0, 5)) == 0:  # a broken offset
            offsets = draw(st.one_of(
                st.lists(st.one_of(st.integers(-2, 80), st.sampled_from(_ODD)), max_size=3),
                st.sampled_from(["0", None, {"0": 1}])))
        entry = {"dtype": dtype, "shape": shape, "data_offsets": offsets}
        if draw(st.integers(0, 9)) == 0:
            entry.pop(draw(st.sampled_from(sorted(entry))))
        if draw(st.integers(0, 9)) == 0:
            entry["extra"] = 1
        header.append((name, entry))
        data += bytes(draw(st.binary(min_size=nbytes, max_size=nbytes)))
        offset += nbytes
    meta = draw(_metadata)
    if meta is not None or draw(st.booleans()):
        header.insert(draw(st.integers(0, len(header))), ("__metadata__", meta))
    if draw(st.booleans()):  # entries out of file order
        header = draw(st.permutations(header))
    body = "{" + ",".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in header) + "}"
    raw = body.encode("utf-8", "surrogatepass")
    raw = draw(st.sampled_from([b"", b"  "])) + raw + draw(st.sampled_from([b"", b"   ", b"\n"]))
    if draw(st.integers(0, 7)) == 0:  # a byte-level corruption of the header text
        i = draw(st.integers(0, max(len(raw) - 1, 0)))
        raw = raw[:i] + draw(st.binary(max_size=3)) + raw[i + 1:]
    length = len(raw)
    if draw(st.integers(0, 9)) == 0:
        length = draw(st.one_of(st.integers(0, len(raw) + 16),
                                st.sampled_from([2 ** 64 - 1, 2 ** 63, 100_000_001])))
    tail = data
    if draw(st.integers(0, 7)) == 0:
        tail = data[:draw(st.integers(0, len(data)))] + draw(st.binary(max_size=4))
    return struct.pack("<Q", length) + raw + tail


def _one_line_value_error(exc):
    assert isinstance(exc, ValueError), f"{type(exc).__name__}: {exc}"
    assert "\n" not in str(exc) and str(exc), repr(exc)


def _write(tmp, name, data):
    path = os.path.join(tmp, name)
    with open(path, "wb") as fh:
        fh.write(data)
    return path


@_FUZZ
@given(blob=safetensors_files())
def test_safetensors_reader_fuzz(blob):
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(tmp, "f.safetensors", blob)
        try:
            reader = CK.SafetensorsReader(path)
        except Exception as exc:  # noqa: BLE001 - the property: ValueError only
            _one_line_value_error(exc)
            with pytest.raises(CliError):
                list_tensors(path)
            return
        with reader:
            ref = {name: t for name, t in safetensors.deserialize(blob)}  # must accept too
            assert sorted(ref) == sorted(reader)
            for name, t in ref.items():
                assert reader.info(name) == (t["dtype"], tuple(t["shape"]))
                assert bytes(reader.raw(name)) == bytes(t["data"])
            listed = list_tensors(path)
            assert [e.name for e in listed] == list(reader)


# ------------------------------------------------------------- load_state
def _states():
    rng = np.random.default_rng(0)
    objs = [qc.MinMaxObserver(), qc.MovingAverageMinMaxObserver(0.1, axis=1),
            qc.FakeQuantize(qc.MinMaxObserver(), -8, 7, symmetric=True),
            qc.FakeQuantize(qc.MovingAverageMinMaxObserver(axis=0), 0, 255),
            qc.EMAMinMaxObserver(), qc.MomentumMinMaxObserver()]
    docs = []
    with tempfile.TemporaryDirectory() as tmp:
        for obj in objs:
            for seen in (False, True):
                if seen:
                    obj(rng.normal(size=(3, 4)).astype(np.float32))
                path = os.path.join(tmp, "s.json")
                qc.save_state(obj, path)
                with open(path) as fh:
                    docs.append(json.load(fh))
    return docs


_DOCS = _states()
_json_value = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2 ** 70), 2 ** 70),
              st.sampled_from([10 ** 400, -1, 0, 1, 255, -128]),
              st.floats(allow_nan=True, allow_infinity=True), _text),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(_text, inner, max_size=2)), max_leaves=4)


@st.composite
def state_documents(draw):
    doc = json.loads(json.dumps(draw(st.sampled_from(_DOCS))))
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(sorted(doc)))
        value = doc[key]
        if isinstance(value, dict) and "__ndarray__" in value and draw(st.booleans()):
            field = draw(st.sampled_from(["__ndarray__", "dtype", "shape"]))
            if field == "__ndarray__":
                value[field] = draw(st.lists(st.one_of(
                    st.floats(), st.integers(-300, 300), st.sampled_from([1e-45, 10 ** 30])),
                    max_size=4))
            elif field == "dtype":
                value[field] = draw(st.sampled_from(["<f4", "<f8", "<i8", "<f2", "|b1", "<c8",
                                                     "|O", "<U3", "zz", "<f16"]))
            else:
                value[field] = draw(st.lists(st.integers(-1, 4), max_size=2))
        elif draw(st.integers(0, 5)) == 0:
            doc.pop(key)
        else:
            doc[key] = draw(_json_value)
    return doc


@_FUZZ_STATE
@given(doc=state_documents())
def test_load_state_fuzz(doc):
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(tmp, "s.json", json.dumps(doc).encode())
        try:
            obj = qc.load_state(path)
        except Exception as exc:  # noqa: BLE001 - the property: ValueError only
            _one_line_value_error(exc)
            assert "is not a valid quantcore state file" in str(exc)
            return
    if isinstance(obj, qc.FakeQuantize) and obj.axis is None:
        x = np.linspace(-2, 2, 16, dtype=np.float32)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            obj.eval()
            y = obj(x)
        if np.all(np.isfinite(np.asarray(obj.scale))):
            assert np.all(np.isfinite(y)), (obj.scale, obj.zero_point, y)
