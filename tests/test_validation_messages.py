"""Bad input to the core API: the error is a ValueError / TypeError whose
message names the function, the argument and the value received (issue 2).

tests/test_validation.py checks a fragment of each message; this file checks
that every message carries all three parts, for every kind of bad input the
issue lists (non-float dtype, qmin >= qmax, scale <= 0 or non-finite, zero
point outside [qmin, qmax], axis out of range, channel-count mismatch, shape
of ``out``), across the public functions.
"""
import re

import numpy as np
import pytest

import quantcore as qc

X = np.linspace(-1, 1, 24, dtype=np.float32).reshape(2, 3, 4)
Q = np.zeros((2, 3), np.int32)

# (id, call, exception, function name, argument name, value received as printed)
CASES = [
    # non-float dtype
    ("x int", lambda: qc.fake_quant(X.astype(np.int16), 0.1, 0, 0, 255), TypeError,
     "fake_quant", "x", "int16"),
    ("x str", lambda: qc.fake_quant_with_mask(["a"], 0.1, 0, 0, 255), TypeError,
     "fake_quant_with_mask", "x", "<U1"),
    ("minmax int", lambda: qc.minmax(np.arange(4)), TypeError, "minmax", "x", "int64"),
    ("quantize bool", lambda: qc.quantize(X > 0, 0.1, 0, 0, 255), TypeError, "quantize", "x",
     "bool"),
    ("nudged int", lambda: qc.fake_quant_nudged(np.arange(3), -1, 1, 0.1), TypeError,
     "fake_quant_nudged", "x", "int64"),
    ("amax int", lambda: qc.fake_quant_amax(np.arange(3), 1.0), TypeError, "fake_quant_amax",
     "x", "int64"),
    ("ste grad int", lambda: qc.ste_backward(np.arange(3), np.ones(3, bool)), TypeError,
     "ste_backward", "grad", "int64"),
    ("dequantize complex", lambda: qc.dequantize(np.zeros(3, np.complex64), 0.1, 0), TypeError,
     "dequantize", "q", "complex64"),
    # the integer range
    ("qmin == qmax", lambda: qc.fake_quant(X, 0.1, 0, 7, 7), ValueError, "fake_quant",
     "quant_min", "quant_min=7, quant_max=7"),
    ("qmin > qmax", lambda: qc.quantize(X, 0.1, 0, 9, 2), ValueError, "quantize", "quant_max",
     "quant_min=9, quant_max=2"),
    ("qmin float", lambda: qc.fake_quant(X, 0.1, 0, 0.5, 255), TypeError, "fake_quant",
     "quant_min", "0.5"),
    ("qmax str", lambda: qc.fake_quant(X, 0.1, 0, 0, "255"), TypeError, "fake_quant",
     "quant_max", "'255'"),
    # scale
    ("scale 0", lambda: qc.fake_quant(X, 0.0, 0, 0, 255), ValueError, "fake_quant", "scale",
     "0.0"),
    ("scale < 0", lambda: qc.quantize(X, -0.5, 0, 0, 255), ValueError, "quantize", "scale",
     "-0.5"),
    ("scale nan", lambda: qc.fake_quant_with_mask(X, np.nan, 0, 0, 255), ValueError,
     "fake_quant_with_mask", "scale", "nan"),
    ("scale inf per channel", lambda: qc.fake_quant(X, [0.1, np.inf, 0.2], 0, 0, 255, axis=1),
     ValueError, "fake_quant", "scale", "inf"),
    ("scale str", lambda: qc.fake_quant(X, "a", 0, 0, 255), TypeError, "fake_quant", "scale",
     "'a'"),
    ("nudged scale", lambda: qc.fake_quant_nudged(X, -1, 1, -0.25), ValueError,
     "fake_quant_nudged", "scale", "-0.25"),
    ("amax negative", lambda: qc.fake_quant_amax(X, -3.0), ValueError, "fake_quant_amax",
     "amax", "-3.0"),
    ("amax nan", lambda: qc.fake_quant_amax(X, np.nan), ValueError, "fake_quant_amax", "amax",
     "nan"),
    # zero point
    ("zp outside", lambda: qc.fake_quant(X, 0.1, 300, 0, 255), ValueError, "fake_quant",
     "zero_point", "300"),
    ("zp outside per channel", lambda: qc.quantize(X, 0.1, [0, -1, 3], 0, 255, axis=1),
     ValueError, "quantize", "zero_point", "-1"),
    ("zp fractional", lambda: qc.fake_quant(X, 0.1, 2.5, 0, 255), ValueError, "fake_quant",
     "zero_point", "2.5"),
    ("zp nan float", lambda: qc.fake_quant(X, 0.1, np.nan, 0, 255,
                                          zero_point_add="before_rounding"), ValueError,
     "fake_quant", "zero_point", "nan"),
    ("zp with none", lambda: qc.fake_quant(X, 0.1, 1, 0, 255, zero_point_add="none"),
     ValueError, "fake_quant", "zero_point", "1"),
    # axis
    ("axis too big", lambda: qc.fake_quant(X, [0.1] * 3, 0, 0, 255, axis=3), ValueError,
     "fake_quant", "axis", "3"),
    ("axis too small", lambda: qc.minmax(X, axis=-4), ValueError, "minmax", "axis", "-4"),
    ("axis float", lambda: qc.fake_quant_amax(X, 1.0, axis=1.0), TypeError, "fake_quant_amax",
     "axis", "1.0"),
    ("axis bool", lambda: qc.minmax(X, axis=True), TypeError, "minmax", "axis", "True"),
    ("dequantize axis", lambda: qc.dequantize(Q, [1.0] * 3, 0, axis=2), ValueError,
     "dequantize", "axis", "2"),
    # channel counts
    ("scale channels", lambda: qc.fake_quant(X, [0.1, 0.2], 0, 0, 255, axis=1), ValueError,
     "fake_quant", "scale", "(2,)"),
    ("zp channels", lambda: qc.fake_quant_with_mask(X, [0.1] * 4, [0, 1], 0, 255, axis=2),
     ValueError, "fake_quant_with_mask", "zero_point", "(2,)"),
    ("amax channels", lambda: qc.fake_quant_amax(X, [1.0, 2.0], axis=1), ValueError,
     "fake_quant_amax", "amax", "(2,)"),
    ("nudged channels", lambda: qc.fake_quant_nudged(X, [-1] * 2, [1] * 2, [0.1] * 2, axis=2),
     ValueError, "fake_quant_nudged", "nudged_min", "(2,)"),
    ("dequantize channels", lambda: qc.dequantize(Q, [1.0, 2.0], 0, axis=1), ValueError,
     "dequantize", "scale", "(2,)"),
    ("per tensor given many", lambda: qc.fake_quant(X, [0.1, 0.2], 0, 0, 255), ValueError,
     "fake_quant", "scale", "(2,)"),
    # out / mask
    ("out shape", lambda: qc.fake_quant(X, 0.1, 0, 0, 255, out=np.empty((3, 2), np.float32)),
     ValueError, "fake_quant", "out", "(3, 2)"),
    ("out dtype", lambda: qc.fake_quant_amax(X, 1.0, out=np.empty(X.shape, np.float16)),
     TypeError, "fake_quant_amax", "out", "float16"),
    ("out list", lambda: qc.fake_quant_nudged(X, -1, 1, 0.1, out=[0.0] * 24), TypeError,
     "fake_quant_nudged", "out", "list"),
    ("ste out shape", lambda: qc.ste_backward(X, X > 0, out=np.empty(3, np.float32)),
     ValueError, "ste_backward", "out", "(3,)"),
    ("mask_out shape", lambda: qc.fake_quant_with_mask(X, 0.1, 0, 0, 255,
                                                       mask_out=np.empty(5, bool)),
     ValueError, "fake_quant_with_mask", "mask_out", "(5,)"),
    ("ste mask shape", lambda: qc.ste_backward(X, np.ones(5, bool)), ValueError,
     "ste_backward", "mask", "(5,)"),
    ("ste mask dtype", lambda: qc.ste_backward(X, np.ones(X.shape, np.int16)), TypeError,
     "ste_backward", "mask", "int16"),
    # choices and other arguments
    ("rounding", lambda: qc.fake_quant(X, 0.1, 0, 0, 255, rounding="nearest"), ValueError,
     "fake_quant", "rounding", "'nearest'"),
    ("scale_op", lambda: qc.quantize(X, 0.1, 0, 0, 255, scale_op="mul"), ValueError,
     "quantize", "scale_op", "'mul'"),
    ("zero_point_add", lambda: qc.fake_quant(X, 0.1, 0, 0, 255, zero_point_add="pre"),
     ValueError, "fake_quant", "zero_point_add", "'pre'"),
    ("nonfinite", lambda: qc.fake_quant(X, 0.1, 0, 0, 255, nonfinite="zero"), ValueError,
     "fake_quant", "nonfinite", "'zero'"),
    ("formula", lambda: qc.fake_quant_nudged(X, -1, 1, 0.1, formula="tf"), ValueError,
     "fake_quant_nudged", "formula", "'tf'"),
    ("nan_policy", lambda: qc.minmax(X, nan_policy="skip"), ValueError, "minmax", "nan_policy",
     "'skip'"),
    ("num_bits", lambda: qc.fake_quant_amax(X, 1.0, 17), ValueError, "fake_quant_amax",
     "num_bits", "17"),
    ("quantize dtype small", lambda: qc.quantize(X, 0.1, 0, 0, 255, dtype=np.int8), ValueError,
     "quantize", "dtype", "int8"),
    ("quantize dtype float", lambda: qc.quantize(X, 0.1, 0, 0, 255, dtype=np.float32),
     TypeError, "quantize", "dtype", "float32"),
    ("dequantize dtype", lambda: qc.dequantize(Q, 0.1, 0, dtype=np.int32), TypeError,
     "dequantize", "dtype", "int32"),
    ("mask_dtype", lambda: qc.fake_quant_with_mask(X, 0.1, 0, 0, 255, mask_dtype=np.int32),
     TypeError, "fake_quant_with_mask", "mask_dtype", "int32"),
    ("threads 0", lambda: qc.set_num_threads(0), ValueError, "set_num_threads", "n", "0"),
    ("threads float", lambda: qc.set_num_threads(2.0), TypeError, "set_num_threads", "n",
     "2.0"),
]

