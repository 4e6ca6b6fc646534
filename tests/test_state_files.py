"""State files: a truncated, tampered or foreign file raises a clear
ValueError; nothing is ever unpickled."""
import json
import os
import pickle

import numpy as np
import pytest

import quantcore as qc

F32 = np.float32
INVALID = "is not a valid quantcore state file"


class _Evil:
    """Unpickling this creates a marker file: the test fails if it ever runs."""

    marker = None

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture
def saved(tmp_path):
    rng = np.random.default_rng(0)
    obs = qc.MovingAverageMinMaxObserver(0.1, axis=1)
    obs(rng.normal(size=(3, 4)).astype(F32))
    fq = qc.FakeQuantize(qc.MinMaxObserver(), -8, 7, symmetric=True)
    fq(rng.normal(size=10).astype(F32))
    paths = {}
    for name, obj in (("obs", obs), ("fq", fq)):
        for suffix in (".npz", ".json"):
            paths[name + suffix] = tmp_path / (name + suffix)
            qc.save_state(obj, paths[name + suffix])
    return paths


def _refused(path, fragment, expected=None):
    with pytest.raises(ValueError, match=INVALID) as info:
        qc.load_state(path, expected=expected)
    assert fragment in str(info.value), str(info.value)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("fraction", [0.0, 0.01, 0.3, 0.5, 0.99])
@pytest.mark.parametrize("suffix", [".npz", ".json"])
def test_truncated(saved, tmp_path, fraction, suffix):
    data = saved["fq" + suffix].read_bytes()
    bad = tmp_path / ("trunc" + suffix)
    bad.write_bytes(data[:int(len(data) * fraction)])
    with pytest.raises(ValueError, match=INVALID):
        qc.load_state(bad)


def test_flipped_byte_in_npz(saved, tmp_path):
    data = bytearray(saved["obs.npz"].read_bytes())
    data[len(data) // 3] ^= 0xFF
    bad = tmp_path / "flipped.npz"
    bad.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=INVALID):
        qc.load_state(bad)


def test_nothing_is_unpickled(tmp_path):
    marker = tmp_path / "unpickled"
    _Evil.marker = str(marker)
    inner = tmp_path / "inner.npz"  # an object array inside an otherwise valid archive
    np.savez(inner, __format__=np.array("quantcore-state-1"),
             __class__=np.array("MinMaxObserver"), min_val=np.array([_Evil()], dtype=object),
             max_val=F32(1))
    _refused(inner, "holds Python objects (never unpickled)")
    raw = tmp_path / "raw.npz"  # a bare pickle stream named .npz
    raw.write_bytes(pickle.dumps(_Evil()))
    _refused(raw, "pickled")
    npy = tmp_path / "object.npy"
    np.save(npy, np.array([_Evil()], dtype=object), allow_pickle=True)
    renamed = tmp_path / "object_npy.npz"
    os.replace(npy, renamed)
    _refused(renamed, "a single .npy array")
    assert not marker.exists()


def test_foreign_files(tmp_path):
    plain_npy = tmp_path / "plain.npz"
    with open(plain_npy, "wb") as fh:
        np.save(fh, np.ones(3))
    _refused(plain_npy, "not an .npz archive")
    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, weight=np.zeros(3))
    _refused(foreign, "__format__")
    js = tmp_path / "foreign.json"
    js.write_text('{"weight": [1, 2]}')
    _refused(js, "__format__")
    js.write_text("[1, 2]")
    _refused(js, "top level is not an object")
    js.write_bytes(b"\xff\xfe\x00binary")
    _refused(js, "utf-8")
    js.write_text("[" * 100000 + "]" * 100000)
    _refused(js, "recursion")
    with pytest.raises(FileNotFoundError):
        qc.load_state(tmp_path / "missing.npz")
    _refused(tmp_path, "directory")


def _tamper(path, out, change):
    doc = json.loads(path.read_text())
    change(doc)
    out.write_text(json.dumps(doc))
    return out


