"""ONNX Runtime 1.32 ``onnxruntime.quantization``, bit for bit, streaming.

Framework-free twins of ONNX Runtime's quantization numerics
(``quant_utils.py``, ``calibrate.py``; spec: the project's ONNX Runtime specification), on
numpy arrays, without onnxruntime installed.  ORT is host code, so this
layer takes **numpy input only**: a cupy array is refused with a TypeError.

Numerics (ORT 1.32 on float32; ``rint`` rounds half to even)
-------------------------------------------------------------
``compute_scale_zp(rmin, rmax, qmin, qmax, symmetric, min_real_range)``
    ``lo = min(rmin, 0)``, ``hi = max(rmax, 0)`` (in T, the range dtype);
    ``hi = max(hi, T(lo + T(mrr)))``; symmetric: ``lo, hi = -m, m`` with
    ``m = max(|lo|, |hi|)``; ``s64 = (f64(hi) - f64(lo)) / (qmax - qmin)``;
    NaN -> ``AssertionError("scale issue")``; ``s64 < tiny(float32)`` (float16:
    ``T(s64) < 2**-24``) -> ``(zp 0, scale 1)``; else ``scale = T(s64)`` and
    ``zp = rint((qmin + qmax) / 2)`` (symmetric) or ``rint(qmin - f64(lo) / s64)``
    with the *unrounded* float64 scale.  ``version="1.27"`` (every ORT before
    1.28) subtracts in T: ``s64 = f64(T(hi - lo)) / (qmax - qmin)``.
``compute_scale_zp_float8(E4M3FN, std)``: ``scale = T(std / 100.05772)``
    (``np.std`` of the 254 finite float8 values in float32), zp float8 0.
``quantize_nparray(qType, x, scale, zp)``: ``clip(rint(f32(x) / scale) + zp,
    qmin, qmax)`` in the promoted dtype (a float64 scale divides in float64),
    NaN -> 0 through the float->int cast; float 8 through ``saturate_cast``.
``quantize_linear`` / ``dequantize_linear``: ORT's CPU kernels:
    ``q = sat(rint(f32(x) / f32(scale)) + zp)`` (a division, never the
    reciprocal), NaN -> qmin, +-inf and |x/scale| beyond int32 saturate;
    per tensor, per axis, blocked; ``x = f32(int32(q) - zp) * scale``.
Calibrators (the four of ``calibrate.py``):
    MinMax: per batch nanmin / nanmax, over the batches of one call
    ``nanmin`` / ``nanmax`` (or ``nanmean`` with ``moving_average``), across
    calls ``min``/``max`` or the EMA ``old + c * (new - old)`` in float32.
    Entropy / Percentile / Distribution: ``np.histogram`` of the values over
    ``(-t, t)``, ``t = max(|nanmin|, |nanmax|)`` (Percentile symmetric: of
    ``|x|`` over ``(min|x|, max|x|)``), grown by ORT's rules when a later call
    has a larger range; the thresholds as :class:`HistogramCollector`
    documents (KL search in float32, cumulative percentile, mean / std).

Streaming
---------
ORT keeps every batch of a ``collect_data`` call and stacks them before it
builds a histogram.  Here nothing is stored but the statistics
(``O(tensors x bins)``):

* ``passes=1`` (default): each batch is **one ``collect_data`` call** (bit
  for bit what ORT computes when it is called once per batch, e.g. with
  ``CalibStridedMinMax=1``), in one pass;
* ``passes=2``: the whole ``collect_data(batches)`` is **one call**, as ORT's
  default single call computes it: a range pass over the batches, then a
  histogram pass with that range (the data is read twice, so it must be a
  sequence, a callable returning a fresh iterable, or have ``rewind()``).

MinMax keeps one ``(C,)`` reduction per batch and is always exact for a
whole call.  The histograms are counted by the C kernel
``quantcore/_cpu/_hist.pyx`` (numpy's bin rule, ``qc_np_histogram.h``);
every threshold search runs on the host with numpy, so its float32 sums and
logarithms are numpy's own.

Threads: a calibrator's ``executor`` (:func:`tensor_executor`) reduces the
tensors of a batch in parallel, each with a one-thread kernel; the counts
and ranges do not depend on it nor on the kernels' thread count.
:func:`kernel_threads` limits the calling thread's kernels (an OpenMP team
per tensor waits for its threads whenever the cores are busy elsewhere).

ORT's surprises (spec section 18) and what this module does
------------------------------------------------------------
1.  Default Entropy (128 / 128) equals MinMax over the call: reproduced;
    ``num_bins`` / ``num_quantized_bins`` exposed.
2.  KL windows one bin asymmetric, ``q`` filled over zero bins and truncated,
    remainder bins left empty, float32 KL with ``0 log 0 = inf``: reproduced.
3.  Results depend on how batches are grouped into calls: ``passes`` (above).
4.  Symmetric Percentile starts its histogram at ``min|x|`` of the first call;
    later smaller values are dropped; growth edges float64, stored float32:
    reproduced.
5.  "Symmetric" Percentile clipped to the signed min / max (asymmetric
    result): reproduced.
6.  Percentile's ``TensorData.hist`` / ``bins`` are the first two counts:
    reproduced (``compute_data``; harmless).
7.  ``moving_average`` is an arithmetic mean within a call, an EMA across
    calls: reproduced; ``ema_per_batch=True`` makes every batch an EMA step.
8.  ``max_intermediate_outputs`` discards buffered batches: **not**
    reproduced (every ``k`` batches are merged as one call, as ORT 1.17
    did); ``ort_bug_max_intermediate=True`` reproduces the loss.
9.  ReduceMin / ReduceMax with NaN is implementation-defined in ORT (SIMD
    lanes lose values): not reproducible portably; each batch's range is its
    ``nanmin`` / ``nanmax`` (equal to ORT's for NaN-free batches).
10. Per-channel ranges cannot be merged across calls in ORT (ValueError)
    nor consumed by its quantizer: merged channel-wise here; never handed to
    ORT (``quantcore.onnx`` refuses them).
11. Degenerate range -> zp 0 even for unsigned symmetric; per-tensor zp from
    the float64 scale, blocked zp from the float32 scale: reproduced.
12. INT8 reduce_range = [-64, 64]; INT4 symmetric = [-8, 7]: reproduced.
13. ``write_calibration_table`` writes ``max(highest, lowest)``: reproduced;
    ``absmax=True`` writes the correct ``max(|highest|, |lowest|)``.
14. NaN -> 0 in ``quantize_nparray`` (cast), qmin in the kernel
    (``quantize_linear``): both reproduced where ORT has them.
15. ORT's float 8 non-saturating overflow bugs: not reproduced;
    ``quantize_linear(saturate=0)`` follows the ONNX spec (ml_dtypes cast).
16. The weight scale silently enlarged for an int32 bias:
    :func:`adjust_weight_scale_for_int32_bias`.
17. A float16 range gives a float16 scale; float16 QuantizeLinear divides in
    float32 (ORT's kernel): reproduced.
18. Symmetric Percentile: a call after the first in which a tensor is empty
    (a dynamic shape with a zero dimension) fails in ORT (``np.nanmax`` of
    nothing: "zero-size array to reduction operation fmax"), e.g. with
    ``CalibStridedMinMax=1``: **not** reproduced; the empty call adds
    nothing to that tensor's histogram, minimum or maximum.

Also: a batch's min or max that is a zero gets numpy's sign (numpy's choice
between ``-0.0`` and ``+0.0`` when both occur is asked of numpy itself); in
``passes=2`` the sign of such a zero over several batches is numpy's per
batch, combined with Python's ``min`` (it changes no scale or zero point).
"""
import contextlib
import enum
import json
import numbers
import os
import tempfile
import threading
import warnings

import numpy as np

from ... import _arrays as A
from ..._cpu import _hist as H
from ..._cpu import _kernels as K
from ..._cpu.threads import effective_n_threads

__all__ = [
    "QuantType", "QuantFormat", "CalibrationMethod", "TensorData", "TensorsData",
    "get_qmin_qmax_for_qType", "get_qrange_for_qType", "compute_scale_zp",
    "snap_zero_point_to_uint8", "compute_scale_zp_float8", "compute_scale_zp_blocked",
    "quantize_nparray", "compute_data_quant_params", "quantize_data", "pack_bytes_to_4bit",
    "quantize_weight", "quantize_bias", "adjust_weight_scale_for_int32_bias",
    "quantize_linear", "dequantize_linear", "np_histogram", "smooth_distribution", "entropy",
    "HistogramCollector", "MinMaxCalibrater", "EntropyCalibrater", "PercentileCalibrater",
    "DistributionCalibrater", "create_calibrator", "kernel_threads", "tensor_executor",
    "save_tensors_data", "load_tensors_data", "write_calibration_table",
]

_F32 = np.float32
_F64 = np.float64
VERSIONS = ("1.32", "1.27")

_local = threading.local()


def _threads(n_elements):
    """Kernel threads for ``n_elements`` values: 1 inside :func:`kernel_threads`
    (1) -- e.g. in the worker threads of a calibrator's ``executor`` -- else
    quantcore's setting (``quantcore.set_num_threads`` / OpenMP)."""
    limit = getattr(_local, "threads", None)
    n = effective_n_threads(n_elements)
    return n if limit is None else min(n, limit)


@contextlib.contextmanager
def kernel_threads(n):
    """Limit this thread's histogram / min-max kernels to ``n`` OpenMP threads.

    Used where the cores are already busy (ONNX Runtime's inference, or
    tensors processed in parallel by a calibrator's ``executor``): an
    OpenMP team per tensor then mostly waits for its threads to be
    scheduled (measured: a 64 Ki-value min / max 23 ms on two threads
    instead of 11 us on one, on a loaded 2-core machine)."""
    old = getattr(_local, "threads", None)
    _local.threads = int(n)
    try:
        yield
    finally:
        _local.threads = old


def _one_kernel_thread():
    _local.threads = 1


def tensor_executor(max_workers=None):
    """A ``ThreadPoolExecutor`` for a calibrator's ``executor``: tensors of a
    batch are reduced in parallel, each by a one-thread kernel (the kernels
    release the GIL).  ``max_workers`` defaults to the usable cores."""
    from concurrent.futures import ThreadPoolExecutor
    if max_workers is None:
        max_workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
            (os.cpu_count() or 1)
    return ThreadPoolExecutor(max_workers=max(1, int(max_workers)),
                              thread_name_prefix="quantcore-calib",
                              initializer=_one_kernel_thread)


def _map_tensors(executor, fn, items):
    """``[fn(item) for item in items]``, on ``executor`` when there is one
    (the per-tensor work of a batch touches only that tensor's state)."""
    if executor is None or len(items) < 2:
        return [fn(item) for item in items]
    return list(executor.map(fn, items))

# ------------------------------------------------------------------ types
#: ONNX TensorProto element types used by the quantizer (name -> code)
TENSOR_TYPES = {"FLOAT": 1, "UINT8": 2, "INT8": 3, "UINT16": 4, "INT16": 5, "INT32": 6,
                "FLOAT16": 10, "FLOAT8E4M3FN": 17, "FLOAT8E4M3FNUZ": 18, "FLOAT8E5M2": 19,
                "FLOAT8E5M2FNUZ": 20, "UINT4": 21, "INT4": 22, "FLOAT4E2M1": 23, "UINT2": 25,
                "INT2": 26}
