"""Checkpoints (quantcore.checkpoints), the ``quantcore quantize`` command and
the format observers / FakeQuantize-style modules."""
import json
import struct
import tracemalloc

import numpy as np
import pytest

import quantcore as qc
from quantcore import checkpoints as CK
from quantcore import formats as F
from quantcore.cli import main
from reference import assert_bits_equal

ml_dtypes = pytest.importorskip("ml_dtypes")
safetensors_numpy = pytest.importorskip("safetensors.numpy")


def _weights(seed=0):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((64, 256)) * 0.05).astype(np.float32)
    return {
        "layer.w_bf16": w.astype(ml_dtypes.bfloat16),
        "layer.w_f16": (w * 2).astype(np.float16),
        "layer.w_f32": w[:32, :192].copy(),
        "layer.w_fp8": np.clip(w * 100, -448, 448).astype(ml_dtypes.float8_e4m3fn),
        "layer.w_e5m2": (w * 10).astype(ml_dtypes.float8_e5m2),
        "layer.w3d": w.reshape(4, 16, 256).astype(ml_dtypes.bfloat16),
        "layer.bias": w[0].astype(ml_dtypes.bfloat16),
        "layer.steps": np.arange(5, dtype=np.int64),
    }


@pytest.fixture
def ckpt(tmp_path):
    path = str(tmp_path / "w.safetensors")
    safetensors_numpy.save_file(_weights(), path, metadata={"origin": "test"})
    return path


def test_reader_maps_bf16_fp16_fp8_without_refusing(ckpt):
    ref = _weights()
    with CK.load_safetensors(ckpt) as r:
        assert set(r) == set(ref) and r.metadata == {"origin": "test"}
        for name, want in ref.items():
            got = r[name]
            assert got.dtype == want.dtype and got.shape == want.shape
            assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
            assert isinstance(got.base, np.memmap) or isinstance(got, np.memmap) or \
                got.base is not None  # a view of the file, not a copy
            if r.is_float(name):
                assert_bits_equal(r.float32(name), want.astype(np.float32))
        assert r.info("layer.w_bf16") == ("BF16", (64, 256))
        assert_bits_equal(r.float32("layer.w3d", slice(3, 9)),
                          ref["layer.w3d"].astype(np.float32).reshape(-1, 256)[3:9])
        with pytest.raises(ValueError, match="not a float tensor"):
            r.float32("layer.steps")
        with pytest.raises(KeyError, match="no tensor"):
            r["nope"]


def test_writer_round_trips_through_safetensors(tmp_path):
    ref = _weights()
    path = str(tmp_path / "o.safetensors")
    with CK.SafetensorsWriter(path, [(k, v.dtype, v.shape) for k, v in ref.items()],
                              {"a": 1}) as w:
        for k, v in ref.items():
            w.write(k, v)
    back = CK.load_safetensors(path)
    for k, v in ref.items():
        assert np.array_equal(back[k].view(np.uint8), v.view(np.uint8))
    # the safetensors package reads what it supports of the file (no FP8 in numpy)
    import safetensors
    with safetensors.safe_open(path, framework="numpy") as fh:
        assert np.array_equal(fh.get_tensor("layer.w_f16"), ref["layer.w_f16"])
    with pytest.raises(ValueError, match="expected tensor"):
        with CK.SafetensorsWriter(path + "2", [("a", "F32", (2,))]) as w:
            w.write("b", np.zeros(2, np.float32))
    import os
    assert not os.path.exists(path + "2") and not os.path.exists(path + "2.partial")


@pytest.mark.parametrize("bad, match", [
    (b"\x01", "shorter than its 8-byte header"),
    (struct.pack("<Q", 10 ** 9) + b"{}", "header length"),
    (struct.pack("<Q", 4) + b"nope", "not JSON"),
    (struct.pack("<Q", 64) + json.dumps({"t": {"dtype": "F32", "shape": [4],
                                                "data_offsets": [0, 99]}}).encode().ljust(64),
     "span 99 bytes, F32\\[4\\] takes 16"),
])
def test_reader_refuses_malformed_files_clearly(tmp_path, bad, match):
    p = tmp_path / "bad.safetensors"
    p.write_bytes(bad)
    with pytest.raises(ValueError, match=match):
        CK.SafetensorsReader(str(p))


