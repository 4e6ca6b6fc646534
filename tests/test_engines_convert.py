"""quantcore convert: compressed-tensors <-> ModelOpt without requantizing.
NVFP4 converted where a float32 global scale keeps every block's factor
(the destination's decoder then gives the source's values bit for bit),
refused naming the layer otherwise; FP8 per channel with the same codes
and scale values; the other schemes refused naming them."""
import json

import numpy as np
import pytest

from quantcore import engines
from quantcore.checkpoints import SafetensorsReader
from quantcore.cli import main
from quantcore.engines import convert as C

from test_engines_dir import _model_dir


def _raw(d):
    with SafetensorsReader(d / "model.safetensors") as r:
        return {n: (r.info(n), bytes(r.raw(n))) for n in r}


def _pow2_model(path):
    """A BF16 model whose weights all have absmax 0.65625 = 2688 / 4096, so
    that both layouts' NVFP4 global scales are powers of two (4096 and
    2**-12) and the reciprocal is exact."""
    from quantcore.checkpoints import SafetensorsWriter
    from quantcore.engines import compressed_tensors as CT
    src = _model_dir(path, hidden=64)
    with SafetensorsReader(src / "model.safetensors") as r:
        data = {n: (r.info(n), r.float32(n)) for n in r}
    with SafetensorsWriter(src / "model.safetensors", [(n, dt, s) for n, ((dt, s), _) in
                                                        data.items()], {"format": "pt"}) as w:
        for n, ((dt, s), x) in data.items():
            if len(s) == 2:
                x = np.clip(x / np.abs(x).max() * 0.6, -0.65625, 0.65625).astype(np.float32)
                x.reshape(-1)[0] = 0.65625
            w.write(n, CT.as_dtype_bytes(CT.round_to(x, dt), dt))
    return src


def _deq(d):
    """{name: (dtype, values)}; the float values compared with ==: ModelOpt's
    decoder gives +0 for the code 0x8, compressed-tensors' -0."""
    return {n: (dt, tuple(a.reshape(-1).tolist()) if a.dtype == np.float32 else a.tobytes())
            for n, (dt, a) in engines.load_dequantized(d).items()}


@pytest.mark.parametrize("src_fmt,scheme", [("compressed-tensors", "NVFP4A16"),
                                            ("modelopt", "W4A16_NVFP4")])
def test_nvfp4_both_ways_same_codes_same_values(tmp_path, src_fmt, scheme):
    other = "modelopt" if src_fmt == "compressed-tensors" else "compressed-tensors"
    engines.quantize_model(_model_dir(tmp_path / "r", hidden=64), tmp_path / "r1", scheme,
                           fmt=src_fmt)
    # (a trained model's global scale: its reciprocal loses some block's factor)
    with pytest.raises(ValueError, match=r"layer 'model\.layers\.0\..*not converted"):
        engines.convert_model(tmp_path / "r1", tmp_path / "r2", other)
    assert not (tmp_path / "r2").exists()
    src = _pow2_model(tmp_path / "m")
    engines.quantize_model(src, tmp_path / "a", scheme, fmt=src_fmt)
    rep = engines.convert_model(tmp_path / "a", tmp_path / "b", other)
    assert rep["kind"] == "nvfp4" and len(rep["converted"]) == 14
    assert _deq(tmp_path / "a") == _deq(tmp_path / "b")  # BF16 model: both decoders' values
    back = engines.convert_model(tmp_path / "b", tmp_path / "c", src_fmt)
    a, b, c = _raw(tmp_path / "a"), _raw(tmp_path / "b"), _raw(tmp_path / "c")
    packed = "weight_packed" if src_fmt == "compressed-tensors" else "weight"
    codes = "weight" if packed == "weight_packed" else "weight_packed"
    m = "model.layers.1.mlp.up_proj"
    assert a[f"{m}.{packed}"][1] == b[f"{m}.{codes}"][1] == c[f"{m}.{packed}"][1]
    assert a[f"{m}.weight_scale"] == b[f"{m}.weight_scale"] == c[f"{m}.weight_scale"]
    assert _deq(tmp_path / "c") == _deq(tmp_path / "a") and back["kind"] == "nvfp4"


def test_fp8_channel_both_ways(tmp_path):
    src = _model_dir(tmp_path / "m", hidden=64)
    engines.quantize_model(src, tmp_path / "ct", "FP8_DYNAMIC")
    engines.quantize_model(src, tmp_path / "mo", "FP8_PER_CHANNEL_PER_TOKEN", fmt="modelopt")
    assert main(["convert", str(tmp_path / "ct"), "-o", str(tmp_path / "ct2mo"), "--format",
                 "modelopt", "-q"]) == 0
    engines.convert_model(tmp_path / "mo", tmp_path / "mo2ct", "compressed-tensors")
    m = "model.layers.0.self_attn.k_proj"
    for s, d in (("ct", "ct2mo"), ("mo", "mo2ct")):
        a, b = _raw(tmp_path / s), _raw(tmp_path / d)
        assert a[m + ".weight"] == b[m + ".weight"]
        sa, sb = (engines.compressed_tensors._read_float(np.frombuffer(x[1], np.uint8),
                                                         x[0][0]) for x in
                  (a[m + ".weight_scale"], b[m + ".weight_scale"]))
        assert np.array_equal(sa, sb) and b[m + ".weight_scale"][0][0] == "F32"
    cfg = json.loads((tmp_path / "ct2mo" / "config.json").read_text())
    assert cfg["quantization_config"]["quant_algo"] == "FP8_PER_CHANNEL_PER_TOKEN"
    assert (tmp_path / "ct2mo" / "hf_quant_config.json").exists()
    assert not (tmp_path / "mo2ct" / "hf_quant_config.json").exists()
    assert main(["dequantize", str(tmp_path / "mo2ct"), "-o",
                 str(tmp_path / "d.safetensors")]) == 0


def test_other_schemes_and_same_format_refused(tmp_path):
    src = _model_dir(tmp_path / "m", hidden=64)
    engines.quantize_model(src, tmp_path / "w4", "W4A16", group_size=32)
    with pytest.raises(ValueError, match="convert takes NVFP4A16 and FP8_DYNAMIC"):
        engines.convert_model(tmp_path / "w4", tmp_path / "x", "modelopt")
    with pytest.raises(ValueError, match="already compressed-tensors"):
        engines.convert_model(tmp_path / "w4", tmp_path / "x", "compressed-tensors")
    assert main(["convert", str(tmp_path / "w4"), "-o", str(tmp_path / "x"), "--format",
                 "modelopt"]) == 2
    assert not (tmp_path / "x").exists()


def test_inverse_global_refuses_when_no_float32_inverse_keeps_the_factors():
    s8 = np.array([0.5, 0.5625, 0.625, 0.6875, 0.75, 0.8125, 0.875, 0.9375], np.float32)
    found = refused = 0
    for g in np.random.default_rng(0).uniform(1e-4, 1e-2, 400).astype(np.float32):
        try:
            r = C.inverse_global(g, s8, "modelopt", "L")
        except ValueError as exc:
            assert "layer 'L'" in str(exc)
            refused += 1
            continue
        assert np.array_equal((s8 / r).astype(np.float32), (s8 * g).astype(np.float32))
        found += 1
    assert found and refused