# Gaps in quantcore/ops.py (not fixed here: the file has another owner).
CASES += [
    # dequantize's scale and zero point (once used as given)
    ("dequantize scale 0", lambda: qc.dequantize(Q, 0.0, 0), ValueError, "dequantize", "scale",
     "0.0"),
    ("dequantize scale < 0", lambda: qc.dequantize(Q, -1.0, 0), ValueError, "dequantize",
     "scale", "-1.0"),
    ("dequantize scale nan", lambda: qc.dequantize(Q, np.nan, 0), ValueError, "dequantize",
     "scale", "nan"),
    ("dequantize zp nan", lambda: qc.dequantize(Q, 1.0, np.nan), ValueError, "dequantize",
     "zero_point", "nan"),
    # an unknown dtype name (once numpy's own message, naming neither)
    ("quantize dtype name", lambda: qc.quantize(X, 0.1, 0, 0, 255, dtype="foo"), TypeError,
     "quantize", "dtype", "'foo'"),
]


def _check(call, exc, func, arg, value):
    with pytest.raises(exc) as info:
        call()
    msg = str(info.value)
    assert re.search(rf"\b{re.escape(func)}\b", msg), f"function not named: {msg!r}"
    assert re.search(rf"\b{re.escape(arg)}\b", msg), f"argument {arg!r} not named: {msg!r}"
    assert value in msg, f"value received {value!r} not in {msg!r}"


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_message_names_function_argument_and_value(case):
    _check(*case[1:])
