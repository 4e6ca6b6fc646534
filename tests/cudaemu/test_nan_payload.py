"""No result of quantcore's GPU path depends on an input NaN's payload.

ptxas compiles NaN-propagating selects (``a >= b || a != a ? a : b``) to
``FMNMX.NAN``, which returns the canonical NaN 0x7fffffff, not the input
NaN (60 sites in NVRTC 12.9's SASS of quantcore's modules, sm_90:
``python -m quantcore_gpu.toolchain_check -v``); the emulator cannot see
which C++ select becomes one (``?:`` is not overloadable, a select of
wrapper floats is a bit copy), so it copies the bits, as x86 does.  Where
the two differ, the result is a NaN whose payload the device replaced.  This
test holds the project to the property that makes that difference harmless:
every output, integer codes, scales, zero points, flags and counts included,
is the same bit for bit whatever the payload of the input's NaNs (their
sign kept: FP8 NaN codes take the input's sign, tests/test_gpu_nan_codes.py),
and a NaN lane is a NaN (compared as NaN, never by its bits).
"""
import numpy as np
import pytest

import cupy as cp
from quantcore import formats as F
from quantcore import mx as MX
from quantcore_gpu import kernels as G

pytestmark = pytest.mark.gpu

#: NaN payloads (quiet bit and below) with the sign kept: numpy's default,
#: CUDA's canonical one, another quiet one and a signalling one
PAYLOADS = (0x400000, 0x7FFFFF, 0x400123, 0x000001)


def _x(payload, n=67):
    x = np.linspace(-3, 3, n).astype(np.float32)
    u = x.view(np.uint32)
    u[[0, 5, 17]] = 0xFF800000 | payload      # negative NaNs
    u[[2, 9, n - 1]] = 0x7F800000 | payload   # positive NaNs
    return x


def _outputs(x):
    """Every output of the GPU entry points that meet the NaNs, on the host."""
    out = {}
    xd = cp.asarray(x)
    lo, hi, fl = G.minmax_channels(xd, 1, 1, x.size)
    G.minmax_finish(lo, hi, fl)
    out["minmax"] = (lo, hi, fl)
    for policy in ("skip", "propagate"):
        for observer in ("minmax", "moving_average"):
            state = G.ObserverState(1, np.float32)
            yd, md = cp.empty_like(xd), cp.empty(x.size, cp.uint8)
            G.observe(xd, 1, 1, x.size, state, observer=observer, averaging_constant=0.25,
                      nan_policy=policy, qscheme="affine", quant_min=0, quant_max=255)
            G.ew(G.FAMILIES["affine"], xd, yd, md, 1, 1, x.size, state.qp, 0, 255, 0)
            out[f"observe {policy} {observer}"] = (
                state.min_val, state.max_val, state.scale, state.zero_point, state.counts,
                yd, md)
    out["cast_fp8"] = (F.cast_fp8(xd, "e4m3fn"),)
    for recipe in ("modelopt", "torchao"):
        out[f"fp8 {recipe}"] = (F.fp8_fake_quant(xd, 3.0, recipe=recipe),)
    x64 = cp.asarray(np.resize(x, 64))
    for elem in ("e4m3", "e2m1"):
        out[f"mx {elem}"] = tuple(MX.mx_quantize(x64, elem))
    return {k: [cp.asnumpy(a) if isinstance(a, cp.ndarray) else np.asarray(a) for a in v]
            for k, v in out.items()}


def _same_but_nan_payload(a, b, what):
    assert a.dtype == b.dtype and a.shape == b.shape, what
    if a.dtype.kind == "f":
        na, nb = np.isnan(a), np.isnan(b)
        assert np.array_equal(na, nb), f"{what}: NaN lanes differ"
        a, b = a[~na], b[~nb]
        assert np.array_equal(a.view(f"u{a.itemsize}"), b.view(f"u{b.itemsize}")), what
    else:
        assert np.array_equal(a, b), what


def test_no_output_depends_on_an_input_nans_payload():
    ref = _outputs(_x(PAYLOADS[0]))
    for p in PAYLOADS[1:]:
        got = _outputs(_x(p))
        assert got.keys() == ref.keys()
        for k in ref:
            for i, (a, b) in enumerate(zip(ref[k], got[k])):
                _same_but_nan_payload(a, b, f"{k} output {i}, payload {p:#x}")
