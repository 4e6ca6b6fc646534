"""quantcore's ranges handed to ONNX Runtime's ``quantize_static`` in
memory: no calibration cache, no text format on the way.

``quantize_static`` (ORT 1.32, ``onnxruntime/quantization/quantize.py``)
makes its calibrator with the module-level name ``create_calibrator``, calls
``collect_data(calibration_data_reader)`` (``CalibStridedMinMax=k``: once
per ``set_range`` of ``len(reader)``), then ``compute_data()``, which must
return ORT's ``TensorsData``, and hands that to its quantizer.
:func:`quantize_static_with` runs ORT's function whole, with that one name
answering, in this thread and for this call only, a calibrator whose
``compute_data`` returns quantcore's ranges (ORT's own objects, built from
:meth:`~quantcore.compat.onnxruntime.TensorsData.to_ort`) and whose
``collect_data`` reads nothing.  Every other step (the model's shape
inference, the opset update, the argument checks, the quantizer, the model
writing) is ORT's, as in its default call with a reader; the quantizer sees
the numpy values ORT's own calibrator would hand it, not their JSON round
trip.

The name is replaced once, by a function that defers to ORT's own unless
the calling thread has ranges pending (other threads, and ORT called
directly, get ORT's calibrators).  If a later ORT stops looking the name up
(the ranges not taken), the call fails with a RuntimeError rather than
writing a model from ranges that are not ours.
"""
import importlib
import threading

_STATE = threading.local()
_INSTALL = threading.Lock()
_ORIGINAL = []


class _HandedCalibrator:
    """What ``quantize_static`` gets from ``create_calibrator``: the ranges
    computed already."""

    def __init__(self, tensors_range):
        self._ranges = tensors_range

    def collect_data(self, data_reader):
        """Nothing to read (the reader is :class:`_NoBatches`)."""

    def compute_data(self):
        return self._ranges


class _NoBatches:
    """The reader handed to ``quantize_static`` (it must not be None): no
    batch; ``len`` is the stride so that ``CalibStridedMinMax`` makes one
    ``collect_data`` call."""

    def __init__(self, stride):
        self._len = int(stride or 0)

    def get_next(self):
        return None

    def __len__(self):
        return self._len

    def set_range(self, start_index, end_index):
        pass


def _create_calibrator(*args, **kwargs):
    pending = getattr(_STATE, "ranges", None)
    if pending is None:
        return _ORIGINAL[0](*args, **kwargs)
    _STATE.ranges = None    # taken: once per call
    return _HandedCalibrator(pending)


def _install():
    """Put :func:`_create_calibrator` in quantize.py's namespace (once)."""
    # (the module: the package's name "quantize" is a function)
    ort_quantize = importlib.import_module("onnxruntime.quantization.quantize")
    with _INSTALL:
        if not _ORIGINAL:
            if "create_calibrator" not in ort_quantize.quantize_static.__code__.co_names:
                raise RuntimeError("this onnxruntime's quantize_static does not make its "
                                   "calibrator with create_calibrator: quantcore cannot hand "
                                   "it the ranges (use calibration_cache_path)")
            _ORIGINAL.append(ort_quantize.create_calibrator)
            ort_quantize.create_calibrator = _create_calibrator
    return ort_quantize.quantize_static


def quantize_static_with(tensors_range, model_input, model_output, *, calibrate_method,
                         extra_options=None, **kwargs):
    """ORT's ``quantize_static(model_input, model_output, reader,
    calibrate_method=..., extra_options=..., **kwargs)`` with quantcore's
    ``tensors_range`` (a :class:`~quantcore.compat.onnxruntime.TensorsData`)
    as its calibrator's result: ORT writes the model; no cache is read or
    written (``calibration_cache_path`` must not be in ``kwargs``)."""
    quantize_static = _install()
    stride = (extra_options or {}).get("CalibStridedMinMax")
    _STATE.ranges = tensors_range.to_ort()
    try:
        quantize_static(model_input, model_output, _NoBatches(stride),
                        calibrate_method=calibrate_method, extra_options=extra_options,
                        calibration_cache_path=None, **kwargs)
        if getattr(_STATE, "ranges", None) is not None:
            raise RuntimeError("onnxruntime's quantize_static did not take quantcore's ranges "
                               "(its create_calibrator was not called)")
    finally:
        _STATE.ranges = None
