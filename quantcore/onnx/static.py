"""``quantize_static``'s drop-in (:func:`quantize`: ORT's parameters,
defaults and extra_options, calibrated by quantcore, the model written by
ORT from the ranges handed to it in memory: :mod:`.handoff`) and the comparison of a float and a
quantized model (:func:`evaluate`, :func:`sqnr_db`)."""
import contextlib
import os

import numpy as np

from .._files import atomic_path, refuse_same_file
from ..compat import onnxruntime as O
from .calibration import ORT_METHODS, _method_name
from .cluster import calibrate
from .handoff import ort_quantize_static, quantize_static_with
from .readers import _feeds
from .session import FeedChecker, _label, _one_line, _onnx, _ort_session

#: quantize_static's defaults (ORT 1.32), which :func:`quantize` shares
QUANTIZE_DEFAULTS = {
    "calibration_data_reader": None, "quant_format": O.QuantFormat.QDQ,
    "op_types_to_quantize": None, "per_channel": False, "reduce_range": False,
    "activation_type": O.QuantType.QInt8, "weight_type": O.QuantType.QInt8,
    "nodes_to_quantize": None, "nodes_to_exclude": None, "use_external_data_format": False,
    "calibrate_method": O.CalibrationMethod.MinMax, "calibration_providers": None,
    "extra_options": None, "calibration_cache_path": None,
}

#: quantize_static's extra_options that configure the calibrator (ORT's mapping)
CALIB_OPTION_KEYS = {"CalibTensorRangeSymmetric": "symmetric",
                     "CalibMovingAverage": "moving_average",
                     "CalibMovingAverageConstant": "averaging_constant",
                     "CalibMaxIntermediateOutputs": "max_intermediate_outputs",
                     "CalibPercentile": "percentile"}


def quantizable_op_types():
    """The op types ORT's quantize_static quantizes (and calibrates) by
    default: its QOperator and QDQ registries."""
    _onnx()
    from onnxruntime.quantization.registry import QDQRegistry, QLinearOpsRegistry
    return sorted(set(QLinearOpsRegistry) | set(QDQRegistry))


def _calibrator_options(method, extra_options):
    """The calibrator options quantize_static derives from its extra_options
    (the Calib* keys; those the method's calibrator does not take are
    ignored, as ORT's create_calibrator ignores them)."""
    calib = {}
    for k, v in (extra_options or {}).items():
        if k in CALIB_OPTION_KEYS:
            calib[CALIB_OPTION_KEYS[k]] = v
    if method not in ORT_METHODS:
        return {k: v for k, v in calib.items() if k == "percentile"}
    known = O.EXTRA_OPTIONS[O._method_of(method)]
    calib = {k: v for k, v in calib.items() if k in known}
    if calib.get("max_intermediate_outputs") is not None:
        calib["ort_bug_max_intermediate"] = True   # ORT 1.32 drops every full group
    return calib


def _enum_name(value, enum, what):
    """The member name of ORT's enum ``enum`` for a member (ORT's or
    compat's) or a name."""
    name = getattr(value, "name", value)
    if not isinstance(name, str) or name not in enum.__members__:
        raise ValueError(f"{what} must be one of {', '.join(enum.__members__)}, got {value!r}")
    return enum[name]