def _set(key, value):
    return lambda doc: doc.__setitem__(key, value)


def _set_array(key, field, value):
    return lambda doc: doc[key].__setitem__(field, value)


OBSERVER_TAMPERING = [
    # relabelled: a file of one class presented as another
    (_set("__class__", "EMAMinMaxObserver"), "missing keys ['decay', 'include_zero']"),
    (_set("__class__", "MinMaxObserver"), "unexpected keys ['averaging_constant']"),
    (_set("__class__", "FakeQuantize"), "missing keys"),
    (_set("__class__", "os.system"), "unknown class 'os.system'"),
    (_set("__class__", 5), "unknown class 5"),
    (lambda doc: doc.pop("__class__"), "unknown class None"),
    (_set("__format__", "quantcore-state-2"), "unknown __format__"),
    (_set("junk", 1), "unexpected keys ['junk']"),
    (lambda doc: doc.pop("num_batches"), "missing keys ['num_batches']"),
    (_set("min_val/x", 1), "inconsistent keys"),
    # wrong types
    (_set("min_val", "abc"), "'min_val' must be a numeric array"),
    (_set("min_val", [1, 2]), "'min_val' must be a numeric array"),
    (_set("min_val", {"a": 1}), "'min_val' must be a numeric array"),
    (_set_array("min_val", "dtype", "|O"), "dtype object"),
    (_set_array("min_val", "dtype", "<c8"), "dtype complex64"),
    (_set_array("min_val", "dtype", "<i4"), "'min_val': dtype int32 holds integers only"),
    (_set_array("min_val", "dtype", "zz"), "data type 'zz' not understood"),
    (_set_array("min_val", "shape", [7]), "4 values for shape [7]"),
    (_set_array("min_val", "shape", "x"), "shape must be a list of sizes"),
    (_set_array("min_val", "__ndarray__", ["a"]), "flat list of numbers"),
    (_set_array("min_val", "__ndarray__", [[1.0]]), "flat list of numbers"),
    (_set_array("min_val", "extra", 1), "an array entry holds"),
    (_set_array("min_val", "shape", [2, 2]), "rank 0 or 1"),
    (_set("num_batches", "many"), "'num_batches' must be an integer"),
    (_set("num_batches", 1.5), "'num_batches' must be an integer"),
    (_set("num_batches", True), "'num_batches' must be an integer"),
    (_set("num_batches", -5), "'num_batches' must be >= 0"),
    (_set("axis", "1"), "'axis' must be an integer"),
    (_set("axis", 10 ** 30), "'axis' must be in [-64, 64)"),
    (_set("per_channel", "no"), "'per_channel' must be true or false"),
    (_set("per_channel", False), "a per-tensor observer needs 0"),
    (_set("averaging_constant", "x"), "'averaging_constant' must be a number"),
    (_set("averaging_constant", [0.1]), "'averaging_constant' must be a number"),
    (_set("averaging_constant", 5.0), "averaging_constant must be in (0, 1]"),
    (_set("nan_policy", "eval"), "nan_policy must be"),
    (_set("nan_policy", 1), "'nan_policy' must be a string"),
]


@pytest.mark.parametrize("case", range(len(OBSERVER_TAMPERING)))
def test_tampered_observer_file(saved, tmp_path, case):
    change, fragment = OBSERVER_TAMPERING[case]
    _refused(_tamper(saved["obs.json"], tmp_path / "t.json", change), fragment)


