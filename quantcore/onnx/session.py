"""The model and its session: loading an ONNX model (shape-inferred), the
tensors ORT calibrates, the calibration session (every calibrated tensor an
output), and the feeds' checks before a run (:class:`FeedChecker`)."""
import os

import numpy as np

#: onnxruntime's input types as numpy dtypes (the feeds are checked against them)
_ORT_DTYPES = {"tensor(float)": "float32", "tensor(float16)": "float16",
               "tensor(double)": "float64", "tensor(int8)": "int8", "tensor(uint8)": "uint8",
               "tensor(int16)": "int16", "tensor(uint16)": "uint16", "tensor(int32)": "int32",
               "tensor(uint32)": "uint32", "tensor(int64)": "int64", "tensor(uint64)": "uint64",
               "tensor(bool)": "bool"}


def _onnx():
    try:
        import onnx
        import onnxruntime
    except ImportError as exc:  # pragma: no cover - the onnx extra installs both
        raise ImportError("quantcore.onnx needs onnx and onnxruntime "
                          "(pip install 'quantcore-fakequant[onnx]')") from exc
    return onnx, onnxruntime


def _one_line(exc):
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def _is_ort_error(exc):
    return type(exc).__module__.startswith(("onnxruntime", "onnx", "google.protobuf"))


def _label(model):
    return os.fspath(model) if isinstance(model, (str, os.PathLike)) else "the model"


def load_model(model):
    """A shape-inferred ModelProto of a path or a ModelProto (as ORT loads it);
    a file that is not an ONNX model is a ValueError naming it."""
    onnx, _ = _onnx()
    if isinstance(model, (str, os.PathLike)):
        if not os.path.isfile(model):
            raise FileNotFoundError(f"{os.fspath(model)}: no such ONNX model file")
        try:
            model = onnx.load(os.fspath(model))
        except Exception as exc:  # protobuf's DecodeError, onnx's own errors
            raise ValueError(f"{os.fspath(model)}: not an ONNX model ({_one_line(exc)})") from None
        if not model.graph.node and not model.graph.input:
            raise ValueError("not an ONNX model (no graph)")
    elif not isinstance(model, onnx.ModelProto):
        raise TypeError(f"model must be a path or an onnx.ModelProto, got {type(model).__name__}")
    try:
        return onnx.shape_inference.infer_shapes(model)
    except Exception as exc:
        raise ValueError(f"the model fails ONNX shape inference: {_one_line(exc)}") from None


def select_tensors(model, op_types_to_calibrate=None):
    """The tensors ORT calibrates: inputs and outputs of the nodes (of
    ``op_types_to_calibrate``, default all) known to value_info / the graph's
    inputs / outputs as FLOAT or FLOAT16, initializers excluded.  Sorted."""
    onnx, _ = _onnx()
    g = model.graph
    infos = {vi.name: vi for vi in g.value_info}
    infos.update({o.name: o for o in g.output})
    infos.update({i.name: i for i in g.input})
    inits = {i.name for i in g.initializer}
    float_types = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16}
    out = set()
    for node in g.node:
        if op_types_to_calibrate and node.op_type not in op_types_to_calibrate:
            continue
        for name in list(node.input) + list(node.output):
            vi = infos.get(name)
            if vi is not None and vi.type.HasField("tensor_type") and \
                    vi.type.tensor_type.elem_type in float_types and name not in inits:
                out.add(name)
    return sorted(out), infos


def _session(model, tensors, infos, providers):
    """An InferenceSession whose outputs are the calibrated tensors (graph
    optimizations off, as ORT's calibrator)."""
    onnx, ort = _onnx()
    aug = onnx.ModelProto()
    aug.CopyFrom(model)
    present = {o.name for o in aug.graph.output}
    for name in tensors:
        if name not in present:
            aug.graph.output.append(infos[name])
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    # ORT's pool threads spin after each run by default, holding the cores
    # that quantcore's statistics need while the next batch runs
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # ORT's CPU arena stays on (its default, as in ORT's calibrator): without
    # it every run's outputs are fresh mallocs, which glibc's heaps fragment
    # (measured: silero-vad's calibration peaked 14-25 MiB above its start
    # without, 6.5 with; the detector's 743 / 805 MiB, the same time)
    return _ort_session(aug.SerializeToString(), opts, providers, "the model")


def _ort_session(src, opts, providers, label):
    _, ort = _onnx()
    try:
        return ort.InferenceSession(src, sess_options=opts,
                                    providers=providers or ["CPUExecutionProvider"])
    except Exception as exc:
        if _is_ort_error(exc):
            raise ValueError(f"{label}: onnxruntime cannot load it: {_one_line(exc)}") from None
        raise


class FeedChecker:
    """Checks a feed against a session's inputs before it runs: the names,
    the dtypes (onnxruntime's input type), the ranks and the fixed
    dimensions; a ValueError names the input, the batch and what was
    expected.  ``run(feed, index)`` runs the session on a checked feed and
    turns onnxruntime's own errors into one-line ValueErrors."""

    def __init__(self, sess, outputs=None):
        self.sess = sess
        self.outputs = outputs
        self.inputs = {i.name: (i.type, i.shape) for i in sess.get_inputs()}

    def check(self, feed, index):
        where = f"batch {index}"
        if not isinstance(feed, dict):
            raise TypeError(f"{where}: a feed must be a dict {{input name: array}}, got "
                            f"{type(feed).__name__}")
        unknown = [n for n in feed if n not in self.inputs]
        missing = [n for n in self.inputs if n not in feed]
        if unknown or missing:
            raise ValueError(
                f"{where}: " + "; ".join(
                    ([f"the model has no input {', '.join(map(repr, unknown))}"] if unknown
                     else []) +
                    ([f"no array for model input {', '.join(map(repr, missing))}"] if missing
                     else [])) + f" (the model's inputs: {', '.join(self.inputs)})")
        for name, x in feed.items():
            otype, shape = self.inputs[name]
            if not isinstance(x, np.ndarray):
                raise TypeError(f"input {name!r} of {where}: expected a numpy array, got "
                                f"{type(x).__name__}")
            want = _ORT_DTYPES.get(otype)
            if want is not None and x.dtype != np.dtype(want):
                raise ValueError(f"input {name!r} of {where}: expected {want} ({otype}), got "
                                 f"{x.dtype}")
            if shape is not None and len(shape) != x.ndim:
                raise ValueError(f"input {name!r} of {where}: expected {len(shape)} dimensions "
                                 f"{_shape_text(shape)}, got shape {x.shape}")
            for axis, (want_dim, dim) in enumerate(zip(shape or (), x.shape)):
                if isinstance(want_dim, int) and want_dim >= 0 and want_dim != dim:
                    raise ValueError(f"input {name!r} of {where}: expected shape "
                                     f"{_shape_text(shape)}, got {x.shape} (axis {axis})")
        return feed

    def run(self, feed, index):
        self.check(feed, index)
        try:
            return self.sess.run(self.outputs, feed)
        except Exception as exc:
            if _is_ort_error(exc):
                raise ValueError(f"batch {index}: onnxruntime failed: {_one_line(exc)}") from None
            raise


def _shape_text(shape):
    return "[" + ", ".join(str(d) if isinstance(d, int) else (d or "?") for d in shape) + "]"