def quantize(model_input, model_output, calibration_data_reader=None,
             quant_format=O.QuantFormat.QDQ, op_types_to_quantize=None, per_channel=False,
             reduce_range=False, activation_type=O.QuantType.QInt8,
             weight_type=O.QuantType.QInt8, nodes_to_quantize=None, nodes_to_exclude=None,
             use_external_data_format=False, calibrate_method=O.CalibrationMethod.MinMax,
             calibration_providers=None, extra_options=None, calibration_cache_path=None, *,
             tensors_range=None, calibration_options=None, replay="auto", tensorrt_table=None,
             on_batch=None, parallel=None, client=None):
    """ONNX Runtime's ``quantize_static``, calibrated by quantcore.

    The parameters before ``*`` are ``quantize_static``'s, in its order, with
    its defaults (ORT 1.32; :data:`QUANTIZE_DEFAULTS`): ``quant_format``
    QDQ, ``op_types_to_quantize`` None (ORT's registries),
    ``per_channel`` False, ``reduce_range`` False, ``activation_type``
    QInt8, ``weight_type`` QInt8, ``nodes_to_quantize`` /
    ``nodes_to_exclude`` None, ``use_external_data_format`` False,
    ``calibrate_method`` MinMax, ``calibration_providers`` None (CPU),
    ``extra_options`` None, ``calibration_cache_path`` None.  Enums may be
    ORT's, :mod:`quantcore.compat.onnxruntime`'s or their names;
    ``calibrate_method`` may also name one of quantcore's methods
    (:data:`METHODS`).  With the defaults the result is ORT's default
    call's, bit for bit: the whole reader is one calibration call (module
    docstring), whatever the reader.

    Parameters
    ----------
    tensors_range : TensorsData or None
        Ranges to use (no calibration).
    calibration_options : dict or None
        The calibrator's own options that quantize_static cannot set
        (``num_bins``, ``num_quantized_bins``, ``scenario``, ...).
    replay : {"auto", "rerun", "spill"}
        :func:`calibrate`'s.
    tensorrt_table : path or None
        A folder that also gets ORT's TensorRT calibration files with the
        correct ``amax = max(|lowest|, |highest|)`` (ORT writes
        ``max(highest, lowest)``).
    on_batch, parallel
        :func:`calibrate`'s.
    client : distributed.Client or None
        Calibrate on its workers (:mod:`.cluster`): ``calibration_data_reader``
        is then the list of partitions; the same model.

    Returns
    -------
    CalibrationResult or None
        None when no calibration ran (``tensors_range`` given, or an existing
        calibration cache).  The model (and its external data) is written
        atomically: ORT writes it into a temporary folder beside
        ``model_output``, renamed into place when it is done; a
        ``model_output`` that is ``model_input`` (by any path) is refused.
        Without ``calibration_cache_path`` it is
        :func:`calibrate`'s with ``histograms=False`` (ORT's default Entropy:
        one read of the data, ranges without counts; the same model).
    """
    onnx, _ = _onnx()
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType

    method = _method_name(calibrate_method, "method")
    if isinstance(model_input, (str, os.PathLike)):
        refuse_same_file(model_output, [model_input], "model_output")
    ort_kw = dict(
        quant_format=_enum_name(quant_format, QuantFormat, "quant_format"),
        op_types_to_quantize=op_types_to_quantize, per_channel=per_channel,
        reduce_range=reduce_range,
        activation_type=_enum_name(activation_type, QuantType, "activation_type"),
        weight_type=_enum_name(weight_type, QuantType, "weight_type"),
        nodes_to_quantize=nodes_to_quantize, nodes_to_exclude=nodes_to_exclude,
        use_external_data_format=use_external_data_format,
        calibration_providers=calibration_providers, extra_options=extra_options)
    extra = dict(extra_options or {})
    if extra.get("SmoothQuant", False) and client is not None:
        raise ValueError("SmoothQuant is ORT's, run by ORT on one machine: not with client=")
    if extra.get("SmoothQuant", False):  # ORT transforms the model with the reader itself
        method = CalibrationMethod[_ort_method(method)]
        try:
            with _written(model_output) as out:
                ort_quantize_static(model_input, out, calibration_data_reader,
                                    calibrate_method=method,
                                    calibration_cache_path=calibration_cache_path, **ort_kw)
        except (RuntimeError, ImportError) as exc:  # ORT's: neural-compressor is missing
            raise ValueError(f"SmoothQuant (ORT's, run by ORT): {_one_line(exc)}") from None
        return None
    cached = calibration_cache_path is not None and os.path.isfile(calibration_cache_path)
    result = None
    if tensors_range is None and not cached:
        if calibration_data_reader is None:
            raise ValueError("quantize: give a calibration_data_reader, tensors_range or an "
                             "existing calibration_cache_path")
        opts = _calibrator_options(method, extra)
        opts.update(calibration_options or {})
        result = calibrate(model_input, calibration_data_reader, method, options=opts,
                           strided=extra.get("CalibStridedMinMax") or None, replay=replay,
                           op_types_to_calibrate=op_types_to_quantize or quantizable_op_types(),
                           providers=calibration_providers, on_batch=on_batch,
                           parallel=parallel, client=client,
                           # the quantizer reads the ranges only (a cache kept keeps the counts)
                           histograms=calibration_cache_path is not None)
        tensors_range = result.tensors_range
    if cached:
        tensors_range = O.load_tensors_data(calibration_cache_path)
    elif calibration_cache_path is not None:
        O.save_tensors_data(tensors_range, calibration_cache_path)
    method = CalibrationMethod[tensors_range.calibration_method.name]
    try:
        with _written(model_output) as out:
            if cached:      # ORT reads the user's cache, as ORT does
                ort_quantize_static(model_input, out, None, calibrate_method=method,
                                    calibration_cache_path=calibration_cache_path, **ort_kw)
            else:           # the ranges handed over in memory (onnx.handoff)
                quantize_static_with(tensors_range, model_input, out, calibrate_method=method,
                                     **ort_kw)
    except (ValueError, TypeError, OSError):
        raise
    except Exception as exc:  # ORT's quantizer: NotImplementedError, AssertionError, ...
        raise ValueError(f"{_label(model_input)}: onnxruntime's quantizer failed: "
                         f"{type(exc).__name__}: {_one_line(exc)}") from None
    if tensorrt_table:
        os.makedirs(tensorrt_table, exist_ok=True)
        O.write_calibration_table(tensors_range, tensorrt_table, absmax=True)
    return result


