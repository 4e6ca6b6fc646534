"""FP8 casts of float64 input: quantcore's single rounding and ml_dtypes'.

Where it comes from: ml_dtypes' float8 cast tests (``ml_dtypes/tests``:
casts from float64 compared with the library's ``astype``).  ml_dtypes 0.6
casts float64 through float32, so a float64 value just off a tie of the FP8
grid lands on the tie and goes to even; ``cast_fp8`` rounds float64 once by
default (``float64="direct"``) and reproduces ml_dtypes with
``float64="via_float32"``.  Every FP8 format, every pair of adjacent finite
codes, the values one float64 ulp either side of their midpoint.
"""
import numpy as np
import pytest

import quantcore as qc

ml_dtypes = pytest.importorskip("ml_dtypes")

#: ml_dtypes' dtype of every FP8 format of the table (formats._common.MINIFLOATS)
_FORMATS = {name: getattr(ml_dtypes, "float8_" + name) for name in qc.formats.FP8_FORMATS}


def _near_ties(fmt):
    """(x below each midpoint, x above it, the lower code, the upper code)."""
    codes = np.arange(256, dtype=np.uint8)
    vals = codes.view(_FORMATS[fmt]).astype(np.float64)
    keep = np.isfinite(vals) & (vals > 0)
    order = np.argsort(vals[keep])
    v, c = vals[keep][order], codes[keep][order]
    mid = (v[:-1] + v[1:]) / 2  # exact in float64
    below, above = np.nextafter(mid, -np.inf), np.nextafter(mid, np.inf)
    x = np.concatenate([below, above, -below, -above])
    return x, c[:-1], c[1:]


@pytest.mark.parametrize("fmt", sorted(_FORMATS))
def test_float64_direct_rounds_once(fmt):
    x, lo, hi = _near_ties(fmt)
    n = lo.size
    got = qc.cast_fp8(x, fmt, overflow="nonsat", nan="ml_dtypes")
    sign = 0x80
    assert np.array_equal(got[:n], lo) and np.array_equal(got[n:2 * n], hi)
    assert np.array_equal(got[2 * n:3 * n], lo | sign)
    assert np.array_equal(got[3 * n:], hi | sign)


@pytest.mark.parametrize("fmt", sorted(_FORMATS))
def test_float64_via_float32_is_ml_dtypes(fmt):
    x, _, _ = _near_ties(fmt)
    rng = np.random.default_rng(11)
    wide = rng.standard_normal(20000) * np.exp2(rng.integers(-30, 20, 20000))
    x = np.concatenate([x, wide, [0.0, -0.0, np.inf, -np.inf, np.nan, 1e300, -1e-300]])
    want = x.astype(_FORMATS[fmt]).view(np.uint8)
    got = qc.cast_fp8(x, fmt, overflow="nonsat", nan="ml_dtypes", float64="via_float32")
    assert np.array_equal(got, want)
    # the default differs from ml_dtypes exactly on the values float32 moves onto a tie
    direct = qc.cast_fp8(x, fmt, overflow="nonsat", nan="ml_dtypes")
    with np.errstate(over="ignore"):
        moved = x.astype(np.float32).astype(np.float64) != x
    assert (direct != want).any() and not (direct != want)[~moved].any()


def test_float64_option_is_checked():
    with pytest.raises(ValueError, match="float64 must be"):
        qc.cast_fp8(np.zeros(2), "e4m3fn", float64="twice")
