"""Calibrate and quantize a real ONNX model with ONNX Runtime, streaming.

:func:`quantize` is a drop-in for ONNX Runtime 1.32's ``quantize_static``:
the same parameters, in the same order, with the same defaults
(:data:`QUANTIZE_DEFAULTS`, checked against ORT's signature by the tests)::

    calibration_data_reader=None, quant_format=QDQ,
    op_types_to_quantize=None (ORT's QOperator + QDQ registries),
    per_channel=False, reduce_range=False,
    activation_type=QInt8, weight_type=QInt8, nodes_to_quantize=None,
    nodes_to_exclude=None, use_external_data_format=False,
    calibrate_method=MinMax, calibration_providers=None,
    extra_options=None, calibration_cache_path=None

quantcore computes the activation ranges ORT's calibrator would compute on
the same reader, bit for bit, and hands them to ORT's own
``quantize_static`` in memory, as the result of its calibrator
(:mod:`.handoff`: no cache file, no text format on the way), so the
quantized model is written by ORT.  A ``calibration_cache_path`` the user
names is written (ORT's JSON, encoded in one call) and, when it exists
already, read by ORT as ORT reads it.
Every ``extra_options`` key is ORT's and means what it means there; the
``Calib*`` keys configure the calibrator as in ORT (``CalibStridedMinMax``,
``CalibMovingAverage``, ``CalibMovingAverageConstant``,
``CalibMaxIntermediateOutputs`` -- with ORT 1.32's loss of every full group
of buffered batches, see :mod:`quantcore.compat.onnxruntime` surprise 8 --,
``CalibTensorRangeSymmetric``, ``CalibPercentile``).  A calibration cache
that exists is used as ORT uses it (no calibration).  ``SmoothQuant``
(which transforms the model with the reader) is handed to ORT whole.

:func:`calibrate` runs the model with onnxruntime on a data reader (ORT's
``CalibrationDataReader`` protocol -- ``get_next()`` until it returns
``None`` -- or any iterable of ``{input name: array}`` feeds, or a callable
returning one), takes the activations ORT would calibrate (every float
input / output of the nodes of ``op_types_to_calibrate``, as ORT's
``select_tensors_to_calibrate`` picks them) as outputs of the same session,
and feeds each batch straight into a calibrator: the ORT-exact ones of
:mod:`quantcore.compat.onnxruntime` (``minmax``, ``entropy``,
``percentile``, ``distribution``) or quantcore's others
(``torch_histogram``: PyTorch's HistogramObserver search;
``nvidia_entropy`` / ``nvidia_mse`` / ``nvidia_percentile``: NVIDIA's
histogram calibrator).  No batch is kept beyond what the grouping below
needs (a chunk, the buffer of the single call).

How the batches are grouped into ORT ``collect_data`` calls (ORT's results
depend on it):

* default (``strided=None``): the whole reader is **one call**, as
  ``quantize_static`` without ``CalibStridedMinMax``.  MinMax keeps one
  ``(lo, hi)`` per batch: one pass.  The histogram methods need the range of
  the whole call before they count.  ``replay="auto"`` (default) reads the
  data once, holding the values in memory up to :data:`BUFFER_BYTES`
  (1 MiB: a small model's whole call); past that, it either appends them to
  a temporary file (spill) and counts from it, or -- a replayable reader (a
  list, a callable returning a fresh iterable, a reader with ``rewind()``,
  an iterable that is not its own iterator) whose model computes the values
  faster than the disk would write and read them back
  (:data:`SPILL_BYTES_PER_SECOND`) -- drops them and reads the data again
  (rerun).  A reader that cannot be replayed is never read twice.
  ``replay="spill"`` always spills past the buffer; ``replay="rerun"`` is
  :mod:`quantcore.compat.onnxruntime`'s two passes, batch by batch.  The
  batches come in chunks of :data:`CHUNK_BYTES`, each tensor's values of a
  chunk joined (a batch costs a few list operations, whatever the number of
  tensors).  Kept or spilled values are reduced after the model ran, tensor
  by tensor as ORT stacks them: its values gathered (up to
  :data:`GATHER_BYTES` at a time), its range, its counts -- one kernel call
  each for a small model's tensor.  When the data is read again, the first
  read takes the range statistics (a tensor under ``SMALL_TENSOR`` values
  once per chunk, a larger one batch by batch) and the second the counts.
  The results are the same, bit for bit (``CalibrationResult.replay`` says
  which way was taken: ``"memory"``, ``"spill"`` or ``"rerun"``).
* ``strided=k`` (ORT's ``CalibStridedMinMax=k``): every ``k`` consecutive
  batches are one call (``k`` batches of activations are buffered);
  ``strided=1`` is one call per batch, in one pass, nothing buffered.
  The number of batches must be a multiple of ``k`` (ORT's error).

``passes`` is the older name: ``passes=1`` is ``strided=1``, ``passes=2``
the default.

With ``parallel=True`` onnxruntime runs batch ``i + 1`` in a background
thread while the tensors of batch ``i`` are reduced by a pool of threads,
one per usable core, each kernel on one thread (the inference and the
kernels release the GIL; ORT's pool threads are told not to spin between
runs).  By default (``parallel=None``) there is no pool, and the inference
thread runs only where batches are reduced as they come (MinMax,
``strided``, quantcore's methods) and the first is small
(:data:`THREAD_BATCH_BYTES`): there the
per-tensor work is Python that overlaps the next run, while a large batch's
kernels would compete with onnxruntime's own threads for the cores.  The
result does not depend on it.

Feeds are checked before the model runs: an unknown or missing input name,
a dtype other than the input's (float64 for a float input included), a rank
or a fixed dimension other than the model's is a ValueError naming the
input, the batch and what was expected; a file that is not an ONNX model,
and any error onnxruntime raises, is a one-line ValueError naming the model.

Bad data gets a clear result: NaN activations are counted and reported
(``CalibrationResult.nan_batches``; the ranges ignore NaN as ORT's
``nanmin`` does; ORT's histogram methods fail on an all-NaN batch and so
does this module, naming the tensor); a constant or all-zero tensor gets the
range ORT gives it (a degenerate range quantizes with scale 1 / zero point
0, as in ORT); an empty reader raises ``ValueError("No data is collected.")``.
"""
# The package's modules, bottom up: session (the model, its session, the
# feeds' checks), readers (data readers, feeds, the spill file, the
# inference thread), calibration (calibrate and its one-call replay), cluster
# (calibrate across Dask workers; the public calibrate), handoff (the ranges
# handed to quantize_static in memory), static
# (quantize_static's drop-in, evaluate).  Every name is re-exported here.
from .calibration import (BUFFER_BYTES, CHUNK_BYTES, GATHER_BYTES, METHODS,  # noqa: F401
                          ORT_METHODS, QUANTCORE_METHODS, REPLAYS, SMALL_TENSOR,
                          SPILL_BYTES_PER_SECOND, THREAD_BATCH_BYTES, CalibrationResult,
                          make_calibrator)
from .cluster import calibrate, calibrate_on  # noqa: F401
from .readers import NpzReader, SpooledReader, _prefetch, replayable  # noqa: F401
from .session import FeedChecker, _ort_session, _session, load_model, select_tensors  # noqa: F401
from .static import (CALIB_OPTION_KEYS, QUANTIZE_DEFAULTS, evaluate,  # noqa: F401
                     quantizable_op_types, quantize, sqnr_db)

__all__ = ["METHODS", "ORT_METHODS", "QUANTIZE_DEFAULTS", "CalibrationResult", "select_tensors",
           "calibrate", "quantize", "quantizable_op_types", "evaluate", "sqnr_db", "NpzReader",
           "SpooledReader"]
