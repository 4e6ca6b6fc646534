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

Layout (one module per section): ``qtypes`` (tensor types, enums, dtypes),
``executor`` (kernel threads, the tensor executor), ``qparams`` (qparams and
Q/DQ), ``histogram`` (``np_histogram``, :class:`HistogramCollector`, the
threshold searches), ``tables`` (``TensorData(s)``, their JSON and the
calibration table) and ``calibrators``; every name is re-exported here.
"""
from .qtypes import (  # noqa: F401 - the package's names
    VERSIONS, TENSOR_TYPES, QuantType, QuantFormat, CalibrationMethod, type_name, np_dtype,
)
from .executor import (  # noqa: F401 - the package's names
    _threads, kernel_threads, tensor_executor, _map_tensors,
)
from .qparams import (  # noqa: F401 - the package's names
    get_qmin_qmax_for_qType, get_qrange_for_qType, compute_scale_zp, snap_zero_point_to_uint8,
    _STD_F8, compute_scale_zp_float8, compute_scale_zp_blocked, quantize_nparray,
    compute_data_quant_params, quantize_data, pack_bytes_to_4bit, quantize_weight,
    adjust_weight_scale_for_int32_bias, quantize_bias, quantize_linear, dequantize_linear,
)
from .histogram import (  # noqa: F401 - the package's names
    np_histogram, HistogramCollector, smooth_distribution, entropy, entropy_kl,
    get_entropy_threshold, _single_entropy_window,
)
from .tables import (  # noqa: F401 - the package's names
    TensorData, TensorsData, save_tensors_data, load_tensors_data, write_calibration_table,
)
from .calibrators import (  # noqa: F401 - the package's names
    iter_batches, _second_pass, MinMaxCalibrater, EntropyCalibrater, PercentileCalibrater,
    DistributionCalibrater, _method_of, EXTRA_OPTIONS, create_calibrator,
)

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