FAKE_QUANTIZE_TAMPERING = [
    (_set("__class__", "MinMaxObserver"), "missing keys"),
    (_set("observer_class", "FakeQuantize"), "'observer_class' must name a quantcore observer"),
    (_set("observer_class", "MovingAverageMinMaxObserver"), "missing keys ['averaging_constant']"),
    (lambda doc: [doc.pop(k) for k in list(doc) if k.startswith("observer/")],
     "missing keys ['observer']"),
    (_set("quant_min", "a"), "'quant_min' must be an integer"),
    (_set("quant_min", 1.5), "'quant_min' must be an integer"),
    (_set("quant_min", 100), "quant_min must be < quant_max"),
    (_set("rounding", "up"), "rounding must be one of"),
    (_set("eps", "x"), "'eps' must be a number"),
    (_set("eps", float("nan")), "'eps' must be finite"),
    (_set("quant_delay", -1), "'quant_delay' must be >= 0"),
    (_set("step", "x"), "'step' must be an integer"),
    (_set("training", "no"), "'training' must be true or false"),
    (_set("symmetric", "false"), "'symmetric' must be true or false"),
    (_set("scale", "x"), "'scale' must be a numeric array"),
    (_set_array("scale", "__ndarray__", [-1.0]), "'scale' must be >= 0"),
    (_set_array("scale", "__ndarray__", [0.0]), "'scale' must be >= min(eps, 1)"),
    (_set_array("zero_point", "dtype", "<f4"), None),  # integral float zero points load
    (lambda doc: (doc["zero_point"].update(dtype="<f4", __ndarray__=[0.5])), "integral"),
    (lambda doc: (doc["scale"].update(__ndarray__=[0.1, 0.2], shape=[2])),
     "scale and zero_point must be non-empty 1-D arrays of one shape"),
    (_set("observer/min_val", "x"), "'observer/min_val' must be a numeric array"),
    (_set("observer/junk", 0), "unexpected keys ['junk']"),
    # values a constructor or the qparams could never produce: each would compute NaN or
    # garbage if loaded
    (_set_array("scale", "__ndarray__", [float("inf")]), "'scale' must be finite where the "
                                                         "observer saw finite data"),
    (_set_array("scale", "__ndarray__", [1e-45]), "'scale' must be >= min(eps, 1)"),
    (_set_array("zero_point", "__ndarray__", [8]), "'zero_point' must lie in [quant_min, "
                                                   "quant_max] = [-8, 7], got [8]"),
    (_set_array("zero_point", "__ndarray__", [-9]), "'zero_point' must lie in"),
    (_set("eps", -1.0), "'eps' must be >= 0"),
    (_set("eps", float("inf")), "'eps' must be finite"),
    (lambda doc: (doc["scale"].update(__ndarray__=[0.1, 0.2], shape=[2]),
                  doc["zero_point"].update(__ndarray__=[0, 0], shape=[2])),
     "scale holds 2 values, a per-tensor observer has one"),
    (lambda doc: (doc["scale"].update(__ndarray__=[], shape=[0]),
                  doc["zero_point"].update(__ndarray__=[], shape=[0])), "non-empty"),
    (_set("quant_min", 2 ** 70), "'quant_min' must be a 64-bit integer"),
    (_set("quant_max", -(10 ** 400)), "'quant_max' must be a 64-bit integer"),
    (_set("step", 2 ** 64), "'step' must be a 64-bit integer"),
    (_set_array("observer/min_val", "__ndarray__", [5.0]), "min_val must be <= max_val"),
    (_set_array("scale", "__ndarray__", [True]), "flat list of numbers"),
    (_set_array("zero_point", "__ndarray__", [10 ** 400]), "a value does not fit int64"),
    (_set_array("scale", "__ndarray__", [1e300]), "'scale': a value does not fit float32"),
]


@pytest.mark.parametrize("case", range(len(FAKE_QUANTIZE_TAMPERING)))
def test_tampered_fake_quantize_file(saved, tmp_path, case):
    change, fragment = FAKE_QUANTIZE_TAMPERING[case]
    path = _tamper(saved["fq.json"], tmp_path / "t.json", change)
    if fragment is None:
        assert isinstance(qc.load_state(path), qc.FakeQuantize)
    else:
        _refused(path, fragment)