_TYPE_NAMES = {code: name for name, code in TENSOR_TYPES.items()}
_INT_TYPES = ("INT8", "UINT8", "INT16", "UINT16", "INT4", "UINT4")
_FLOAT8_TYPES = ("FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ")
#: full, symmetric and reduced integer ranges (QU's three tables)
_RANGE = {"INT8": (-128, 127), "UINT8": (0, 255), "INT16": (-32768, 32767),
          "UINT16": (0, 65535), "INT4": (-8, 7), "UINT4": (0, 15), "INT32": (-2**31, 2**31 - 1)}
#: the ranges of ORT's QuantizeLinear kernel: QU's and the 2-bit types (opset 25),
#: which ORT's quantization tools do not use
_LINEAR_RANGE = {**_RANGE, "INT2": (-2, 1), "UINT2": (0, 3)}
_SYMMETRIC_RANGE = {"INT8": (-127, 127), "INT16": (-32767, 32767)}
_REDUCED_RANGE = {"INT8": (-64, 64), "UINT8": (0, 127), "INT16": (-16384, 16384),
                  "UINT16": (0, 32767), "INT4": (-4, 3), "UINT4": (0, 7)}


class QuantType(enum.Enum):
    """ORT's ``QuantType`` (``str()`` and ``from_string`` as ORT spells them)."""
    QInt8 = 0
    QUInt8 = 1
    QFLOAT8E4M3FN = 2
    QInt16 = 3
    QUInt16 = 4
    QInt4 = 5
    QUInt4 = 6

    def __str__(self):
        return self.name

    @staticmethod
    def from_string(t):
        try:
            return QuantType[t]
        except KeyError:
            raise ValueError() from None  # ORT raises a bare ValueError

    @property
    def tensor_type(self):
        """The ONNX TensorProto element type code."""
        return TENSOR_TYPES[_QUANT_TYPE_NAMES[self]]


_QUANT_TYPE_NAMES = {QuantType.QInt8: "INT8", QuantType.QUInt8: "UINT8",
                     QuantType.QFLOAT8E4M3FN: "FLOAT8E4M3FN", QuantType.QInt16: "INT16",
                     QuantType.QUInt16: "UINT16", QuantType.QInt4: "INT4",
                     QuantType.QUInt4: "UINT4"}


class QuantFormat(enum.Enum):
    QOperator = 0
    QDQ = 1

    def __str__(self):
        return self.name


class CalibrationMethod(enum.Enum):
    MinMax = 0
    Entropy = 1
    Percentile = 2
    Distribution = 3


def type_name(qtype, func="onnxruntime"):
    """Canonical TensorProto name ("INT8", ...) of a quantization type given
    as a TensorProto code, a name ("INT8", "int8"), ORT's ``QuantType`` or
    its name ("QInt8")."""
    if isinstance(qtype, QuantType):
        return _QUANT_TYPE_NAMES[qtype]
    if isinstance(qtype, numbers.Integral) and not isinstance(qtype, bool):
        if int(qtype) in _TYPE_NAMES:
            return _TYPE_NAMES[int(qtype)]
    elif isinstance(qtype, str):
        if qtype.upper() in TENSOR_TYPES:
            return qtype.upper()
        if qtype in QuantType.__members__:
            return _QUANT_TYPE_NAMES[QuantType[qtype]]
    elif type(qtype).__name__ == "QuantType" and hasattr(qtype, "name"):  # ORT's own enum
        return _QUANT_TYPE_NAMES[QuantType[qtype.name]]
    raise ValueError(f"{func}: unknown quantization type {qtype!r} (expected one of "
                     f"{', '.join(_INT_TYPES + _FLOAT8_TYPES)}, a TensorProto code or a "
                     "QuantType)")


def _ml_dtypes(what):
    try:
        import ml_dtypes
    except ImportError:  # pragma: no cover - installed with onnx
        raise ImportError(f"{what} needs the ml_dtypes package (pip install ml_dtypes)") from None
    return ml_dtypes


#: the ml_dtypes names of the sub-byte and float 8 / float 4 types
_ML_DTYPE_NAMES = {"INT4": "int4", "UINT4": "uint4", "INT2": "int2", "UINT2": "uint2",
                   "FLOAT8E4M3FN": "float8_e4m3fn", "FLOAT8E4M3FNUZ": "float8_e4m3fnuz",
                   "FLOAT8E5M2": "float8_e5m2", "FLOAT8E5M2FNUZ": "float8_e5m2fnuz",
                   "FLOAT4E2M1": "float4_e2m1fn"}


def np_dtype(qtype):
    """numpy dtype of a quantized type (int4 / float 8 from ml_dtypes)."""
    name = type_name(qtype)
    plain = {"INT8": np.int8, "UINT8": np.uint8, "INT16": np.int16, "UINT16": np.uint16,
             "INT32": np.int32}
    if name in plain:
        return np.dtype(plain[name])
    md = _ml_dtypes(f"the {name} type")
    return np.dtype(getattr(md, _ML_DTYPE_NAMES[name]))


def _require_numpy(x, name, func):
    if A.is_cupy_array(x):
        raise TypeError(f"{func}: {name} is a cupy array; quantcore.compat.onnxruntime takes "
                        "numpy arrays only (ONNX Runtime's quantization is host code): use "
                        f"{name}.get()")
    return x


# --------------------------------------------------------------- qparams
def get_qmin_qmax_for_qType(qType, reduce_range=False, symmetric=False):  # noqa: N802
    """``(qmin, qmax)`` as 0-d arrays of the quantized dtype.  ``reduce_range``
    wins over ``symmetric``; symmetric INT8 / INT16 drop the lowest code
    (there is no symmetric table for the other types)."""
    name = type_name(qType, "get_qmin_qmax_for_qType")
    if name == "FLOAT8E4M3FN":
        raise NotImplementedError("This function is not implemented for float 8 as not needed.")
    if reduce_range:
        qrange = _REDUCED_RANGE.get(name)
    elif symmetric and name in _SYMMETRIC_RANGE:
        qrange = _SYMMETRIC_RANGE[name]
    else:
        qrange = _RANGE.get(name) if name != "INT32" else None
    if qrange is None:
        raise ValueError(f"Unexpected data type {TENSOR_TYPES[name]} requested. Only INT8, UINT8, "
                         "INT16, and UINT16 are supported.")
    dt = np_dtype(name)
    return np.array(qrange[0], dtype=dt), np.array(qrange[1], dtype=dt)


def get_qrange_for_qType(qType, reduce_range=False, symmetric=False):  # noqa: N802
    """``qmax - qmin`` in the quantized dtype."""
    qmin, qmax = get_qmin_qmax_for_qType(qType, reduce_range, symmetric)
    return qmax - qmin


def _range_array(v, func, name):
    _require_numpy(v, name, func)
    if not isinstance(v, (np.ndarray, np.generic)):
        raise TypeError(f"{func}: {name} must be a numpy array or numpy scalar of float32 or "
                        f"float16 (ORT needs .dtype), got {type(v).__name__}")
    v = np.asarray(v)
    if v.dtype not in (np.float32, np.float16, np.float64):
        raise TypeError(f"{func}: {name} must be float32 or float16, got {v.dtype}")
    return v


def compute_scale_zp(rmin, rmax, qmin, qmax, symmetric=False, min_real_range=None, *,
                     version="1.32"):
    """``[zero_point, scale]`` of ORT's ``compute_scale_zp`` (module docstring).

    Parameters
    ----------
    rmin, rmax : numpy arrays or scalars of one float dtype T, one element
    qmin, qmax : 0-d integer arrays (:func:`get_qmin_qmax_for_qType`) or ints
    symmetric : bool
    min_real_range : float or None
        ORT's ``MinimumRealRange``: ``hi = max(hi, T(lo + T(mrr)))``.
    version : {"1.32", "1.27"}
        "1.27" (ORT <= 1.27) subtracts the range in T before widening, which
        changes the scale when ``hi - lo`` is inexact in T and overflows for
        +-3.4e38.

    Returns
    -------
    [zero_point, scale] : zero point in qmin's dtype, scale in T, with the
    shape of ``rmin`` (0-d or (1,)).
    """
    func = "compute_scale_zp"
    if version not in VERSIONS:
        raise ValueError(f"{func}: version must be one of {VERSIONS}, got {version!r}")
    rmin = _range_array(rmin, func, "rmin")
    rmax = _range_array(rmax, func, "rmax")
    qmin_a, qmax_a = np.asarray(qmin), np.asarray(qmax)
    if qmin_a > 0 or qmax_a < 0:
        raise ValueError(f"qmin and qmax must meet requirement: qmin <= 0 <= qmax while "
                         f"qmin:{qmin}, qmmax:{qmax}")
    if rmin.size != 1 or rmax.size != 1:
        raise ValueError(f"{func}: rmin and rmax must hold one value each (ORT cannot "
                         f"consume per-channel ranges), got shapes {rmin.shape} and {rmax.shape}")
    dt = rmax.dtype
    lo = np.minimum(rmin, np.array(0, dtype=rmin.dtype))
    hi = np.maximum(rmax, np.array(0, dtype=rmax.dtype))
    if min_real_range is not None:
        hi = max(hi, lo + np.asarray(min_real_range, dtype=rmin.dtype))
    if symmetric:
        m = np.maximum(np.abs(lo), np.abs(hi))
        lo, hi = -m, +m
    if version == "1.32":
        dr = np.array(hi, dtype=_F64) - np.array(lo, dtype=_F64)
    else:
        with np.errstate(over="ignore"):
            dr = np.array(hi - lo, dtype=_F64)
    dq = np.array(qmax_a, dtype=_F64) - np.array(qmin_a, dtype=_F64)
    s64 = np.array(dr / dq)
    if not s64 >= 0:
        raise AssertionError("scale issue")
    stored = s64.astype(dt)
    if dt == np.float16:
        tiny = np.finfo(np.float16).smallest_subnormal if version == "1.32" else \
            np.finfo(np.float16).tiny
        degenerate = (stored if version == "1.32" else s64) < tiny
    else:
        degenerate = s64 < np.finfo(dt).tiny
    zdt = (qmin_a.dtype
           if qmin_a.dtype.kind in "iu" or qmin_a.dtype.name.startswith(("int", "uint"))
           else np.dtype(np.int64))
    if degenerate:
        return [np.array(0, dtype=zdt).reshape(s64.shape),
                np.array(1.0, dtype=dt).reshape(s64.shape)]
    if symmetric:
        zp = np.array(np.round((qmin_a + qmax_a) / np.array(2.0, dtype=_F64)), dtype=zdt)
    else:
        with np.errstate(invalid="ignore"):
            zp = np.array(np.round(qmin_a - lo / s64), dtype=zdt)
    return [zp.reshape(s64.shape), stored]