def _st_file(header, data=b"", raw=None):
    """A safetensors file's bytes from a header (a dict, or raw JSON text)."""
    blob = raw if raw is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(blob)) + blob + data


def _t(dtype="U8", shape=(1,), offsets=(0, 1)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


# (file bytes, what the message must say, whether the reference package also refuses it)
_BAD_HEADERS = {
    "float shape": (_st_file({"a": _t(shape=[2.5], offsets=[0, 2])}, b"12"), "'a': shape", 1),
    "string shape": (_st_file({"a": _t(shape=["8"], offsets=[0, 8])}, bytes(8)),
                     "'a': shape", 1),
    "bool shape": (_st_file({"a": _t(shape=[True])}, b"1"), "'a': shape", 1),
    "negative dim": (_st_file({"a": _t(shape=[-1, 4], offsets=[0, 0])}), "negative dimension",
                     1),
    "huge dim": (_st_file({"a": _t(shape=[0, 2 ** 64], offsets=[0, 0])}), "too large", 1),
    "float offsets": (_st_file({"a": _t(offsets=[0.0, 1.0])}, b"1"), "'a': data_offsets", 1),
    "string offsets": (_st_file({"a": _t(offsets=["0", "1"])}, b"1"), "'a': data_offsets", 1),
    "three offsets": (_st_file({"a": _t(offsets=[0, 1, 1])}, b"1"), "'a': data_offsets", 1),
    "reversed offsets": (_st_file({"a": _t(shape=[0], offsets=[1, 0])}, b"1"),
                         "end before they begin", 1),
    "overlap": (_st_file({"a": _t(shape=[2], offsets=[0, 2]), "b": _t(shape=[2], offsets=[1, 3])},
                         b"123"), "overlaps", 1),
    "gap": (_st_file({"a": _t(offsets=[1, 2])}, b"12"), "unused", 1),
    "trailing data": (_st_file({"a": _t()}, b"12"), "cover 1 bytes, the data section holds 2",
                      1),
    "past the end": (_st_file({"a": _t(shape=[4], offsets=[0, 4])}, b"1"),
                     "'a' lies outside the file", 1),
    "wrong size": (_st_file({"a": _t(dtype="F32", shape=[2], offsets=[0, 4])}, b"1234"),
                   "takes 8", 1),
    "unknown dtype": (_st_file({"a": _t(dtype="F128")}, b"1"), "'a': dtype 'F128'", 1),
    "list dtype": (_st_file({"a": _t(dtype=["F32"])}, b"1"), "'a': dtype", 1),
    "fractional bytes": (_st_file({"a": _t(dtype="F4", shape=[3], offsets=[0, 1])}, b"1"),
                         "not a whole number of bytes", 1),
    "missing field": (_st_file({"a": {"dtype": "U8", "shape": [0]}}), "missing", 1),
    "entry not object": (_st_file({"a": [1, 2]}), "entry must be an object", 1),
    "metadata int": (_st_file({"__metadata__": {"k": 1}}), "__metadata__", 1),
    "metadata list": (_st_file({"__metadata__": ["k"]}), "__metadata__", 1),
    "metadata string": (_st_file({"__metadata__": "k"}), "__metadata__", 1),
    "NaN constant": (_st_file(None, raw=b'{"__metadata__": {"k": NaN}}'), "not JSON", 1),
    "deep nesting": (_st_file(None, raw=b"[" * 100000 + b"]" * 100000), "levels deep", 1),
    "top-level list": (_st_file(None, raw=b"[]"), "not a JSON object", 1),
    "two objects": (_st_file(None, raw=b"{}{}"), "not JSON", 1),
    "bad utf-8": (_st_file(None, raw=b'{"\xff": 1}'), "not JSON", 1),
    "lone surrogate": (_st_file(None, raw=b'{"\\ud800": {"dtype": "U8", "shape": [0], '
                                          b'"data_offsets": [0, 0]}}'), "not valid Unicode", 1),
    "header too long": (struct.pack("<Q", 2 ** 64 - 1) + b"{}", "header length", 1),
    # stricter than the reference, which keeps the last / ignores the field
    "duplicate name": (_st_file(None, raw=b'{"a": {"dtype": "U8", "shape": [1], "data_offsets":'
                                          b' [0, 1]}, "a": {"dtype": "U8", "shape": [1], '
                                          b'"data_offsets": [0, 1]}}', data=b"1"),
                       "'a' appears twice", 0),
    "unknown field": (_st_file({"a": {**_t(), "extra": 1}}, b"1"), "unknown \\['extra'\\]", 0),
}


@pytest.mark.parametrize("case", sorted(_BAD_HEADERS))
def test_reader_applies_the_reference_validation(tmp_path, case):
    """Each rule of the format, broken once: refused with the tensor and the
    field named, by the reader and by every CLI command that lists a file;
    the reference package refuses the same file (where it validates it)."""
    data, match, reference_refuses = _BAD_HEADERS[case]
    p = tmp_path / "bad.safetensors"
    p.write_bytes(data)
    with pytest.raises(ValueError, match=match):
        CK.SafetensorsReader(str(p))
    from safetensors import deserialize
    if reference_refuses:
        with pytest.raises(Exception):
            deserialize(data)
    else:
        deserialize(data)
    from quantcore.cli_files import CliError, list_tensors
    with pytest.raises(CliError, match=match):
        list_tensors(str(p))


def test_reader_accepts_what_the_reference_accepts(tmp_path):
    """Out-of-order entries, zero-size tensors, null metadata, the newer
    dtypes and leading / trailing blanks: read byte for byte as the
    reference package reads them."""
    from safetensors import deserialize
    header = {"z": _t("F32", [0, 3], [6, 6]), "b": _t("BF16", [2], [2, 6]),
              "a": _t("F8_E8M0", [2], [0, 2]), "c": _t("C64", [1], [6, 14]),
              "f4": _t("F4", [4], [14, 16]), "__metadata__": None}
    data = bytes(range(16))
    raw = b"  " + json.dumps(header).encode() + b"   "
    blob = _st_file(None, data, raw)
    p = tmp_path / "ok.safetensors"
    p.write_bytes(blob)
    ref = {name: t for name, t in deserialize(blob)}
    with CK.SafetensorsReader(str(p)) as r:
        assert sorted(r) == sorted(ref) and r.metadata == {}
        for name, t in ref.items():
            assert r.info(name) == (t["dtype"], tuple(t["shape"]))
            assert bytes(r.raw(name)) == bytes(t["data"])
        assert r["c"].dtype == np.complex64 and r["z"].shape == (0, 3)


@pytest.mark.parametrize("rows", [slice(0, 2, 2), slice(None, None, -1), slice(5, 1, -2),
                                  slice(1, 100, 3), slice(7, 2), slice(-3, None)])
def test_float32_row_slices_follow_numpy(ckpt, rows):
    ref = _weights()["layer.w3d"].astype(np.float32).reshape(-1, 256)
    with CK.SafetensorsReader(ckpt) as r:
        assert_bits_equal(r.float32("layer.w3d", rows), ref[rows])
        for cols in (slice(0, 64), slice(200, None), slice(None, None, -3), slice(5, 5)):
            assert_bits_equal(r.float32("layer.w3d", rows, cols), ref[rows][:, cols])
            assert_bits_equal(r.float32("layer.w3d", cols=cols), ref[:, cols])
        with pytest.raises(TypeError, match="rows must be a slice"):
            r.float32("layer.w3d", [0, 1])
        with pytest.raises(TypeError, match="cols must be a slice"):
            r.float32("layer.w3d", cols=3)


@pytest.mark.parametrize("entries, meta, match", [
    ([("a", "F32", (2, -1))], None, "negative dimension"),
    ([("a", "F32", (2.0,))], None, "not an integer"),
    ([("a", "F32", (True,))], None, "not an integer"),
    ([("a", "F32", (2,)), ("a", "F32", (2,))], None, "declared twice"),
    ([("__metadata__", "F32", (2,))], None, "declared twice"),
    ([(1, "F32", (2,))], None, "tensor name must be a string"),
    ([("a", "F4", (3,))], None, "not a whole number of bytes"),
    ([("a", "F32", (2 ** 62,))], None, "too large"),
    ([("a", "F32", (2,))], {"k": None}, "must be a string"),
    ([("a", "F32", (2,))], {"k": "\ud800"}, "not valid Unicode"),
])
def test_writer_refuses_what_the_reader_would(tmp_path, entries, meta, match):
    path = tmp_path / "w.safetensors"
    with pytest.raises(ValueError, match=match):
        CK.SafetensorsWriter(str(path), entries, meta)
    assert not path.exists() and not (tmp_path / "w.safetensors.partial").exists()


def test_writer_writes_big_endian_values_and_names_a_directory(tmp_path):
    x = np.arange(6, dtype=">f4").reshape(2, 3) / 7
    path = str(tmp_path / "be.safetensors")
    with CK.SafetensorsWriter(path, [("x", "F32", (2, 3)), ("i", np.dtype(">i2"), (3,))]) as w:
        w.write("x", x)
        w.write("i", np.array([1, -2, 300], ">i2"))
    from safetensors.numpy import load_file
    back = load_file(path)
    assert_bits_equal(back["x"], x.astype("<f4"))
    assert back["i"].tolist() == [1, -2, 300]
    with pytest.raises(IsADirectoryError, match="is a directory"):
        CK.SafetensorsReader(str(tmp_path))
    with pytest.raises(IsADirectoryError, match="is a directory"):
        CK.SafetensorsWriter(str(tmp_path), [])


def test_sub_byte_dtype_tensor_is_kept_as_raw_bytes(tmp_path):
    header = json.dumps({"odd": {"dtype": "F4", "shape": [6], "data_offsets": [0, 3]},
                         "w": {"dtype": "F32", "shape": [1], "data_offsets": [3, 7]}}).encode()
    p = tmp_path / "odd.safetensors"
    p.write_bytes(struct.pack("<Q", len(header)) + header + b"\x7f\x80\x81" +
                  np.float32(2).tobytes())
    with CK.SafetensorsReader(str(p)) as r:
        assert r["odd"].tolist() == [0x7F, 0x80, 0x81]
        assert r["w"].tolist() == [2.0]


def _run_cli(argv, capsys):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("fmt, extra", [("int4", []), ("int4", ["--symmetric"]),
                                        ("int8", ["--recipe", "torchao", "--symmetric",
                                                  "--group-size", "64"]),
                                        ("int4", ["--recipe", "tinygemm", "--group-size", "64"]),
                                        ("fp8", []), ("mxfp4", []), ("mxfp8", []),
                                        ("nvfp4", [])])
def test_quantize_cli_layout_and_sqnr(ckpt, tmp_path, capsys, fmt, extra):
    out = str(tmp_path / "q.safetensors")
    code, stdout, err = _run_cli(["quantize", ckpt, "--format", fmt, "-o", out] + extra, capsys)
    assert code == 0, err
    assert "SQNR dB" in stdout and "layer.w_bf16" in stdout
    back = CK.load_safetensors(out)
    meta = back.metadata
    assert meta["quantcore_format"] == fmt and meta["origin"] == "test"
    ref = _weights()
    # copied tensors: bytes for bytes
    assert np.array_equal(back["layer.bias"].view(np.uint8), ref["layer.bias"].view(np.uint8))
    assert np.array_equal(back["layer.steps"], ref["layer.steps"])
    w = ref["layer.w_bf16"].astype(np.float32)
    recipe = extra[extra.index("--recipe") + 1] if "--recipe" in extra else "onnx"
    g = int(extra[extra.index("--group-size") + 1]) if "--group-size" in extra else 128
    sym = "--symmetric" in extra
    if fmt in ("mxfp4", "mxfp8", "nvfp4"):  # blocks along the last axis, one tensor scale
        if fmt == "nvfp4":
            q, s, g2 = qc.nvfp4_quantize(w)
            assert_bits_equal(back["layer.w_bf16.scale_2"], np.array([g2], np.float32))
            assert back["layer.w_bf16.scales"].dtype == ml_dtypes.float8_e4m3fn
            y = qc.nvfp4_dequantize(q, s, g2)
        else:
            elem = "e2m1" if fmt == "mxfp4" else "e4m3"
            s, q = qc.mx_quantize(w, elem)
            y = qc.mx_dequantize(s, q, elem)
        assert np.array_equal(back["layer.w_bf16.qweight"].view(np.uint8), q.view(np.uint8))
        assert np.array_equal(back["layer.w_bf16.scales"].view(np.uint8), s)
        line = [ln for ln in stdout.splitlines() if ln.startswith("layer.w_bf16 ")][0]
        assert abs(float(line.split()[4]) - qc.cli.sqnr_db(w, y)) < 0.01
        _w3d_is_copied(back, ref)
        return
    if fmt == "fp8":
        codes, s = F.fp8_quantize(w, axis=0)
        assert np.array_equal(back["layer.w_bf16.qweight"].view(np.uint8), codes)
        assert_bits_equal(back["layer.w_bf16.scales"], (np.float32(1) / s).astype(np.float32))
        return
    bits = 4 if fmt == "int4" else 8
    q, s, z = F.group_quantize(w, bits, g, symmetric=sym, recipe=recipe)
    qw = back["layer.w_bf16.qweight"]
    assert np.array_equal(qw.view(np.uint8), (F.pack_int4(q) if bits == 4 else q).view(np.uint8))
    assert_bits_equal(back["layer.w_bf16.scales"], s)
    assert ("layer.w_bf16.zero_points" in back) == (not sym)
    if not sym:
        assert np.array_equal(back["layer.w_bf16.zero_points"], z)
    # the printed SQNR is that of the dequantized tensor
    y = F.group_dequantize(q, s, z, g, recipe=recipe, bits=bits)
    want = qc.cli.sqnr_db(w, y)
    line = [ln for ln in stdout.splitlines() if ln.startswith("layer.w_bf16 ")][0]
    assert abs(float(line.split()[4]) - want) < 0.01
    _w3d_is_copied(back, ref)


def _w3d_is_copied(back, ref):
    """A 3-D tensor (a conv kernel's rank) is copied by default
    (tests/test_cli.py quantizes named ones)."""
    assert "layer.w3d.qweight" not in back
    assert np.array_equal(back["layer.w3d"].view(np.uint8), ref["layer.w3d"].view(np.uint8))


def test_quantize_cli_errors_are_one_line(ckpt, tmp_path, capsys):
    out = str(tmp_path / "q.safetensors")
    code, _, err = _run_cli(["quantize", ckpt, "--recipe", "awq", "--group-size", "100",
                             "-o", out], capsys)
    assert code == 2 and "not a multiple of --group-size" in err and err.count("\n") == 1
    code, _, err = _run_cli(["quantize", ckpt, "--tensors", "nope", "-o", out], capsys)
    assert code == 2 and "nothing matches nope" in err
    code, _, err = _run_cli(["quantize", str(tmp_path / "missing.safetensors"), "-o", out],
                            capsys)
    assert code == 2 and "no such file" in err
    code, _, err = _run_cli(["quantize", ckpt, "-o", str(tmp_path / "q.npz")], capsys)
    assert code == 2 and ".safetensors" in err
    bad = tmp_path / "nan.safetensors"
    safetensors_numpy.save_file({"w": np.full((2, 128), np.nan, np.float32)}, str(bad))
    code, _, err = _run_cli(["quantize", str(bad), "-o", out], capsys)
    assert code == 2 and "NaN or inf" in err
    import os
    assert not os.path.exists(out) and not os.path.exists(out + ".partial")


def test_quantize_peak_memory_is_a_fraction_of_the_largest_tensor(tmp_path, capsys,
                                                                   monkeypatch):
    """Traced allocations while quantizing a 2-tensor BF16 file stay below
    1.2x the largest tensor (its stored bytes): memory-mapped input, chunked
    conversion, streamed output."""
    from quantcore import cli_quantize
    monkeypatch.setattr(cli_quantize, "CHUNK_ELEMENTS", 1 << 16)
    rng = np.random.default_rng(0)
    path = str(tmp_path / "big.safetensors")
    big = rng.standard_normal((2048, 1024)).astype(ml_dtypes.bfloat16)   # 4 MiB
    safetensors_numpy.save_file({"a": big, "b": big[:1024]}, path)
    del big
    tracemalloc.start()
    try:
        assert main(["quantize", path, "-o", str(tmp_path / "q.safetensors"), "-q"]) == 0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1.2 * 2048 * 1024 * 2, peak


@pytest.mark.parametrize("fmt, extra", [("int4", []), ("int8", ["--symmetric"]),
                                        ("int4", ["--recipe", "tinygemm", "--group-size", "64"]),
                                        ("fp8", []), ("mxfp4", []), ("mxfp8", []),
                                        ("nvfp4", [])])
def test_quantize_long_rows_in_pieces_same_bytes_same_memory(ckpt, tmp_path, capsys,
                                                             monkeypatch, fmt, extra):
    """A row longer than the chunk is read in pieces of whole groups / blocks:
    the output is byte for byte the output of whole rows, and the traced peak
    of a [1, n] tensor is that of an [r, n / r] one of the same bytes (a
    [1, 2**28] BF16 tensor no longer needs 8 copies of its row)."""
    from quantcore import cli_quantize
    whole = str(tmp_path / "whole.safetensors")
    assert main(["quantize", ckpt, "--format", fmt, "-o", whole, "-q"] + extra) == 0
    monkeypatch.setattr(cli_quantize, "CHUNK_ELEMENTS", 100)  # rows of 192 / 256: pieces
    pieces = str(tmp_path / "pieces.safetensors")
    assert main(["quantize", ckpt, "--format", fmt, "-o", pieces, "-q"] + extra) == 0
    with CK.SafetensorsReader(whole) as a, CK.SafetensorsReader(pieces) as b:
        assert list(a) == list(b) and a.metadata == b.metadata
        for name in a:
            assert a.info(name) == b.info(name)
            assert bytes(a.raw(name)) == bytes(b.raw(name)), name
    if fmt != "int4" or extra:
        return
    monkeypatch.setattr(cli_quantize, "CHUNK_ELEMENTS", 1 << 14)
    n = 1 << 19
    x = (np.random.default_rng(0).standard_normal(n) * 0.05).astype(ml_dtypes.bfloat16)
    peaks = []
    for shape in ((1, n), (1 << 9, 1 << 10)):
        path = str(tmp_path / "t.safetensors")
        safetensors_numpy.save_file({"w": x.reshape(shape)}, path)
        tracemalloc.start()
        try:
            assert main(["quantize", path, "-o", str(tmp_path / "q.safetensors"), "-q"]) == 0
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
    assert peaks[0] < 1.5 * peaks[1], peaks


# ---------------------------------------------------------------- observers
def test_amax_observer_granularities_and_state():
    rng = np.random.default_rng(1)
    xs = [(rng.standard_normal((6, 32)) * (k + 1)).astype(np.float32) for k in range(3)]
    per_tensor, per_row, per_group = qc.AmaxObserver(), qc.AmaxObserver(axis=0), \
        qc.AmaxObserver(group_size=8)
    for x in xs:
        for o in (per_tensor, per_row, per_group):
            assert o(x) is x
    allx = np.stack(xs)
    assert per_tensor.amax == np.abs(allx).max()
    assert np.array_equal(per_row.amax, np.abs(allx).max(axis=(0, 2)))
    assert np.array_equal(per_group.amax, np.abs(allx).reshape(3, 6, 4, 8).max(axis=(0, 3)))
    other = qc.AmaxObserver(axis=0)
    other.load_state_dict(per_row.state_dict())
    assert np.array_equal(other.amax, per_row.amax)
    split = qc.AmaxObserver(axis=0)
    split.update(xs[0])
    rest = qc.AmaxObserver(axis=0)
    rest.update(xs[1])
    rest.update(xs[2])
    assert np.array_equal(split.merge(rest).amax, per_row.amax)


def test_observers_nan_policy():
    x = np.ones((2, 8), np.float32)
    x[0, 0] = np.nan
    o = qc.AmaxObserver()
    with pytest.warns(RuntimeWarning, match="skipped"):
        o.update(x)
    assert o.num_batches == 0 and o.nonfinite_batches == 1
    with pytest.raises(ValueError, match="NaN or inf"):
        qc.GroupMinMaxObserver(4, nan_policy="raise").update(x)
    p = qc.AmaxObserver(nan_policy="propagate")
    p.update(x)
    assert np.isnan(p.amax)


def test_fp8_fake_quantize_module_and_ste():
    rng = np.random.default_rng(2)
    fq = qc.FP8FakeQuantize()
    x = (rng.standard_normal((4, 16)) * 3).astype(np.float32)
    y = fq(x)
    assert_bits_equal(y, qc.fp8_fake_quant(x, np.abs(x).max()))
    x2 = x * 2
    fq.eval()
    y2 = fq(x2)     # eval: the observed amax, values beyond it saturate
    assert_bits_equal(y2, qc.fp8_fake_quant(x2, np.abs(x).max()))
    g = np.ones_like(x2)
    assert np.array_equal(fq.backward(g), (np.abs(x2) <= np.abs(x).max()).astype(np.float32))
    dyn = qc.FP8FakeQuantize("e5m2", recipe="torchao", axis=0, dynamic=True)
    assert_bits_equal(dyn(x2), qc.fp8_fake_quant(x2, fmt="e5m2", recipe="torchao", axis=0))
    with pytest.raises(RuntimeError, match="no amax observed"):
        cold = qc.FP8FakeQuantize()
        cold.eval()
        cold(x)


def test_group_fake_quantize_module():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((8, 64)).astype(np.float32)
    m = qc.GroupFakeQuantize(4, 32, recipe="awq", symmetric=True)
    y = m(w)
    assert_bits_equal(y, qc.group_fake_quant(w, 4, 32, recipe="awq", symmetric=True))
    q, s, z = m.quantize(w)
    assert q.dtype == np.int8 and s.shape == (8, 2)
    assert np.array_equal(m.observer.min_val, w.reshape(8, 2, 32).min(axis=2))
    grad = m.backward(np.ones_like(w))
    assert grad.shape == w.shape and set(np.unique(grad)) <= {0.0, 1.0}


@pytest.mark.parametrize("kernel_copy", [True, False], ids=["copy_file_range", "pread"])
def test_copied_tensors_are_copied_in_pieces_and_a_truncation_is_an_error(tmp_path, monkeypatch,
                                                                          kernel_copy):
    """A tensor copied bytes for bytes (quantize's unquantized tensors, the
    engines' ignored ones) goes file to file a piece at a time, in the
    kernel (copy_file_range) or, where the system refuses that, through
    pread and write; never through the memory map: the input truncated
    between two pieces gives an error naming the file, never SIGBUS, and an
    intact copy is bytes for bytes, written at the output's position among
    the other tensors."""
    import errno
    import os

    from quantcore import _files
    real_copy = os.copy_file_range
    if not kernel_copy:
        def refuse(*args):
            raise OSError(errno.EXDEV, "cross-device")
        monkeypatch.setattr(os, "copy_file_range", refuse)
    src = tmp_path / "in.safetensors"
    t = {"a": np.arange(64, dtype=np.float32), "b": np.arange(40, dtype=np.int16),
         "c": np.arange(5, dtype=np.uint8)}
    with CK.SafetensorsWriter(str(src), [(n, a.dtype, a.shape) for n, a in t.items()]) as w:
        for n, a in t.items():
            w.write(n, a)
    monkeypatch.setattr(CK, "_READ_BYTES", 32)
    with CK.SafetensorsReader(str(src)) as r:
        with CK.SafetensorsWriter(str(tmp_path / "out.safetensors"),
                                  [("c", "U8", (5,)), ("a", "F32", (64,)), ("x", "F32", (3,)),
                                   ("b2", "I16", (40,))]) as w:
            w.write("c", t["c"])  # (buffered when the copy starts)
            w.copy_from(r, "a")
            w.write("x", np.float32([1, 2, 3]))
            w.copy_from(r, "b2", "b")
    with CK.SafetensorsReader(str(tmp_path / "out.safetensors")) as back:
        assert np.array_equal(back["a"], t["a"]) and np.array_equal(back["b2"], t["b"])
        assert np.array_equal(back["c"], t["c"]) and back["x"].tolist() == [1, 2, 3]
    pieces = []
    real = _files.pread_into if not kernel_copy else real_copy

    def cut_after_first(*args):
        pieces.append(args)
        if len(pieces) == 2:
            with open(src, "r+b") as fh:
                fh.truncate(src.stat().st_size - 100)
        return real(*args)
    monkeypatch.setattr(*((os, "copy_file_range") if kernel_copy else
                          (_files, "pread_into")), cut_after_first)
    with CK.SafetensorsReader(str(src)) as r:
        w = CK.SafetensorsWriter(str(tmp_path / "cut.safetensors"), [("a", "F32", (64,))])
        with pytest.raises((ValueError, OSError), match="in.safetensors"):
            w.copy_from(r, "a")
        w.abort()
    assert len(pieces) == 2
    assert not (tmp_path / "cut.safetensors").exists()


def test_the_writer_starts_the_kernels_writeback_every_few_mib(tmp_path, monkeypatch):
    """SafetensorsWriter asks the kernel to start writing its file every
    ``_WRITEBACK_BYTES`` (written or copied), so the fsync at the end waits
    for the last piece only; the file is the same.  The hint never raises
    (a bad descriptor: False) and works on Linux."""
    import os
    import sys

    from quantcore import _files
    calls = []
    real = _files.start_writeback

    def record(fd):
        calls.append(fd)
        return real(fd)
    monkeypatch.setattr(_files, "start_writeback", record)
    monkeypatch.setattr(CK, "_WRITEBACK_BYTES", 256)
    src = tmp_path / "in.safetensors"
    t = {f"t{i}": np.arange(100 * (i + 1), dtype=np.float32) for i in range(3)}
    with CK.SafetensorsWriter(str(src), [(n, a.dtype, a.shape) for n, a in t.items()]) as w:
        for n, a in t.items():
            w.write(n, a)
    assert len(calls) == 3  # (400, 800, 1200 bytes: each past 256)
    with CK.SafetensorsReader(str(src)) as r:
        with CK.SafetensorsWriter(str(tmp_path / "out.safetensors"),
                                  [("t2", "F32", (300,)), ("s", "F32", (3,))]) as w:
            w.copy_from(r, "t2")
            w.write("s", np.float32([1, 2, 3]))
    assert len(calls) == 4  # (the copied 1200 bytes; the last 12 wait for the fsync)
    with CK.SafetensorsReader(str(tmp_path / "out.safetensors")) as back:
        assert np.array_equal(back["t2"], t["t2"]) and back["s"].tolist() == [1, 2, 3]
    assert real(-1) is False
    if sys.platform.startswith("linux"):
        fd = os.open(src, os.O_RDONLY)
        try:
            assert real(fd) is True
        finally:
            os.close(fd)
