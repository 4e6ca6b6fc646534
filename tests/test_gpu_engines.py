"""CPU vs GPU for the engine checkpoint writers (issue 45): the row loops
of ``quantcore_gpu/cuda/engines.cu`` (``quantcore_gpu.engine_kernels``)
against the CPU's ``_engines`` with the same arguments, and every
compressed-tensors and ModelOpt scheme's ``quantize_tensor`` on cupy
input against numpy input, bit for bit: BF16 weights as stored bits and
as float32 values, F32 and F16 weights (F16: on the host), edge values
(signed zeros, subnormals, exact ties of the e2m1 and int grids, values
past the FP8 range), 32- and 64-bit indices; NaN / inf refused naming the
tensor as on the CPU.

Needs cupy and a CUDA device, or the CUDA emulator (``make gpu-emu-test``).
"""
import json
import os

import numpy as np
import pytest

from quantcore import engines
from quantcore._cpu import _engines
from quantcore.checkpoints import SafetensorsWriter
from quantcore.engines import compressed_tensors as CT
from quantcore.engines import modelopt as MO
from quantcore_gpu import engine_kernels as G
from reference import gpu_cupy, to_numpy

cp = gpu_cupy()

pytestmark = pytest.mark.gpu



def weight(rows=6, cols=64, seed=0, dt="BF16"):
    """float32 [rows, cols] exact in ``dt``: normal values at row scales
    2^-20 .. 2^20 (F16: 2^-10 .. 2^10), with specials in row 0 (signed
    zeros, a subnormal, e2m1 and int ties, +-448, 3e4) and a zero row."""
    rng = np.random.default_rng(seed)
    e = 10 if dt == "F16" else 20  # (F16's range: 65504)
    x = (rng.standard_normal((rows, cols)) * 2.0 ** rng.integers(-e, e, (rows, 1)))
    x = x.astype(np.float32)
    x[0, :12] = [0.0, -0.0, 2.0 ** -140, -0.25, 0.75, 2.5, -3.5, 5.0, 448.0, -448.0, 7.5, 3e4]
    x[1] = 0.0
    x[1, 3] = -0.0
    return CT.round_to(x, dt)


def bits(x):
    return (x.view(np.uint32) >> 16).astype(np.uint16)


def inputs(dt):
    """(label, numpy x) the writers take for a ``dt`` weight: its stored
    BF16 bits and float32 values, else float32 values."""
    x = weight(dt=dt)
    return [("bits", bits(x)), ("f32", x)] if dt == "BF16" else [("f32", x)]


def test_statistics_match_the_cpu(index64):
    x = weight()
    x[2, 7] = np.nan
    x[3, 1] = -np.inf
    for xs in (bits(x), x):
        assert np.array_equal(G.absmax_rows(cp.asarray(xs)), _engines.absmax_rows(xs, 1),
                              equal_nan=True)
        for group in (2, 16, 32):
            got = G.group_absmax_rows(cp.asarray(xs), group)
            assert isinstance(got, np.ndarray)
            assert np.array_equal(got, _engines.group_absmax_rows(xs, group, 1), equal_nan=True)
        for group in (2, 16, 64):
            lo, hi = G.group_minmax_rows(cp.asarray(xs), group)
            clo, chi = _engines.group_minmax_rows(xs, group, 1)
            assert isinstance(lo, np.ndarray) and lo.shape == clo.shape
            # (+0 and -0 compare equal: the CPU's vectorised scan may keep either)
            assert np.array_equal(lo, clo, equal_nan=True)
            assert np.array_equal(hi, chi, equal_nan=True)


