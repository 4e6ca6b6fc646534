"""Bad input gets a clear TypeError / ValueError naming the argument."""
import numpy as np
import pytest

import quantcore as qc

X = np.linspace(-1, 1, 24, dtype=np.float32).reshape(2, 3, 4)


class FakeCupy:
    """Stands in for a cupy.ndarray (type module 'cupy')."""


FakeCupy.__module__ = "cupy._core.core"

CASES = [
    # (call, exception, message fragment)
    (lambda: qc.fake_quant(X.astype(np.int32), 0.1, 0, 0, 255), TypeError, "floating dtype"),
    (lambda: qc.fake_quant(X.astype(bool), 0.1, 0, 0, 255), TypeError, "floating dtype"),
    (lambda: qc.fake_quant(X.astype(np.complex64), 0.1, 0, 0, 255), TypeError, "floating dtype"),
    (lambda: qc.fake_quant(np.array(["a"], dtype=object), 0.1, 0, 0, 255), TypeError, "floating"),
    (lambda: qc.fake_quant(X, 0.1, 0, 10, 10), ValueError, "quant_min must be < quant_max"),
    (lambda: qc.fake_quant(X, 0.1, 0, 10, 5), ValueError, "quant_min must be < quant_max"),
    (lambda: qc.fake_quant(X, 0.1, 0, 0.5, 5), TypeError, "quant_min must be an integer"),
    (lambda: qc.fake_quant(X, 0.0, 0, 0, 255), ValueError, "scale must be finite and > 0"),
    (lambda: qc.fake_quant(X, -1.0, 0, 0, 255), ValueError, "scale must be finite and > 0"),
    (lambda: qc.fake_quant(X, np.nan, 0, 0, 255), ValueError, "scale must be finite and > 0"),
    (lambda: qc.fake_quant(X, np.inf, 0, 0, 255), ValueError, "scale must be finite and > 0"),
    (lambda: qc.fake_quant(X, 1e-45, 0, 0, 255), ValueError, "scale"),
    (lambda: qc.fake_quant(X, 0.1, 300, 0, 255), ValueError, "zero_point must lie in"),
    (lambda: qc.fake_quant(X, 0.1, 1.5, 0, 255), ValueError, "zero_point must be integral"),
    (lambda: qc.fake_quant(X, 0.1, np.nan, 0, 255, zero_point_add="before_rounding"),
     ValueError, "zero_point must be finite"),
    (lambda: qc.fake_quant(X, 0.1, 0, 0, 255, axis=3), ValueError, "axis 3 is out of range"),
    (lambda: qc.fake_quant(X, 0.1, 0, 0, 255, axis=-4), ValueError, "out of range"),
    (lambda: qc.fake_quant(X, 0.1, 0, 0, 255, axis=1.0), TypeError, "axis must be an int"),
    (lambda: qc.fake_quant(X, [0.1, 0.2], 0, 0, 255, axis=1), ValueError, "3 values"),
    (lambda: qc.fake_quant(X, [0.1, 0.2, 0.3], [0, 1], 0, 255, axis=1), ValueError, "zero_point"),
    (lambda: qc.fake_quant(X, [0.1, 0.2], 0, 0, 255), ValueError, "single value"),
    (lambda: qc.fake_quant(X, 0.1, 0, 0, 255, rounding="up"), ValueError, "rounding must be"),
    (lambda: qc.fake_quant(X, 0.1, 0, 0, 255, out=np.empty((2, 3), np.float32)), ValueError,
     "out has shape"),
    (lambda: qc.fake_quant(X, 0.1, 0, 0, 255, out=np.empty(X.shape, np.float64)), TypeError,
     "out has dtype"),
    (lambda: qc.fake_quant(X, 0.1, 0, 0, 255, out=[0] * 24), TypeError, "out must be a numpy"),
    (lambda: qc.fake_quant(X, "a", 0, 0, 255), TypeError, "scale"),
    (lambda: qc.fake_quant(FakeCupy(), 0.1, 0, 0, 255), NotImplementedError, "fake_quant"),
    (lambda: qc.minmax(FakeCupy()), NotImplementedError, "minmax"),
    (lambda: qc.minmax(X, axis=5), ValueError, "axis 5"),
    (lambda: qc.minmax(X, nan_policy="skip"), ValueError, "nan_policy"),
    (lambda: qc.minmax(np.arange(3)), TypeError, "floating dtype"),
    (lambda: qc.quantize(X, 0.1, 0, 0, 255, dtype=np.int8), ValueError, "cannot hold"),
    (lambda: qc.quantize(X, 0.1, 0, 0, 255, dtype=np.float32), TypeError, "integer dtype"),
    (lambda: qc.dequantize(np.zeros(3, dtype=np.complex64), 0.1, 0), TypeError, "q must be"),
    (lambda: qc.fake_quant_amax(X, -1.0), ValueError, "amax must be finite and >= 0"),
    (lambda: qc.fake_quant_amax(X, 1.0, 1), ValueError, "num_bits must be in 2..16"),
    (lambda: qc.fake_quant_amax(X, 1.0, unsigned=True), ValueError, "negative values"),
    (lambda: qc.fake_quant_nudged(X, 0.5, 1.0, 0.1), ValueError, "contain 0"),
    (lambda: qc.fake_quant_nudged(X, -1, 1.0, 0.1, formula="tf"), ValueError, "formula"),
    (lambda: qc.ste_backward(X, np.ones((2, 3), bool)), ValueError, "mask has shape"),
    (lambda: qc.ste_backward(X, np.ones(X.shape, np.float32)), TypeError, "mask must be bool"),
    (lambda: qc.fake_quant_with_mask(X, 0.1, 0, 0, 255, mask_dtype=np.int32), TypeError,
     "mask_dtype"),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_bad_input(case):
    call, exc, fragment = CASES[case]
    with pytest.raises(exc, match=fragment.replace("(", r"\(").replace(".", r"\.")):
        call()


def test_read_only_out_is_refused():
    out = np.empty_like(X)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out is read-only"):
        qc.fake_quant(X, 0.1, 0, 0, 255, out=out)


def test_big_endian_input_is_converted():
    xb = X.astype(">f4")
    assert np.array_equal(qc.fake_quant(xb, 0.1, 0, 0, 255), qc.fake_quant(X, 0.1, 0, 0, 255))
    lo, hi = qc.minmax(xb)
    assert lo == X.min() and hi == X.max()


def test_input_is_never_modified():
    x = X.copy()
    qc.fake_quant(x, 0.1, 0, 0, 255)
    qc.fake_quant_with_mask(x, [0.1, 0.2, 0.3], 0, 0, 255, axis=1)
    qc.minmax(x, axis=2)
    assert np.array_equal(x, X)