def test_npz_with_wrong_types(tmp_path):
    head = {"__format__": np.array("quantcore-state-1"), "__class__": np.array("MinMaxObserver")}
    good = {"min_val": F32(0), "max_val": F32(1), "num_batches": np.array(1),
            "nonfinite_batches": np.array(0), "axis": np.array(-1), "per_channel": np.array(False),
            "nan_policy": np.array("skip")}
    path = tmp_path / "s.npz"
    np.savez(path, **head, **good)
    assert qc.load_state(path).max_val == 1
    for key, value, fragment in [("min_val", np.array("x"), "'min_val' must be a numeric array"),
                                 ("num_batches", np.array([1, 2]), "must be an integer"),
                                 ("per_channel", np.array(1), "must be true or false"),
                                 ("nan_policy", np.array(b"skip"), "must be a string"),
                                 ("__class__", np.array(["MinMaxObserver"]), "unknown class")]:
        np.savez(path, **{**head, **good, key: value})
        _refused(path, fragment)


def test_duplicate_keys_are_refused(saved, tmp_path):
    """A key given twice (JSON keeps the last silently; a zip archive may
    hold two members of one name) is refused, not resolved."""
    text = saved["fq.json"].read_text()
    js = tmp_path / "dup.json"
    js.write_text(text.replace('"eps":', '"eps": 0.5, "eps":', 1))
    _refused(js, "key 'eps' appears twice")
    import zipfile
    npz = tmp_path / "dup.npz"
    with zipfile.ZipFile(saved["obs.npz"]) as src, zipfile.ZipFile(npz, "w") as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
        with pytest.warns(UserWarning, match="Duplicate name"):
            dst.writestr("min_val.npy", src.read("min_val.npy"))
    _refused(npz, "'min_val' appears twice")


def test_forged_npz_member_header_allocates_nothing(saved, tmp_path):
    """An .npz member whose header declares 2**40 values (but holds a few
    bytes) is refused from its header, before any allocation; a truncated
    header is a clear ValueError."""
    import zipfile
    forgeries = {
        "huge": lambda b: b.replace(b"'shape': (4,)", b"'shape': (1099511627776,)"),
        "truncated": lambda b: b[:30],
        "unterminated": lambda b: b.replace(b"'shape': (4,), }", b"'shape': '(4,"),
    }
    for label, forge in forgeries.items():
        out = tmp_path / f"{label}.npz"
        with zipfile.ZipFile(saved["obs.npz"]) as src, zipfile.ZipFile(out, "w") as dst:
            for info in src.infolist():
                data = src.read(info)
                if info.filename == "min_val.npy":
                    assert forge(data) != data
                    data = forge(data)
                dst.writestr(info.filename, data)
        with pytest.raises(ValueError, match=INVALID) as err:
            qc.load_state(out)
        assert "min_val" in str(err.value) or "not a .npy array" in str(err.value), err.value


def test_expected_class(saved):
    assert isinstance(qc.load_state(saved["fq.npz"], expected=qc.FakeQuantize), qc.FakeQuantize)
    obs = qc.load_state(saved["obs.json"],
                        expected=(qc.MinMaxObserver, qc.MovingAverageMinMaxObserver))
    assert isinstance(obs, qc.MovingAverageMinMaxObserver)
    _refused(saved["obs.npz"], "holds a MovingAverageMinMaxObserver, expected FakeQuantize",
             expected=qc.FakeQuantize)
    _refused(saved["fq.json"], "expected MinMaxObserver", expected=qc.MinMaxObserver)


def test_round_trip_of_numpy_scalar_statistics(tmp_path):
    """A per-tensor observer whose min/max are numpy scalars keeps their
    float32 bits through a .json file."""
    obs = qc.MinMaxObserver()
    obs(np.array([-1.1, 3.3], F32))
    obs.min_val, obs.max_val = F32(-1.1), F32(3.3)
    path = tmp_path / "scalar.json"
    qc.save_state(obs, path)
    back = qc.load_state(path)
    assert back.min_val.dtype == F32 and back.min_val == F32(-1.1) and back.max_val == F32(3.3)