def _written(model_output):
    """The path ORT writes the model to: for a path, one in a temporary
    folder beside it, renamed into place (with its external data) once ORT
    is done (quantcore._files.atomic_path: a previous model survives any
    failure)."""
    if isinstance(model_output, (str, os.PathLike)):
        return atomic_path(model_output)
    return contextlib.nullcontext(model_output)


def _ort_method(method):
    if method not in ORT_METHODS:
        raise ValueError(f"SmoothQuant runs ORT's own calibration: calibrate_method must be one "
                         f"of {', '.join(ORT_METHODS)}, got {method!r}")
    return O._method_of(method).name


def sqnr_db(reference, other):
    """Signal-to-quantization-noise ratio ``10 log10(sum r^2 / sum (r - o)^2)``
    in float64 (inf when equal)."""
    r = np.asarray(reference, dtype=np.float64)
    noise = np.sum((r - np.asarray(other, dtype=np.float64)) ** 2)
    signal = np.sum(r ** 2)
    if noise == 0:
        return float("inf")
    return float(10 * np.log10(signal / noise)) if signal > 0 else float("-inf")


def evaluate(float_model, quant_model, data, labels=None, providers=None):
    """Outputs of both models on ``data`` (one pass each batch): ``{"sqnr_db":
    {output: dB}, "accuracy": (float, quantized) or None}``; accuracy is the
    argmax of the first output over its last axis against ``labels`` (one
    label per row of the first output, in batch order: a ValueError when the
    counts differ)."""
    sessions = []
    for m in (float_model, quant_model):
        src = os.fspath(m) if isinstance(m, (str, os.PathLike)) else m.SerializeToString()
        sessions.append(FeedChecker(_ort_session(src, None, providers, _label(m))))
    names = [o.name for o in sessions[0].sess.get_outputs()]
    sessions[0].outputs = sessions[1].outputs = names
    if labels is not None:
        labels = np.asarray(labels).reshape(-1)
    sig = {n: 0.0 for n in names}
    noise = {n: 0.0 for n in names}
    correct, seen = [0, 0], 0
    for i, feed in enumerate(_feeds(data)):
        ref = sessions[0].run(feed, i)
        out = sessions[1].run(feed, i)
        for n, r, o in zip(names, ref, out):
            r64, o64 = np.asarray(r, np.float64), np.asarray(o, np.float64)
            sig[n] += float(np.sum(r64 ** 2))
            noise[n] += float(np.sum((r64 - o64) ** 2))
        if labels is not None:
            rows = int(np.prod(ref[0].shape[:-1])) if ref[0].ndim else 1
            if seen + rows > len(labels):
                raise ValueError(f"labels: {len(labels)} label(s) for more rows than that "
                                 f"(batch {i} ends at row {seen + rows}): one label per row")
            lab = labels[seen:seen + rows].reshape(ref[0].shape[:-1])
            correct[0] += int(np.sum(np.argmax(ref[0], axis=-1) == lab))
            correct[1] += int(np.sum(np.argmax(out[0], axis=-1) == lab))
            seen += rows
    if labels is not None and seen != len(labels):
        raise ValueError(f"labels: {len(labels)} label(s) for {seen} row(s): one label per row")
    db = {n: (float("inf") if noise[n] == 0 else float(10 * np.log10(sig[n] / noise[n])))
          for n in names}
    acc = (correct[0] / seen, correct[1] / seen) if labels is not None and seen else None
    return {"sqnr_db": db, "accuracy": acc}