def snap_zero_point_to_uint8(rmin, rmax, qmin=0, qmax=255, min_real_range=None):
    """ORT's ``ActivationRestrictedAsymmetric`` qparams (uint8, float64 host
    arithmetic): zp ``qmin`` for ``rmin >= 0`` else ``mid = (qmin+qmax+1)//2``;
    scale ``rmax / (qmax - qmin)`` or ``max(-rmin/(mid-qmin), rmax/(qmax-mid))``,
    floored at ``mrr / (qmax - qmin)``; degenerate ranges (``rmax <= rmin``)
    get ``(absmax or 1) / denom``.  Returns ``(zero_point uint8, scale float32)``."""
    qmin_val, qmax_val = int(qmin), int(qmax)
    mid = (qmin_val + qmax_val + 1) // 2
    lo = min(float(np.squeeze(rmin)), 0.0)
    hi = max(float(np.squeeze(rmax)), 0.0)
    if min_real_range is not None and min_real_range > 0:
        hi = max(hi, lo + float(min_real_range))
    floor = None if min_real_range is None else min_real_range / (qmax_val - qmin_val)
    if hi <= lo:
        zp = qmin_val if lo >= 0.0 else mid
        absmax = max(abs(lo), abs(hi))
        denom = (qmax_val - qmin_val) if zp == qmin_val else max(1, (qmax_val - qmin_val) // 2)
        scale = (absmax if absmax > 0 else 1.0) / max(1, denom)
        if floor is not None and scale < floor:
            scale = floor
        return np.array(zp, dtype=np.uint8), np.array(scale, dtype=_F32)
    if lo >= 0.0:
        zp, scale = qmin_val, np.array(hi / (qmax_val - qmin_val), dtype=_F32)
    else:
        zp = mid
        scale = np.array(max(-lo / (mid - qmin_val), hi / (qmax_val - mid)), dtype=_F32)
    if floor is not None and float(scale) < floor:
        scale = np.array(floor, dtype=_F32)
    return np.array(zp, dtype=np.uint8), scale


_STD_F8 = {}


def compute_scale_zp_float8(element_type, std):
    """``[zero_point, scale]`` for FLOAT8E4M3FN: ``scale = T(std / std_f8)``
    (no guard: ``std = 0`` gives scale 0), ``std_f8 = np.std`` (float32) of
    the 254 finite E4M3FN values; zero point ``float8_e4m3fn(0)``."""
    name = type_name(element_type, "compute_scale_zp_float8")
    if name != "FLOAT8E4M3FN":
        raise ValueError(f"Quantization to element_type={TENSOR_TYPES[name]} not implemented.")
    f8 = np_dtype(name)
    if name not in _STD_F8:
        values = np.arange(256, dtype=np.uint8).view(f8).astype(_F32)
        _STD_F8[name] = np.std(values[np.isfinite(values)])
    std = np.asarray(std)
    return [np.array(0, dtype=f8), np.array(std / _STD_F8[name], dtype=std.dtype)]


def compute_scale_zp_blocked(weight, quant_type, axis, block_size, symmetric):
    """ORT's per-block qparams of a rank-2 weight: blocks of ``block_size``
    along ``axis`` (zero padded), ``scale = T(f64(hi - lo) / (qmax - qmin))``
    (``reduce_range`` / ``MinimumRealRange`` ignored), degenerate when the
    *rounded* scale is below tiny; zp ``clip(rint(qmin - f64(lo) /
    f64(scale_T)), qmin, qmax)`` from the rounded scale.  Returns
    ``(zero_points, scales)`` shaped like the weight with ``ceil(k / b)`` on
    ``axis``."""
    func = "compute_scale_zp_blocked"
    weight = np.asarray(_require_numpy(weight, "weight", func))
    if weight.ndim != 2:
        raise NotImplementedError(
            "Per-block (opset-21) quantization is only supported for rank-2 weight tensors. "
            f"Got rank-{weight.ndim} tensor with shape {weight.shape}. "
            "For rank > 2 tensors, reshape to 2-D before quantizing or use per-channel "
            "quantization.")
    if block_size < 1:
        raise ValueError(f"{func}: block_size must be >= 1, got {block_size}")
    name = type_name(quant_type, func)
    k = weight.shape[axis]
    nb = (k + block_size - 1) // block_size
    other = weight.shape[1 - axis % 2]
    moved = np.moveaxis(weight, axis, 0).reshape(k, other)
    qmin, qmax = get_qmin_qmax_for_qType(name, False, symmetric)
    pad = nb * block_size - k
    if pad:
        moved = np.concatenate([moved, np.zeros((pad, other), dtype=moved.dtype)], axis=0)
    blocks = moved.reshape(nb, block_size, other)
    lo = np.minimum(blocks.min(axis=1), 0)
    hi = np.maximum(blocks.max(axis=1), 0)
    lo, hi = lo.astype(weight.dtype), hi.astype(weight.dtype)
    if symmetric:
        m = np.maximum(np.abs(lo), np.abs(hi))
        lo, hi = -m, m
    qmin64, qmax64 = _F64(qmin), _F64(qmax)
    raw = ((hi - lo).astype(_F64) / (qmax64 - qmin64)).astype(weight.dtype)
    finfo = np.finfo(weight.dtype)
    degenerate = raw < (finfo.smallest_subnormal if weight.dtype == np.float16 else finfo.tiny)
    scales = np.where(degenerate, np.ones_like(raw), raw)
    if symmetric:
        zps = np.full((nb, other), int(np.round((qmin64 + qmax64) / 2.0)), dtype=qmin.dtype)
    else:
        raw_zp = np.clip(np.round(qmin64 - lo.astype(_F64) / scales.astype(_F64)), qmin64, qmax64)
        zps = raw_zp.astype(qmin.dtype)
        zps[degenerate] = 0
    return np.moveaxis(zps, 0, axis), np.moveaxis(scales, 0, axis)


# ------------------------------------------------------------ quantizing
def _check_zero_point_dtype(zero_point):
    z = np.asarray(zero_point)
    if z.dtype in (np.float32, np.float16):
        raise TypeError(f"zero_point cannot be {z.dtype}")
    return z


def _saturate_float8(v, name, saturate):
    """float32 values -> float 8 codes: round to nearest even (ml_dtypes);
    with ``saturate`` overflow and +-inf clamp to +-max, NaN stays NaN."""
    f8 = np_dtype(name)
    v = np.asarray(v, dtype=_F32)
    if saturate:
        big = _F32(_ml_dtypes("float 8").finfo(f8).max)
        v = np.where(np.isnan(v), v, np.clip(v, -big, big))
    return v.astype(f8)


def quantize_nparray(qType, arr, scale, zero_point, low=None, high=None):
    """ORT's Python quantization of stored data (weights).

    Integers: ``clip(rint(f32(arr) / scale) + zero_point, max(qmin, low),
    min(qmax, high))`` in the promoted dtype (float32 for a float32 / float16
    scale, float64 for a float64 scale), then cast; NaN becomes 0 through
    the cast (ORT's kernel gives qmin: :func:`quantize_linear`).  The full
    range of the type is used whatever the scale was computed for.  Float 8:
    zero point must be 0, ``saturate_cast(arr / scale)``.
    """
    func = "quantize_nparray"
    name = type_name(qType, func)
    arr = np.asarray(_require_numpy(arr, "arr", func))
    if name in _FLOAT8_TYPES:
        if np.asarray(zero_point).astype(_F32) != 0:
            raise NotImplementedError(
                f"zero_point is expected to be null for float 8 not {zero_point!r}.")
        if arr.dtype not in (np.float32, np.float16):
            raise ValueError(f"Unexpected dtype {arr.dtype}.")
        scale = np.asarray(scale).astype(arr.dtype)
        return np.asarray(_saturate_float8((arr / scale).astype(_F32), name, True))
    if name not in _INT_TYPES:
        raise ValueError(f"{func}: unexpected data type {qType!r}")
    qmin, qmax = get_qmin_qmax_for_qType(name)
    cliplow = max(qmin, low) if low is not None else qmin
    cliphigh = min(qmax, high) if high is not None else qmax
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        q = np.asarray((arr.astype(_F32) / scale).round() + zero_point)
        np.clip(q, cliplow, cliphigh, out=q)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # NaN -> int: 0 on x86, as in ORT
            return np.asarray(q.astype(np_dtype(name)))


def compute_data_quant_params(data, quant_type, symmetric, reduce_range=False,
                              min_real_range=None, rmin_override=None, rmax_override=None):
    """``(zero_point, scale)`` of a tensor, ORT's weight path: ``rmin =
    data.min()``, ``rmax = data.max()`` (NaN propagates; empty -> 0.0),
    overrides replace them; integers through :func:`compute_scale_zp` with
    the (reduced / symmetric) range, float 8 through
    :func:`compute_scale_zp_float8` with ``np.std(data)``."""
    func = "compute_data_quant_params"
    _require_numpy(data, "data", func)
    if not isinstance(data, np.ndarray):
        raise TypeError(f"Weight must be given as an array not {type(data)}.")
    name = type_name(quant_type, func)
    rmin = rmin_override if rmin_override is not None else (data.min() if len(data) else 0.0)
    rmax = rmax_override if rmax_override is not None else (data.max() if len(data) else 0.0)
    rmin = np.array(rmin, dtype=data.dtype)
    rmax = np.array(rmax, dtype=data.dtype)
    if name == "FLOAT8E4M3FN":
        if reduce_range:
            raise RuntimeError("Unsupported option reduce_range=True for float 8.")
        zero_point, scale = compute_scale_zp_float8(name, np.std(data))
        return zero_point, np.asarray(scale)
    if name in _INT_TYPES:
        qmin, qmax = get_qmin_qmax_for_qType(name, reduce_range, symmetric=symmetric)
        if len(data):
            zero_point, scale = compute_scale_zp(rmin, rmax, qmin, qmax, symmetric, min_real_range)
        else:
            zero_point, scale = np.array(0, dtype=qmin.dtype), np.array(1.0, dtype=data.dtype)
        return _check_zero_point_dtype(zero_point), np.asarray(scale)
    raise ValueError(f"Unexpected value for quant_type={TENSOR_TYPES[name]}.")


def quantize_data(data, qType, symmetric, reduce_range=False, min_real_range=None,
                  rmin_override=None, rmax_override=None):
    """``(zero_point, scale, quantized)``: :func:`compute_data_quant_params`
    then :func:`quantize_nparray`; float 8 raises ``RuntimeError`` when a code
    is NaN."""
    name = type_name(qType, "quantize_data")
    zero_point, scale = compute_data_quant_params(data, name, symmetric, reduce_range,
                                                  min_real_range, rmin_override, rmax_override)
    q = quantize_nparray(name, data, scale, zero_point)
    if name == "FLOAT8E4M3FN" and np.any((q.view(np.uint8).ravel() & 127) == 127):
        d = np.asarray(data)
        raise RuntimeError(f"One of the quantized value is NaN data in [{d.min()}, {d.max()}], "
                           f"quantized_data in [{q.min()}, {q.max()}].")
    return zero_point, scale, q


def pack_bytes_to_4bit(src_8bit):
    """Two 4-bit values per byte, element ``2k`` in the low nibble, an odd
    tail in a low nibble with high nibble 0 (a bytearray, as ORT)."""
    src = np.asarray(bytearray(src_8bit) if isinstance(src_8bit, (bytes, bytearray))
                     else np.asarray(src_8bit).astype(np.int64)).astype(np.int64) & 0xF
    if src.size % 2:
        src = np.concatenate([src, [0]])
    return bytearray(((src[1::2] << 4) | src[0::2]).astype(np.uint8).tobytes())


def quantize_weight(weight, qType, *, symmetric=None, reduce_range=False, per_channel=False,
                    axis=0, block_size=0, min_real_range=None):
    """ORT's QDQ weight initializer: ``(zero_point, scale, quantized)``.

    ``symmetric=None`` is ORT's default (``WeightSymmetric`` unset): True for
    INT4 / INT8 / INT16 / FLOAT8E4M3FN, False for the unsigned types, and
    True for per-channel whatever the type.  Per tensor:
    :func:`quantize_data` of the flattened weight; per channel: every
    ``weight.take(i, axis)`` alone (1-D scale / zp of length C); blocked
    (``block_size > 0``, rank 2): :func:`compute_scale_zp_blocked` and
    :func:`quantize_nparray` block by block.
    """
    func = "quantize_weight"
    w = np.asarray(_require_numpy(weight, "weight", func))
    name = type_name(qType, func)
    if symmetric is None:
        symmetric = True if per_channel else name in ("INT4", "INT8", "INT16", "FLOAT8E4M3FN")
    if block_size:
        zps, scales = compute_scale_zp_blocked(w, name, axis, block_size, symmetric)
        rep = np.repeat(np.moveaxis(scales, axis, 0), block_size, axis=0)[:w.shape[axis]]
        zrep = np.repeat(np.moveaxis(zps, axis, 0), block_size, axis=0)[:w.shape[axis]]
        q = quantize_nparray(name, np.moveaxis(w, axis, 0), rep, zrep.astype(np.int64))
        return zps, scales, np.moveaxis(q, 0, axis)
    if not per_channel:
        return quantize_data(w.flatten(), name, symmetric, reduce_range, min_real_range)
    axis = A.normalize_axis(axis, w.ndim, func)
    zps, scales, qs = [], [], []
    for i in range(w.shape[axis]):
        z, s, q = quantize_data(w.take(i, axis).ravel(), name, symmetric, reduce_range,
                                min_real_range)
        zps.append(z)
        scales.append(s)
        qs.append(np.asarray(q).reshape(w.take(i, axis).shape))
    return (np.asarray(zps).reshape(-1), np.asarray(scales).reshape(-1),
            np.stack(qs, axis=axis))


def adjust_weight_scale_for_int32_bias(input_scale, weight_scale, bias, per_channel=False):
    """ORT's silent enlargement of a weight scale so that the int32 bias
    ``bias / (input_scale * weight_scale)`` fits (INT8 / INT16 weights with
    zero points 0): with ``qrange = 2**32 - 2`` and ``absmax = max(|min(b, 0)|,
    |max(b, 0)|)`` (per channel ``|b[i]|``), if ``0 < f64(in_s) * f64(w_s) <
    1.0001 * 2 * absmax / qrange`` the scale becomes ``T(w_s * ratio)`` (a
    float16 scale rounded up).  Returns ``(adjusted, new_weight_scale)``."""
    w_s = np.asarray(weight_scale)
    if not w_s.size:
        return False, None
    b = np.asarray(bias)
    qrange = _F64(np.iinfo(np.int32).max) - _F64(np.iinfo(np.int32).min + 1)
    in64 = _F64(np.asarray(input_scale).item())
    dt = w_s.dtype

    def fixed(ws64, absmax):
        smallest = 1.0001 * (2.0 * absmax) / qrange
        cand = in64 * ws64
        if cand < smallest and cand > 0.0:
            new = np.array(ws64 * (smallest / cand))
            rounded = new.astype(dt)
            if dt == np.float16 and rounded < new:
                rounded = np.nextafter(rounded, np.array(np.inf, dtype=dt))
            return rounded, True
        return None, False

    if not per_channel:
        absmax = np.maximum(np.abs(np.minimum(b.min(), _F64(0))),
                            np.abs(np.maximum(b.max(), _F64(0))))
        new, changed = fixed(_F64(w_s.item()), absmax)
        return (True, new) if changed else (False, w_s)
    out = w_s.copy()
    changed_any = False
    for i in range(w_s.shape[0]):
        new, changed = fixed(_F64(w_s[i].item()), np.abs(b[i]))
        if changed:
            out[i] = new
            changed_any = True
    return changed_any, out


def quantize_bias(bias, input_scale, weight_scale, beta=1.0):
    """ORT's int32 bias: ``bias_scale = input_scale * weight_scale * beta``
    (float32 products), ``q = clip(rint(f64(b) / f64(bias_scale)), int32)``.
    Returns ``(quantized int32, bias_scale 1-D)``."""
    b = np.asarray(_require_numpy(bias, "bias", "quantize_bias"))
    if beta == 0:
        b, beta = np.zeros_like(b), 1.0
    bias_scale = np.asarray(input_scale) * np.asarray(weight_scale) * beta
    q = np.asarray(b, dtype=_F64) / np.asarray(bias_scale, dtype=_F64)
    q = np.clip(q.round(), _F64(np.iinfo(np.int32).min), _F64(np.iinfo(np.int32).max))
    return q.astype(np.int32).reshape(b.shape), np.asarray(bias_scale, dtype=b.dtype).reshape(-1)


def _param_view(p, x, axis, block_size, func):
    """Broadcast a per-tensor / per-axis / blocked parameter against x."""
    p = np.asarray(p)
    if p.ndim == 0 or p.size == 1 and not block_size:
        return p.reshape(())
    axis = A.normalize_axis(axis, x.ndim, func)
    if block_size:
        if p.ndim != x.ndim:
            raise ValueError(f"{func}: a blocked scale needs the input's rank {x.ndim}, "
                             f"got shape {p.shape}")
        p = np.repeat(p, block_size, axis=axis)
        return np.take(p, np.arange(x.shape[axis]), axis=axis)
    if p.ndim != 1 or p.shape[0] != x.shape[axis]:
        raise ValueError(f"{func}: a per-axis parameter needs {x.shape[axis]} values along axis "
                         f"{axis}, got shape {p.shape}")
    shape = [1] * x.ndim
    shape[axis] = -1
    return p.reshape(shape)


def quantize_linear(x, y_scale, y_zero_point=None, *, axis=1, block_size=0, saturate=1,
                    output_type=None):
    """QuantizeLinear as ORT's CPU kernel computes it.

    ``q = saturate(rint(f32(x) / f32(scale)) + zp)`` for the integer types
    (int2 / uint2 / int4 / uint4 / 8 / 16 bit): a float32 division, NaN -> qmin whatever the
    zero point, +-inf and results beyond int32 saturate; float16 input and
    scale are converted to float32 first.  Float 8: ``cast(x / scale)``,
    round to nearest even; ``saturate=1`` clamps to +-max (+-inf too),
    ``saturate=0`` is the ONNX spec's plain cast (ORT's own overflow bugs
    are not reproduced).  ORT 1.32's CPU provider has no kernel for
    FLOAT4E2M1 nor INT2 / UINT2 (opset 25); these follow ``onnx.reference``:
    FLOAT4E2M1 is ml_dtypes' cast of ``f32(x / scale) + zp`` (round half to
    even, beyond +-6 and +-inf -> +-6, NaN -> the zero of the opposite sign),
    INT2 / UINT2 the integer rule.  Per tensor (scalar scale), per axis (1-D scale
    along ``axis``) or blocked (``block_size``: scale of the input's rank).
    The output type is the zero point's (``output_type`` when there is
    none; default UINT8).
    """
    func = "quantize_linear"
    x = np.asarray(_require_numpy(x, "x", func))
    if y_zero_point is None:
        name = type_name(output_type or "UINT8", func)
        zp = np.zeros((), dtype=np_dtype(name))
    else:
        zp = np.asarray(y_zero_point)
        name = type_name(output_type, func) if output_type is not None else _dtype_type_name(zp)
    s = _param_view(np.asarray(y_scale).astype(_F32), x, axis, block_size, func)
    xf = x.astype(_F32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        v = xf / s
    if name in _FLOAT8_TYPES:
        return _saturate_float8(v, name, bool(saturate))
    if name == "FLOAT4E2M1":  # onnx.reference: (x / scale + zp) cast by ml_dtypes
        if y_zero_point is not None:
            v = v + _param_view(zp.astype(_F32), x, axis, block_size, func)
        return v.astype(np_dtype(name))
    qmin, qmax = _LINEAR_RANGE[name]
    z = _param_view(zp.astype(np.int64) if zp.dtype.kind in "iu"
                    else zp.astype(_F32).astype(np.int64),
                    x, axis, block_size, func)
    r = np.rint(v)
    r = np.clip(r, -2.0**31, 2.0**31 - 1)  # the kernel saturates in int32 first
    nan = np.isnan(r)
    r = np.where(nan, 0, r).astype(np.int64) + z
    r = np.where(nan, qmin, np.clip(r, qmin, qmax))
    return r.astype(np_dtype(name))


def _dtype_type_name(a):
    names = {"int8": "INT8", "uint8": "UINT8", "int16": "INT16", "uint16": "UINT16",
             "int32": "INT32", **{md: name for name, md in _ML_DTYPE_NAMES.items()}}
    if a.dtype.name not in names:
        raise TypeError(f"zero point of dtype {a.dtype} is not a quantized type")
    return names[a.dtype.name]


def dequantize_linear(x, x_scale, x_zero_point=None, *, axis=1, block_size=0):
    """DequantizeLinear as ORT's CPU kernel: ``f32(int32(x) - zp) * scale``
    in float32 (int32 input: ``x - zp`` wraps in int32); float 8: ``f32(x) *
    scale``.  The result has the scale's float dtype."""
    func = "dequantize_linear"
    x = np.asarray(_require_numpy(x, "x", func))
    scale = np.asarray(x_scale)
    s = _param_view(scale, x, axis, block_size, func)
    out_dt = scale.dtype if scale.dtype in (np.float16, np.float32) else np.dtype(_F32)
    if x.dtype.name.startswith(("float8", "float4")):  # the zero point is not used
        return (x.astype(_F32) * s.astype(_F32)).astype(out_dt)
    zp = (np.zeros((), np.int64) if x_zero_point is None
          else np.asarray(x_zero_point).astype(np.int64))
    z = _param_view(zp, x, axis, block_size, func)
    d = (x.astype(np.int64) - z)
    if x.dtype == np.int32:
        d = d.astype(np.int32)  # ORT subtracts in int32, wrapping
    return (d.astype(_F32) * s.astype(_F32)).astype(out_dt)


# ------------------------------------------------------------- histogram
def _is_f32_scalar(v):
    return isinstance(v, (np.floating, np.ndarray)) and np.asarray(v).dtype == np.float32 and \
        np.ndim(v) == 0


def _minmax_f32(flat):
    """(nanmin, nanmax, has_nan) of a contiguous float32 array as numpy
    computes them: NaN for an all-NaN array, numpy's own sign for a zero
    when both -0.0 and +0.0 occur."""
    lo, hi, flags = K.minmax(flat, _threads(flat.shape[0]))
    has_nan = bool(flags & 1)
    if lo > hi:  # non-empty and all NaN
        return _F32(np.nan), _F32(np.nan), True
    lo, hi = _F32(lo), _F32(hi)
    both_zeros = (flags & 6) == 6
    if lo == 0:
        lo = np.nanmin(flat) if both_zeros else (_F32(-0.0) if flags & 2 else _F32(0.0))
    if hi == 0:
        hi = np.nanmax(flat) if both_zeros else (_F32(0.0) if flags & 4 else _F32(-0.0))
    return lo, hi, has_nan


def _flat(a):
    a = np.asarray(a)
    if a.dtype == np.float32:
        return np.require(a, _F32, ["C", "A"]).reshape(-1)
    return a.reshape(-1)


def _outer_edges(a, range_, absolute):
    """numpy's ``_get_outer_edges`` (range checks, autodetection, +-0.5)."""
    if range_ is not None:
        first, last = range_
        if first > last:
            raise ValueError("max must be larger than min in range parameter.")
        if not (np.isfinite(first) and np.isfinite(last)):
            raise ValueError(f"supplied range of [{first}, {last}] is not finite")
    elif a.size == 0:
        first, last = 0, 1
    else:
        if absolute:
            lo, hi, has_nan = _minmax_f32(a)
            first = _F32(np.nan) if has_nan else _F32(H.absmin_f32(a))
            last = _F32(np.nan) if has_nan else max(abs(lo), abs(hi))
        else:
            lo, hi, has_nan = _minmax_f32(a)
            first, last = (_F32(np.nan), _F32(np.nan)) if has_nan else (lo, hi)
        if not (np.isfinite(first) and np.isfinite(last)):
            raise ValueError(f"autodetected range of [{first}, {last}] is not finite")
    if first == last:
        first, last = first - 0.5, last + 0.5
    return first, last


def np_histogram(a, bins, range=None, *, absolute=False):  # noqa: A002 - numpy's name
    """``numpy.histogram(a, bins, range)`` (of ``|a|`` with ``absolute``),
    counts (int64) and edges bit for bit, in one pass for float32 data.

    ``bins`` an int: numpy's uniform path (``np.linspace`` edges, the float32
    estimate and its two corrections, ``qc_np_histogram.h``); an array of
    non-decreasing edges: bin ``i`` counts ``e[i] <= v < e[i+1]`` (the last
    bin also ``v == e[n]``).  NaN and values outside the edges are not
    counted.  Data other than float32, and float32 data with a range whose
    ends are not float32, go to ``numpy.histogram`` itself.  The errors
    are numpy's (non-finite range, non-monotonic edges, too many bins).
    """
    a = _flat(_require_numpy(a, "a", "np_histogram"))
    if a.dtype != np.float32:
        return np.histogram(np.absolute(a) if absolute else a, bins, range)
    nthreads = _threads(a.shape[0])
    if np.ndim(bins) == 0:
        n = int(bins)
        if n < 1:
            raise ValueError("`bins` must be positive, when an integer")
        first, last = _outer_edges(a, range, absolute)
        if range is not None and not (_is_f32_scalar(first) and _is_f32_scalar(last)):
            return np.histogram(np.absolute(a) if absolute else a, n, range)
        bin_type = np.result_type(first, last, a)
        edges = np.linspace(first, last, n + 1, endpoint=True, dtype=bin_type)
        if np.any(edges[:-1] >= edges[1:]):
            raise ValueError(f"Too many bins for data range. Cannot create {n} finite-sized bins.")
        if bin_type != np.float32:  # pragma: no cover - float32 data, float32 ends
            return np.histogram(np.absolute(a) if absolute else a, n, range)
        counts = H.hist_uniform_f32(a, edges, float(first), float(last), absolute, nthreads)
        return counts, edges
    edges = np.asarray(bins)
    if np.any(edges[:-1] > edges[1:]):
        raise ValueError("`bins` must increase monotonically, when an array")
    if edges.dtype not in (np.float32, np.float64) or edges.size < 2:
        return np.histogram(np.absolute(a) if absolute else a, edges)
    counts = H.hist_edges_f32(a, np.ascontiguousarray(edges, dtype=_F64), absolute, nthreads)
    return counts, edges


class _CallStats:
    """Range statistics of one ``collect_data`` call, batch by batch: what
    ORT computes on the stacked, flattened data of the call."""

    def __init__(self, absolute):
        self.absolute = absolute
        self.size = 0
        self.dtype = None
        self.min = self.max = None      # nanmin / nanmax (NaN when all NaN)
        self.any_nan = False
        self.absmin = None              # min |x| (NaN propagating), first abs call only

    def add(self, a, need_absmin=False, shape=None):
        if shape is not None:
            if getattr(self, "shape", shape) != shape:
                raise ValueError(
                    "setting an array element with a sequence. The requested array has an "
                    "inhomogeneous shape after 1 dimensions. (ORT stacks the batches of one "
                    f"collect_data call: shapes {self.shape} and {shape}; one call per batch, "
                    "CalibStridedMinMax=1 / strided=1, takes them)")
            self.shape = shape
        if self.dtype is not None and a.dtype != self.dtype:
            raise ValueError(f"The calibration expects only one element type but got "
                             f"{ {self.dtype, a.dtype} }")
        self.dtype = a.dtype
        if a.size == 0:
            return False
        self.size += a.size
        if a.dtype == np.float32:
            lo, hi, has_nan = _minmax_f32(a)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN: NaN, as in ORT
                lo, hi = np.nanmin(a), np.nanmax(a)
            has_nan = bool(np.isnan(a).any())
        self.any_nan |= has_nan
        self.min = lo if self.min is None else _nan_aware(min, self.min, lo)
        self.max = hi if self.max is None else _nan_aware(max, self.max, hi)
        if need_absmin:
            am = (a.dtype.type(H.absmin_f32(a)) if a.dtype == np.float32
                  else np.absolute(a).min())
            self.absmin = am if self.absmin is None else (
                am if np.isnan(am)
                else (self.absmin if np.isnan(self.absmin) else min(self.absmin, am)))
        return has_nan

    def signed(self):
        """(min, max) as ORT holds them: 0-d zeros for an empty call."""
        if self.size == 0:
            dt = self.dtype or np.dtype(_F32)
            return np.array(0, dtype=dt), np.array(0, dtype=dt)
        return self.min, self.max


def _nan_aware(pick, old, new):
    """nanmin / nanmax of two partial results (NaN only when both are)."""
    if np.isnan(old):
        return new
    if np.isnan(new):
        return old
    return pick(old, new)


class _Plan:
    """How one call's values are binned: ``bins`` (int, with ``range``) or
    explicit ``edges``; ``absolute`` for |x|."""

    def __init__(self, bins, range_=None, absolute=False):
        self.bins, self.range, self.absolute = bins, range_, absolute
        self.counts = None
        self.edges = None

    def add(self, a):
        counts, edges = np_histogram(a, self.bins, self.range, absolute=self.absolute)
        self.counts = counts if self.counts is None else self.counts + counts
        self.edges = edges
        return self

    def result(self, dtype):
        if self.counts is None:  # a call without batches: numpy on no data
            self.add(np.zeros(0, dtype=dtype))
        return self.counts, self.edges


class HistogramCollector:
    """ORT's ``HistogramCollector`` (Entropy, Percentile, Distribution).

    ``collect(name_to_arr)`` is one ``collect_data`` call: each value an
    array or a list of the call's batches (as if stacked).  The state per
    tensor is ORT's: ``(hist, hist_edges, min, max, threshold)`` for values,
    ``(hist, hist_edges, min, max)`` for ``|x|`` (symmetric Percentile).

    Values (``collect_value``): ``t = max(|nanmin|, |nanmax|)``; the first call
    bins over ``(-t, t)``; a later call with ``t <= t_old`` bins over the old
    range and adds; ``t_old == 0`` bins over ``(-t, t)`` and adds by index;
    otherwise the histogram grows by ``k = int((t - t_old) // stride + 1)``
    bins each side, ``stride = f32(2 t_old / N)``, ``t_new = f32(k stride + t_old)``.
    Absolute values: the first call bins ``|x|`` over ``(min|x|, max|x|)``; a
    later call with a larger ``max|x|`` appends ``np.arange(E[-1] + w, amax + w,
    w)`` (float64) edges; counts against the edges, old counts added by index,
    edges stored as float32.
    """

    def __init__(self, method, symmetric, num_bins, num_quantized_bins, percentile, scenario):
        if method not in ("entropy", "percentile", "distribution"):
            raise ValueError("Only 'entropy', 'percentile' or 'distribution' methods are supported")
        self.histogram_dict = {}
        self.method = method
        self.symmetric = symmetric
        self.num_bins = num_bins
        self.num_quantized_bins = num_quantized_bins
        self.percentile = percentile
        self.scenario = scenario

    @property
    def absolute(self):
        """Percentile with symmetric=True bins |x| (ORT's collect_absolute_value)."""
        return self.method == "percentile" and bool(self.symmetric)

    def get_histogram_dict(self):
        return self.histogram_dict

    def collect(self, name_to_arr):
        """One ORT ``collect`` call."""
        for tensor, data in name_to_arr.items():
            originals = [np.asarray(_require_numpy(d, tensor, "collect")) for d in
                         (data if isinstance(data, (list, tuple)) else [data])]
            arrays = [_flat(d) for d in originals]
            stats = self.new_stats(tensor)
            for a, d in zip(arrays, originals):
                stats.add(a, need_absmin=self.absolute and tensor not in self.histogram_dict,
                          shape=d.shape)
            plan = self.plan(tensor, stats)
            for a in arrays:
                plan.add(a)
            self.finish(tensor, stats, plan)

    # the three steps of a call (the streaming calibrators run them over batches)
    def new_stats(self, tensor):
        return _CallStats(self.absolute)

    def plan(self, tensor, stats):
        """The binning of this call, decided from its range statistics."""
        old = self.histogram_dict.get(tensor)
        if self.absolute:
            if old is None:
                if stats.size == 0:
                    return _Plan(self.num_bins, None, True)
                first, last = stats.absmin, (
                    stats.dtype.type(np.nan) if stats.any_nan else
                    max(abs(stats.min), abs(stats.max)))
                if not (np.isfinite(first) and np.isfinite(last)):
                    raise ValueError(f"autodetected range of [{first}, {last}] is not finite")
                if first == last:
                    first, last = first - 0.5, last + 0.5
                return _Plan(self.num_bins, (first, last), True)
            edges = old[1]
            if stats.size == 0:   # ORT: np.nanmax of nothing fails (surprise 18)
                return _Plan(edges, None, True)
            amax = stats.dtype.type(np.nan) if np.isnan(stats.min) else max(abs(stats.min),
                                                                           abs(stats.max))
            if amax > edges[-1]:
                width = edges[1] - edges[0]
                new_edges = np.arange(edges[-1] + width, amax + width, width)
                edges = np.hstack((edges, new_edges))
            return _Plan(edges, None, True)
        mn, mx = stats.signed()
        threshold = np.array(max(abs(mn), abs(mx)), dtype=stats.dtype or _F32)
        stats.threshold = threshold
        if old is None:
            return _Plan(self.num_bins, (-threshold, threshold))
        old_hist, _, _, _, old_threshold = old
        if threshold <= old_threshold:
            return _Plan(len(old_hist), (-old_threshold, old_threshold))
        if old_threshold == 0:
            return _Plan(len(old_hist), (-threshold, threshold))
        old_stride = 2 * old_threshold / len(old_hist)
        half = int((threshold - old_threshold) // old_stride + 1)
        new_threshold = half * old_stride + old_threshold
        plan = _Plan(len(old_hist) + 2 * half, (-new_threshold, new_threshold))
        plan.half, plan.new_threshold = half, new_threshold
        return plan

    def finish(self, tensor, stats, plan):
        """Merge the call's counts into the state (ORT's update rules)."""
        dtype = stats.dtype or np.dtype(_F32)
        hist, edges = plan.result(dtype)
        old = self.histogram_dict.get(tensor)
        mn, mx = stats.signed()
        if self.absolute:
            edges = edges.astype(dtype)
            if old is not None and stats.size == 0:
                return   # an empty later call adds nothing (surprise 18)
            if old is None:
                self.histogram_dict[tensor] = (hist, edges, mn, mx)
            else:
                hist = hist.copy()
                hist[:len(old[0])] += old[0]
                self.histogram_dict[tensor] = (hist, edges, min(old[2], mn), max(old[3], mx))
            return
        threshold = stats.threshold
        if old is None:
            self.histogram_dict[tensor] = (hist, edges, mn, mx, threshold)
            return
        old_hist, old_edges, old_min, old_max, old_threshold = old
        if threshold <= old_threshold:
            state = (hist + old_hist, old_edges, old_threshold)
        elif old_threshold == 0:
            state = (hist + old_hist, edges, threshold)
        else:
            hist = hist.copy()
            hist[plan.half:len(hist) - plan.half] += old_hist
            state = (hist, edges, plan.new_threshold)
        self.histogram_dict[tensor] = (state[0], state[1], min(old_min, mn), max(old_max, mx),
                                       state[2])

    # --------------------------------------------------------- results
    def compute_collection_result(self):
        if not self.histogram_dict:
            raise ValueError("Histogram has not been collected. Please run collect() first.")
        if self.method == "entropy":
            return self.compute_entropy()
        if self.method == "percentile":
            return self.compute_percentile()
        return self.compute_distribution()

    def compute_percentile(self):
        """``cdf = cumsum(H / sum H)``; symmetric ``(-E[i], E[i])``, ``i =
        searchsorted(cdf, p/100)``; else ``(E[searchsorted(cdf, c)],
        E[searchsorted(cdf, 1 - c)])``, ``c = (100 - p) / 200``; clipped to the
        signed min / max; ``(lo, hi, H[0], H[1])``."""
        if self.percentile < 0 or self.percentile > 100:
            raise ValueError("Invalid percentile. Must be in range 0 <= percentile <= 100.")
        out = {}
        for tensor, histogram in self.histogram_dict.items():
            hist, edges = histogram[0], histogram[1]
            with np.errstate(invalid="ignore", divide="ignore"):
                cdf = np.cumsum(hist / hist.sum())
            if self.symmetric:
                idx = np.searchsorted(cdf, self.percentile / 100.0)
                thr = (-np.array(edges[idx], dtype=edges.dtype),
                       np.array(edges[idx], dtype=edges.dtype))
            else:
                cut = (100.0 - self.percentile) / 200.0
                thr = (np.array(edges[np.searchsorted(cdf, cut)], dtype=edges.dtype),
                       np.array(edges[np.searchsorted(cdf, 1.0 - cut)], dtype=edges.dtype))
            out[tensor] = (*_clip_to(thr, histogram[2], histogram[3]), *hist[:2])
        return out

    def compute_entropy(self):
        out = {}
        for tensor, histogram in self.histogram_dict.items():
            out[tensor] = (*get_entropy_threshold(histogram, self.num_quantized_bins),
                           *histogram[:2])
        return out

    def compute_distribution(self):
        """Mean and standard deviation of the histogram (bin centres
        ``f32(f32(E[:-1] + E[1:]) * 0.5)``, ``p3``: centres ``|v|**(1/3) sign(v)``
        in float32), float64 sums, rounded to float32; range ``(min E, max E)``."""
        if self.num_bins < 512:
            raise ValueError("Invalid num_bins. Must be in range 512 <= num_bins.")
        if self.scenario not in ("same", "p3"):
            raise ValueError("Invalid scenario. Must be in {'same', 'p3'}.")
        out = {}
        for tensor, histogram in self.histogram_dict.items():
            hist, edges = histogram[0], histogram[1]
            avg, std = _avg_std(hist, edges, 1 if self.scenario == "same" else 1.0 / 3.0)
            out[tensor] = TensorData(avg=avg, std=std, hist=hist, hist_edges=edges,
                                     lowest=edges.min(), highest=edges.max())
        return out


def _clip_to(thr, mn, mx):
    """ORT's final clip of a threshold pair to the observed min / max."""
    if thr[0] < mn:
        thr = (mn, thr[1])
    if thr[1] > mx:
        thr = (thr[0], mx)
    return thr


def _avg_std(hist, edges, power):
    values = (edges[:-1] + edges[1:]) * 0.5
    with np.errstate(invalid="ignore", divide="ignore"):
        if power != 1:
            fact = np.abs(values) / values
            fact[np.isnan(fact)] = 1
            fact[np.isinf(fact)] = 1
            values = np.abs(values) ** power * fact
        avg = (hist * values).sum() / hist.sum()
        std = ((hist * values ** 2).sum() / hist.sum() - avg ** 2) ** 0.5
    return np.array(avg, dtype=edges.dtype), np.array(std, dtype=edges.dtype)


def smooth_distribution(p, eps=0.0001):
    """ORT's smoothing: zeros become ``f32(eps)``, the others lose
    ``f32(eps * n_zeros / n_nonzeros)``; None when every entry is 0."""
    is_zeros = (p == 0).astype(_F32)
    is_nonzeros = (p != 0).astype(_F32)
    n_zeros = is_zeros.sum()
    n_nonzeros = p.size - n_zeros
    if not n_nonzeros:
        return None
    eps1 = eps * float(n_zeros) / float(n_nonzeros)
    if not eps1 < 1.0:
        raise ValueError(f"smooth_distribution: n_zeros={n_zeros}, n_nonzeros={n_nonzeros}, "
                         f"eps1={eps1} (ORT asserts eps1 < 1)")
    hist = p.astype(_F32)
    hist += eps * is_zeros + (-eps1) * is_nonzeros
    if (hist <= 0).sum():
        raise ValueError("smooth_distribution: a smoothed entry is <= 0 (ORT asserts they are not)")
    return hist


def entropy(pk, qk):
    """ORT's own KL divergence in float32: ``p/sum p``, ``q/sum q``,
    ``sum(p log(p/q))`` with every term lacking ``p > 0 and q > 0`` set to +inf."""
    pk = np.asarray(pk).astype(_F32)
    pk = 1.0 * pk / np.sum(pk, axis=0, keepdims=True)
    qk = np.asarray(qk).astype(_F32)
    pk, qk = np.broadcast_arrays(pk, qk)
    qk = 1.0 * qk / np.sum(qk, axis=0, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        res = np.empty(pk.shape, dtype=pk.dtype)
        res[:] = pk[:] * np.log(pk[:] / qk[:])
    res[(pk == 0) & (qk >= 0)] = 0
    res[~((pk > 0) & (qk > 0))] = np.inf
    return np.sum(res, axis=0).astype(pk.dtype)


def entropy_kl(hist, num_quantized_bins, dtype=_F32):
    """KL divergence of every candidate window (ORT's ``get_entropy_threshold``
    loop, float64 array; each entry ORT's float32 value) and the windows'
    ``(start, end)`` edge indices.  The integer bookkeeping is vectorised
    (cumulative sums, reshapes); ``p``, ``q`` and the KL are the same numpy
    float32 operations on the same arrays as ORT's, so the values are equal."""
    n = hist.size
    z, h = n // 2, num_quantized_bins // 2
    Q = num_quantized_bins
    count = z - h + 1
    if count < 1 or Q < 1:
        raise ValueError(f"entropy: num_bins ({n}) must be >= num_quantized_bins ({Q}) "
                         "(ORT fails with 'attempt to get argmin of an empty sequence')")
    cum = np.concatenate([[0], np.cumsum(hist)])
    total = cum[-1]
    kl = np.zeros(count)
    windows = []
    for i in range(h, z + 1):
        start, end = z - i, min(z + i + 1, n)
        windows.append((start, end))
        sliced = hist[start:end]
        p = sliced.copy()
        p[0] += cum[start]
        p[-1] += total - cum[end]
        m = sliced.size // Q
        qbins = sliced[:Q * m].reshape(Q, m).sum(axis=1)
        qbins[-1] += sliced[Q * m:].sum()
        norm = (p[:Q * m] != 0).reshape(Q, m).sum(axis=1)
        q = np.zeros(p.size, dtype=np.int64)
        with np.errstate(divide="ignore", invalid="ignore"):
            q[:Q * m] = np.repeat(np.where(norm != 0, qbins / norm, 0.0), m)
        ps, qs = smooth_distribution(p), smooth_distribution(q)
        kl[i - h] = np.inf if ps is None or qs is None else np.array(entropy(ps, qs), dtype=dtype)
    return kl, windows


def get_entropy_threshold(histogram, num_quantized_bins):
    """ORT's KL threshold: the window with the smallest KL (first minimum),
    ``(E[start], E[end])`` clipped to the observed min / max."""
    hist, edges = histogram[0], histogram[1]
    kl, windows = entropy_kl(hist, num_quantized_bins, edges.dtype)
    start, end = windows[int(np.argmin(kl))]
    return _clip_to((edges[start], edges[end]), histogram[2], histogram[3])


# ------------------------------------------------------- calibration data
class TensorData:
    """ORT's ``TensorData``: ``avg``, ``std``, ``lowest``, ``highest``,
    ``hist``, ``hist_edges``, ``bins``; the float fields must be float16 /
    float32 numpy values (ORT's quantizer reads ``.dtype``)."""

    _allowed = frozenset(["avg", "std", "lowest", "highest", "hist", "hist_edges", "bins"])
    _floats = frozenset(["avg", "std", "lowest", "highest", "hist_edges"])

    def __init__(self, **kwargs):
        self._attrs = list(kwargs)
        for k, v in kwargs.items():
            if k not in TensorData._allowed:
                raise ValueError(f"Unexpected value {k!r} not in {TensorData._allowed}.")
            if k in TensorData._floats:
                if not hasattr(v, "dtype"):
                    raise ValueError(f"Unexpected type {type(v)} for k={k!r}")
                if v.dtype not in (np.float16, np.float32):
                    raise ValueError(f"Unexpected dtype {v.dtype} for k={k!r}")
            setattr(self, k, v)

    @property
    def range_value(self):
        if not hasattr(self, "lowest") or not hasattr(self, "highest"):
            raise AttributeError("Attributes 'lowest' and/or 'highest' missing.")
        return (self.lowest, self.highest)

    @property
    def avg_std(self):
        if not hasattr(self, "avg") or not hasattr(self, "std"):
            raise AttributeError("Attributes 'avg' and/or 'std' missing.")
        return (self.avg, self.std)

    def to_dict(self):
        data = {k: getattr(self, k) for k in self._attrs}
        data["CLS"] = type(self).__name__
        return data

    @classmethod
    def from_dict(cls, d):
        kwargs = {}
        for k, v in d.items():
            if k == "CLS":
                continue
            if isinstance(v, dict) and v.get("CLS") == "numpy.array":
                v = np.array(v["data"], dtype=np.dtype(v["dtype"]))
            elif k in cls._floats and isinstance(v, (int, float)):
                v = np.array(v, dtype=_F32)
            kwargs[k] = v
        return cls(**kwargs)

    def __repr__(self):
        return "TensorData(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in self._attrs
                                         if k not in ("hist", "hist_edges")) + ")"


class TensorsData:
    """ORT's ``TensorsData``: the calibration method and ``{tensor name:
    TensorData}``; tuples ``(lo, hi)`` (MinMax) and ``(lo, hi, hist, bins)``
    become TensorData."""

    def __init__(self, calibration_method, data):
        self.calibration_method = calibration_method
        self.data = {}
        for k, v in data.items():
            if not isinstance(k, str):
                raise TypeError(f"Keys must be strings not {type(k)}.")
            if isinstance(v, tuple):
                if calibration_method == CalibrationMethod.MinMax and len(v) == 2:
                    v = TensorData(lowest=v[0], highest=v[1])
                elif len(v) == 4:
                    v = TensorData(lowest=v[0], highest=v[1], hist=v[2], bins=v[3])
                else:
                    raise TypeError(f"Unexpected tuple for {k!r}, it has {len(v)} elements.")
            if not isinstance(v, TensorData):
                raise TypeError(f"Values must be TensorData not {type(v)}.")
            self.data[k] = v

    def __iter__(self):
        yield from self.data

    def __contains__(self, key):
        return key in self.data

    def __getitem__(self, key):
        return self.data[key]

    def __len__(self):
        return len(self.data)

    def keys(self):
        return self.data.keys()

    def values(self):
        return self.data.values()

    def items(self):
        return self.data.items()

    def to_dict(self):
        return {"CLS": type(self).__name__, "data": self.data,
                "calibration_method": self.calibration_method}

    @classmethod
    def from_dict(cls, d):
        method = d["calibration_method"]
        if isinstance(method, dict) and method.get("CLS") == "CalibrationMethod":
            method = CalibrationMethod[method["value"].split(".")[-1]]
        return cls(method, {k: TensorData.from_dict(v) for k, v in d["data"].items()})

    def to_ort(self):
        """The same ranges as onnxruntime's own ``TensorsData`` (imports onnxruntime)."""
        from onnxruntime.quantization import calibrate as ort_cal
        method = ort_cal.CalibrationMethod[self.calibration_method.name]
        return ort_cal.TensorsData(method, {
            k: ort_cal.TensorData(**{a: getattr(v, a) for a in v._attrs}) for k, v in self.items()})


class _Encoder(json.JSONEncoder):
    """ORT's ``CalibrationCacheEncoder`` format: arrays as ``{"data", "dtype",
    "CLS": "numpy.array"}``, numpy scalars as JSON numbers."""

    def default(self, o):
        if isinstance(o, (TensorData, TensorsData)):
            return o.to_dict()
        if isinstance(o, np.ndarray):
            return {"data": o.tolist(), "dtype": str(o.dtype), "CLS": "numpy.array"}
        if isinstance(o, CalibrationMethod):
            return {"CLS": type(o).__name__, "value": str(o)}
        if isinstance(o, np.integer):
            return int(o)
        if isinstance(o, np.floating):
            return float(o)
        return super().default(o)


def save_tensors_data(tensors_data, path, *, smooth_quant=False):
    """Write the JSON calibration cache ORT 1.27+ reads with
    ``quantize_static(..., calibration_cache_path=path)`` (through a
    temporary file and ``os.replace``, as ORT)."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".calibcache_", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            payload = tensors_data.to_dict()
            payload["smooth_quant"] = smooth_quant
            json.dump(payload, f, cls=_Encoder)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def load_tensors_data(path):
    """Read a calibration cache written by :func:`save_tensors_data` or ORT."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Calibration cache not found: {path}")
    with open(path) as f:
        return TensorsData.from_dict(json.load(f))


def _table_value(td, absmax):
    d = td.to_dict()
    hi = float(np.asarray(d.get("highest", 0)).item())
    lo = float(np.asarray(d.get("lowest", 0)).item())
    return max(abs(hi), abs(lo)) if absmax else max([hi, lo])


def write_calibration_table(calibration_cache, dir=".", *, absmax=False):  # noqa: A002
    """ORT's TensorRT calibration files in ``dir``: ``calibration.json``,
    ``calibration.cache`` (``"name value"`` per tensor, sorted) and
    ``calibration.flatbuffers`` (when the ``flatbuffers`` package is
    installed).  ORT writes ``max(highest, lowest)``, which is the dynamic
    range only for symmetric ranges; ``absmax=True`` writes the correct
    ``max(|highest|, |lowest|)``."""
    with open(os.path.join(dir, "calibration.json"), "w") as f:
        f.write(json.dumps(calibration_cache, cls=_Encoder))
    keys = sorted(calibration_cache.keys())
    values = {k: str(_table_value(calibration_cache[k], absmax)) for k in keys}
    try:
        import flatbuffers
    except ImportError:
        flatbuffers = None
    if flatbuffers is not None:
        with open(os.path.join(dir, "calibration.flatbuffers"), "wb") as f:
            f.write(_trt_table(flatbuffers, keys, values))
    with open(os.path.join(dir, "calibration.cache"), "w") as f:
        for k in keys:
            f.write(f"{k} {values[k]}\n")


def _trt_table(flatbuffers, keys, values):
    """ORT's ``TrtTable { dict: [KeyValue { key: string; value: string }] }``
    flatbuffer, built in the same order as ORT builds it."""
    builder = flatbuffers.Builder(1024)
    entries = []
    for k in keys:
        key, value = builder.CreateString(k), builder.CreateString(values[k])
        builder.StartObject(2)
        builder.PrependUOffsetTRelativeSlot(0, key, 0)
        builder.PrependUOffsetTRelativeSlot(1, value, 0)
        entries.append(builder.EndObject())
    builder.StartVector(4, len(entries), 4)
    for e in entries:
        builder.PrependUOffsetTRelative(e)
    vector = builder.EndVector()
    builder.StartObject(1)
    builder.PrependUOffsetTRelativeSlot(0, vector, 0)
    builder.Finish(builder.EndObject())
    return bytes(builder.Output())


# ------------------------------------------------------------ calibrators
def iter_batches(data, func="collect_data"):
    """Batches (dicts ``{name: array}``) of ``data``: an ORT
    ``CalibrationDataReader`` (``get_next()`` until it returns a falsy value),
    an iterable of dicts, or a callable returning one."""
    if callable(data) and not hasattr(data, "get_next"):
        data = data()
    if hasattr(data, "get_next"):
        while True:
            batch = data.get_next()
            if not batch:
                return
            yield _check_batch(batch, func)
    else:
        try:
            it = iter(data)
        except TypeError:
            raise TypeError(f"{func}: expected a CalibrationDataReader (get_next()), an iterable "
                            f"of {{name: array}} dicts or a callable returning one, got "
                            f"{type(data).__name__}") from None
        for batch in it:
            if not batch:
                return
            yield _check_batch(batch, func)


def _check_batch(batch, func):
    if not isinstance(batch, dict):
        raise TypeError(f"{func}: a batch must be a dict {{tensor name: array}}, got "
                        f"{type(batch).__name__}")
    for name, x in batch.items():
        _require_numpy(x, f"batch[{name!r}]", func)
    return batch


def _second_pass(data, func):
    """A fresh iterable over ``data`` for a second pass, or a TypeError."""
    if callable(data) and not hasattr(data, "get_next"):
        return data
    if hasattr(data, "get_next"):
        if not hasattr(data, "rewind"):
            raise TypeError(f"{func}: passes=2 reads the data twice; this reader has no "
                            "rewind(): pass a list of batches, a callable returning a fresh "
                            "iterable, or a reader with rewind()")
        return data
    if iter(data) is data:
        raise TypeError(f"{func}: passes=2 reads the data twice; an iterator can be read once: "
                        "pass a list of batches or a callable returning a fresh iterable")
    return data


class MinMaxCalibrater:
    """ORT's ``MinMaxCalibrater`` on batches of arrays (no model).

    Each batch is reduced at once to its per-tensor ``nanmin`` / ``nanmax``
    (``per_channel``: per channel of axis 1); ``collect_data(batches)`` is one
    ORT call: ``nanmin`` / ``nanmax`` over the call's batches
    (``moving_average``: ``nanmean``), ``symmetric`` -> ``(-m, m)``, merged
    with earlier calls by ``min`` / ``max`` or the float32 EMA
    ``old + c (new - old)``.  Memory: one ``(C,)`` pair per batch of a call.

    Options beyond ORT's: ``ema_per_batch`` (every batch one EMA step);
    ``ort_bug_max_intermediate`` (ORT's loss of every ``k``-th batch group;
    by default every ``k`` batches are merged as one call, as ORT 1.17 did).
    ``tensors``: the names to calibrate (default: every name in the batches);
    ``executor``: a :func:`tensor_executor` reducing the tensors of a batch
    in parallel (None: one after the other).
    """

    method = CalibrationMethod.MinMax

    def __init__(self, symmetric=False, moving_average=False, averaging_constant=0.01,
                 max_intermediate_outputs=None, per_channel=False, *, tensors=None,
                 ema_per_batch=False, ort_bug_max_intermediate=False, executor=None):
        if not 0 <= averaging_constant <= 1:
            raise ValueError("Invalid averaging constant, which should not be < 0 or > 1.")
        if max_intermediate_outputs is not None and (
                isinstance(max_intermediate_outputs, bool) or
                not isinstance(max_intermediate_outputs, numbers.Integral) or
                max_intermediate_outputs < 1):
            raise ValueError(f"max_intermediate_outputs must be a positive int or None, got "
                             f"{max_intermediate_outputs!r}")
        self.symmetric = bool(symmetric)
        self.moving_average = bool(moving_average)
        self.averaging_constant = averaging_constant
        self.max_intermediate_outputs = max_intermediate_outputs
        self.per_channel = bool(per_channel)
        self.tensors = None if tensors is None else list(tensors)
        self.ema_per_batch = bool(ema_per_batch)
        self.ort_bug_max_intermediate = bool(ort_bug_max_intermediate)
        self.executor = executor
        self.calibrate_tensors_range = None
        self.nan_batches = {}

    def _reduce(self, name, x):
        """ORT's ReduceMin / ReduceMax of one batch, NaN skipped (module doc #9)."""
        x = np.asarray(x)
        if x.dtype.kind != "f":
            raise TypeError(f"tensor {name!r}: calibrated tensors are float16 / float32, "
                            f"got {x.dtype}")
        if self.per_channel and x.ndim >= 2:
            from ... import ops
            lo, hi = ops.minmax(x, axis=1, nan_policy="omit")
            nan = lo > hi  # empty or all-NaN channels
            if x.size and nan.any():
                lo, hi = lo.copy(), hi.copy()
                lo[nan] = hi[nan] = np.nan
                self.nan_batches[name] = self.nan_batches.get(name, 0) + 1
            return lo.reshape(-1), hi.reshape(-1)
        flat = np.ascontiguousarray(x).reshape(-1)
        if flat.dtype in (np.float32, np.float64):
            lo, hi, flags = K.minmax(flat, _threads(flat.shape[0]))
            nan = bool(flags & 1)
            if lo == 0:  # a zero minimum: -0.0 when one was seen (-0.0 < +0.0)
                lo = -0.0 if flags & 2 else 0.0
            if hi == 0:
                hi = 0.0 if flags & 4 else -0.0
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                nan = bool(np.isnan(flat).any())
                lo = np.nanmin(flat) if flat.size else np.inf
                hi = np.nanmax(flat) if flat.size else -np.inf
        if nan:
            self.nan_batches[name] = self.nan_batches.get(name, 0) + 1
            if flat.size and lo > hi:
                lo = hi = np.nan
        return np.array([lo], dtype=x.dtype), np.array([hi], dtype=x.dtype)

    def _select(self, batch):
        if self.tensors is None:
            return batch.items()
        missing = [t for t in self.tensors if t not in batch]
        if missing:
            raise KeyError(f"collect_data: the batch has no tensor {missing[0]!r} "
                           f"(it has {', '.join(map(repr, batch))})")
        return ((t, batch[t]) for t in self.tensors)

    def collect(self, batch):
        """One ORT ``collect_data`` call with this one batch."""
        self.collect_data([batch])

    def collect_data(self, data):
        """One ORT ``collect_data`` call over the batches of ``data`` (a
        CalibrationDataReader, an iterable of dicts or a callable)."""
        k = self.max_intermediate_outputs
        call, buffered = {}, 0
        for batch in iter_batches(data):
            items = list(self._select(batch))
            ranges = _map_tensors(self.executor, lambda item: self._reduce(*item), items)
            for (name, _), (lo, hi) in zip(items, ranges):
                mins, maxs = call.setdefault(name, ([], []))
                mins.append(lo)
                maxs.append(hi)
            buffered += 1
            if self.ema_per_batch or (k is not None and buffered == k):
                if not (k is not None and buffered == k and self.ort_bug_max_intermediate):
                    self._finish_call(call)
                call, buffered = {}, 0
        if not call and self.calibrate_tensors_range is None:
            raise ValueError("No data is collected.")
        if call:
            self._finish_call(call)

    def _finish_call(self, call):
        new = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN batches: NaN, as in ORT
            for name, (mins, maxs) in call.items():
                if self.moving_average:
                    lo = np.nanmean(mins, axis=0)
                    hi = np.nanmean(maxs, axis=0)
                else:
                    lo = np.nanmin(mins, axis=0)
                    hi = np.nanmax(maxs, axis=0)
                if self.symmetric:
                    m = np.nanmax([np.abs(lo), np.abs(hi)], axis=0)
                    lo, hi = -m, m
                new[name] = (lo, hi)
        old = self.calibrate_tensors_range
        if old:
            for name, (lo, hi) in list(new.items()):
                if name not in old:
                    continue
                olo, ohi = old[name]
                if self.moving_average:
                    lo = olo + self.averaging_constant * (lo - olo)
                    hi = ohi + self.averaging_constant * (hi - ohi)
                elif np.size(lo) == 1:
                    lo, hi = min(olo, lo), max(ohi, hi)
                else:  # ORT fails here (truth value of an array); merged channel-wise
                    lo, hi = np.fmin(olo, lo), np.fmax(ohi, hi)
                new[name] = (lo, hi)
            merged = dict(old)
            merged.update(new)
            new = merged
        self.calibrate_tensors_range = new

    def compute_data(self):
        """:class:`TensorsData`: float32 ``(C,)`` arrays ``lowest`` / ``highest``."""
        if self.calibrate_tensors_range is None:
            raise ValueError("No data is collected.")
        return TensorsData(CalibrationMethod.MinMax, {
            k: TensorData(lowest=lo, highest=hi) for k, (lo, hi) in
            self.calibrate_tensors_range.items()})


class _HistogramCalibrater:
    """Streaming twin of ORT's ``HistogramCalibrater`` (module docstring:
    ``passes=1`` -- one ORT call per batch; ``passes=2`` -- one ORT call per
    ``collect_data``).  ``executor``: a :func:`tensor_executor` reducing the
    tensors of a batch in parallel (the result does not depend on it)."""

    method = None
    _name = None

    def __init__(self, *, symmetric, num_bins, num_quantized_bins, percentile, scenario,
                 passes, tensors, executor):
        if passes not in (1, 2):
            raise ValueError(f"passes must be 1 (one ORT call per batch) or 2 (one ORT call per "
                             f"collect_data), got {passes!r}")
        for name, v in (("num_bins", num_bins), ("num_quantized_bins", num_quantized_bins)):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        self.collector = HistogramCollector(self._name, symmetric, int(num_bins),
                                            int(num_quantized_bins), percentile, scenario)
        self.passes = passes
        self.tensors = None if tensors is None else list(tensors)
        self.executor = executor
        self.nan_batches = {}
        self.batches = 0

    symmetric = property(lambda self: self.collector.symmetric)
    num_bins = property(lambda self: self.collector.num_bins)

    def _select(self, batch):
        return MinMaxCalibrater._select(self, batch)

    def _arrays(self, batch):
        return [(name, _flat(x), np.shape(x)) for name, x in self._select(batch)]

    def _need_absmin(self, name):
        """Symmetric Percentile: min |x| is the first call's lower edge."""
        return self.collector.absolute and name not in self.collector.histogram_dict

    def _collect_tensor(self, item):
        name, a, _ = item
        col = self.collector
        stats = col.new_stats(name)
        stats.add(a, need_absmin=self._need_absmin(name))
        self._note_nan(name, stats.any_nan)
        col.finish(name, stats, col.plan(name, stats).add(a))

    def collect(self, batch):
        """One ORT ``collect_data`` call with this one batch (one pass)."""
        _map_tensors(self.executor, self._collect_tensor,
                     self._arrays(_check_batch(batch, "collect")))
        self.batches += 1

    def _note_nan(self, name, nan):
        if nan:
            self.nan_batches[name] = self.nan_batches.get(name, 0) + 1

    def collect_data(self, data):
        """``passes=1``: :meth:`collect` for every batch.  ``passes=2``: one ORT
        call over all the batches (the data is read twice)."""
        if self.passes == 1:
            n = self.batches
            for batch in iter_batches(data):
                self.collect(batch)
            if self.batches == n and not self.collector.histogram_dict:
                raise ValueError("No data is collected.")
            return
        again = _second_pass(data, "collect_data")
        col = self.collector
        stats = {}
        nans = {}

        def add_range(item):
            name, a, shape = item
            if stats[name].add(a, need_absmin=self._need_absmin(name), shape=shape):
                nans[name] = nans.get(name, 0) + 1   # one thread per tensor

        for batch in iter_batches(data):
            items = self._arrays(batch)
            for name, _, _ in items:
                stats.setdefault(name, col.new_stats(name))
            _map_tensors(self.executor, add_range, items)
        if not stats:
            raise ValueError("No data is collected.")
        plans = {name: col.plan(name, st) for name, st in stats.items()}
        if hasattr(again, "rewind"):
            again.rewind()
        for batch in iter_batches(again):
            _map_tensors(self.executor, lambda item: plans[item[0]].add(item[1]),
                         [item for item in self._arrays(batch) if item[0] in plans])
            self.batches += 1
        for name, st in stats.items():
            if name in nans:
                self.nan_batches[name] = self.nan_batches.get(name, 0) + nans[name]
            col.finish(name, st, plans[name])

    def compute_data(self):
        return TensorsData(self.method, self.collector.compute_collection_result())


class EntropyCalibrater(_HistogramCalibrater):
    """ORT's ``EntropyCalibrater`` (KL divergence, :func:`get_entropy_threshold`).
    ORT's defaults ``num_bins = num_quantized_bins = 128`` give one candidate,
    i.e. MinMax over each call (surprise 1)."""

    method = CalibrationMethod.Entropy
    _name = "entropy"

    def __init__(self, num_bins=128, num_quantized_bins=128, symmetric=False, *, passes=1,
                 tensors=None, executor=None):
        super().__init__(symmetric=symmetric, num_bins=num_bins,
                         num_quantized_bins=num_quantized_bins, percentile=99.999,
                         scenario="same", passes=passes, tensors=tensors, executor=executor)


class PercentileCalibrater(_HistogramCalibrater):
    """ORT's ``PercentileCalibrater`` (:meth:`HistogramCollector.compute_percentile`);
    ``symmetric=True`` (ORT's default) bins ``|x|``."""

    method = CalibrationMethod.Percentile
    _name = "percentile"

    def __init__(self, num_bins=2048, percentile=99.999, symmetric=True, *, passes=1,
                 tensors=None, executor=None):
        if not 0 <= percentile <= 100:
            raise ValueError(f"Invalid percentile. Must be in range 0 <= percentile <= 100, "
                             f"got {percentile!r}")
        super().__init__(symmetric=symmetric, num_bins=num_bins, num_quantized_bins=128,
                         percentile=percentile, scenario="same", passes=passes, tensors=tensors,
                         executor=executor)


class DistributionCalibrater(_HistogramCalibrater):
    """ORT's ``DistributionCalibrater`` (float 8: mean and std of the
    histogram, :meth:`HistogramCollector.compute_distribution`)."""

    method = CalibrationMethod.Distribution
    _name = "distribution"

    def __init__(self, num_bins=2048, scenario="same", *, passes=1, tensors=None, executor=None):
        if scenario not in ("same", "p3"):
            raise ValueError("Invalid scenario. Must be in {'same', 'p3'}.")
        super().__init__(symmetric=False, num_bins=num_bins, num_quantized_bins=128,
                         percentile=99.999, scenario=scenario, passes=passes, tensors=tensors,
                         executor=executor)


def _method_of(method):
    if isinstance(method, CalibrationMethod):
        return method
    if type(method).__name__ == "CalibrationMethod" and hasattr(method, "name"):
        return CalibrationMethod[method.name]
    if isinstance(method, str):
        for m in CalibrationMethod:
            if m.name.lower() == method.lower():
                return m
    raise ValueError(f"Unsupported calibration method {method!r} (choose from "
                     f"{', '.join(m.name for m in CalibrationMethod)})")


#: create_calibrator's extra_options per method, with ORT's defaults
EXTRA_OPTIONS = {
    CalibrationMethod.MinMax: {"symmetric": False, "moving_average": False,
                               "averaging_constant": 0.01, "max_intermediate_outputs": None,
                               "per_channel": False},
    CalibrationMethod.Entropy: {"symmetric": False, "num_bins": 128, "num_quantized_bins": 128},
    CalibrationMethod.Percentile: {"symmetric": True, "num_bins": 2048, "percentile": 99.999},
    CalibrationMethod.Distribution: {"num_bins": 2048, "scenario": "same"},
}


def create_calibrator(calibrate_method=CalibrationMethod.MinMax, extra_options=None, **kwargs):
    """The calibrator ORT's ``create_calibrator`` would build, with the same
    ``extra_options`` keys and defaults (unknown keys are refused); ``kwargs``
    pass quantcore's own options (``passes``, ``tensors``, ...)."""
    method = _method_of(calibrate_method)
    opts = dict(EXTRA_OPTIONS[method])
    unknown = sorted(set(extra_options or {}) - set(opts))
    if unknown:
        raise ValueError(f"create_calibrator: unknown extra_options {unknown} for {method.name} "
                         f"(known: {sorted(opts)})")
    opts.update(extra_options or {})
    cls = {CalibrationMethod.MinMax: MinMaxCalibrater,
           CalibrationMethod.Entropy: EntropyCalibrater,
           CalibrationMethod.Percentile: PercentileCalibrater,
           CalibrationMethod.Distribution: DistributionCalibrater}[method]
    return cls(**opts, **kwargs)