@pytest.mark.parametrize("round_bf16", [False, True])
def test_code_loops_match_the_cpu(index64, round_bf16):
    for xs in (bits(weight()), weight()):
        rows, cols = xs.shape
        for scales in (np.float32([0.37]), np.linspace(1e-3, 9, rows, dtype=np.float32)):
            got = G.fp8_rows(cp.asarray(xs), scales, round_bf16)
            assert np.array_equal(to_numpy(got), _engines.fp8_rows(xs, scales, round_bf16, 1))
        for group in (16, 32):
            d = np.geomspace(1e-3, 1e3, rows * cols // group).astype(np.float32)
            d = d.reshape(rows, cols // group)
            got = G.fp4_rows(cp.asarray(xs), d, group, round_bf16)
            assert np.array_equal(to_numpy(got), _engines.fp4_rows(xs, d, group, round_bf16, 1))
            z = np.rint(np.linspace(-8, 7, d.size)).astype(np.float32).reshape(d.shape)
            for qmin, qmax, pack in ((-8, 7, 4), (-8, 7, 0), (-128, 127, 8), (-128, 127, 0)):
                got = G.int_rows(cp.asarray(xs), d, z, group, qmin, qmax, round_bf16,
                                 pack=pack)
                ref = _engines.int_rows(xs, d, z, group, qmin, qmax, round_bf16, 1, pack)
                assert got.dtype == ref.dtype and np.array_equal(to_numpy(got), ref)


CT_CASES = [(s, dt) for s in CT.SCHEMES for dt in ("BF16", "F32", "F16")]


@pytest.mark.parametrize("scheme,dt", CT_CASES, ids=[f"{s}-{d}" for s, d in CT_CASES])
def test_compressed_tensors_on_cupy(scheme, dt):
    for label, x in inputs(dt):
        g = CT.nvfp4_global_scale(np.abs(weight(dt=dt)).max(), dt) \
            if scheme == "NVFP4A16" else None
        for group in ((128, 32) if CT.is_int_group(scheme) else (None,)):
            if group is not None and x.shape[1] % group:
                continue
            ref = CT.quantize_tensor(x, dt, scheme, group or 32, g, "m.weight")
            got = CT.quantize_tensor(cp.asarray(x), dt, scheme, group or 32, g, "m.weight")
            assert list(got) == list(ref), label
            for k in ref:
                assert isinstance(got[k], cp.ndarray), (label, k)
                assert got[k].dtype == ref[k].dtype and np.array_equal(to_numpy(got[k]),
                                                                        ref[k]), (label, k)


MO_CASES = [(s, dt) for s in MO.SCHEMES for dt in ("BF16", "F32", "F16")]


@pytest.mark.parametrize("scheme,dt", MO_CASES, ids=[f"{s}-{d}" for s, d in MO_CASES])
def test_modelopt_on_cupy(scheme, dt):
    for label, x in inputs(dt):
        kw = {"g": MO.global_scale(np.abs(weight(dt=dt)).max(), "m")} \
            if scheme == "W4A16_NVFP4" else {"in_amax": 2.0} if scheme == "FP8" else {}
        ref = MO.quantize_tensor(x, dt, scheme, "m.weight", **kw)
        got = MO.quantize_tensor(cp.asarray(x), dt, scheme, "m.weight", **kw)
        assert list(got) == list(ref)
        for k in ref:
            assert np.array_equal(to_numpy(got[k]), ref[k]), (label, k)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nonfinite_refused_naming_the_tensor(bad):
    x = weight()
    x[4, 9] = bad
    for xs in (bits(x), x):
        for scheme in ("FP8_DYNAMIC", "W4A16_ASYM", "NVFP4A16"):
            with pytest.raises(ValueError, match="'m.weight' holds NaN or inf"):
                CT.quantize_tensor(cp.asarray(xs), "BF16", scheme, 32, np.float32(1),
                                   "m.weight")


def test_wrong_input_named():
    with pytest.raises(TypeError, match="fp8_rows: x must be a 2-D cupy array"):
        G.fp8_rows(cp.zeros(8, np.float32), np.float32([1]), False)
    with pytest.raises(ValueError, match="fp4_rows: row length 64 and group 24"):
        G.fp4_rows(cp.zeros((2, 64), np.float32), np.ones((2, 2), np.float32), 24, False)
    with pytest.raises(ValueError, match="int_rows: scales has 3 values, expected 4"):
        G.int_rows(cp.zeros((2, 64), np.float32), np.ones(3, np.float32),
                   np.zeros(4, np.float32), 32, -8, 7, False)


def _llama_dir(path):
    """A two-layer random Llama directory in BF16 (q/k/v and gate/up: fused
    sets for the NVFP4 global scales)."""
    os.makedirs(path)
    h, i, v = 64, 96, 32
    shapes = [("model.embed_tokens.weight", (v, h))]
    for k in range(2):
        p = f"model.layers.{k}."
        shapes += [(p + "input_layernorm.weight", (h,)), (p + "self_attn.q_proj.weight", (h, h)),
                   (p + "self_attn.k_proj.weight", (h // 2, h)),
                   (p + "self_attn.v_proj.weight", (h // 2, h)),
                   (p + "self_attn.o_proj.weight", (h, h)), (p + "mlp.gate_proj.weight", (i, h)),
                   (p + "mlp.up_proj.weight", (i, h)), (p + "mlp.down_proj.weight", (h, i))]
    shapes += [("model.norm.weight", (h,)), ("lm_head.weight", (v, h))]
    rng = np.random.default_rng(3)
    with SafetensorsWriter(os.path.join(path, "model.safetensors"),
                           [(n, "BF16", s) for n, s in shapes]) as w:
        for n, s in shapes:
            w.write(n, bits((rng.standard_normal(s) * 0.02).astype(np.float32)))
    with open(os.path.join(path, "config.json"), "w") as fh:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                   "hidden_size": h, "intermediate_size": i, "num_hidden_layers": 2,
                   "vocab_size": v, "num_attention_heads": 4, "num_key_value_heads": 2,
                   "torch_dtype": "bfloat16"}, fh)


DIR_CASES = [("compressed-tensors", s) for s in ("FP8_DYNAMIC", "W4A16_ASYM", "NVFP4A16")] + \
    [("modelopt", "W4A16_NVFP4")]


@pytest.mark.parametrize("fmt,scheme", DIR_CASES, ids=[f"{f}-{s}" for f, s in DIR_CASES])
def test_model_directory_on_the_gpu_is_the_cpus(tmp_path, fmt, scheme):
    """``quantize_model(..., device="gpu")`` writes the CPU's files, byte for
    byte (the weights' loops on the device, the rest unchanged)."""
    _llama_dir(tmp_path / "src")
    kw = {"group_size": 32} if scheme == "W4A16_ASYM" else {}
    for device in ("cpu", "gpu"):
        engines.quantize_model(tmp_path / "src", tmp_path / device, scheme, fmt=fmt,
                               device=device, **kw)
    names = sorted(os.listdir(tmp_path / "cpu"))
    assert names == sorted(os.listdir(tmp_path / "gpu")) and "model.safetensors" in names
    for n in names:
        with open(tmp_path / "cpu" / n, "rb") as a, open(tmp_path / "gpu" / n, "rb") as b:
            assert a.read() == b.read(), n
