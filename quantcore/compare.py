"""Where the frameworks disagree: one float32 tensor through every
framework's 8-bit per-tensor recipe, side by side.

The same calibration statistics (the tensor's ``min`` / ``max``; ``amax =
max(-min, max)`` where a recipe is symmetric) go through each framework's
compat layer: its qparams and its fake quantization.  Every recipe
*declares* its numeric conventions as data (:data:`FIELDS`); the cause of
a difference between two recipes is the list of declared conventions in
which they differ (:func:`causes`), never a guess from the numbers.

For a recipe ``r`` and the reference ``R``, over the elements of ``x``::

    mismatch  = mean(q_r != q_R)                     (integer codes)
    max_code  = max |q_r - q_R|
    max_abs   = max |y_r - y_R|                       (fake-quant outputs)
    sqnr_r    = 10 log10(sum x^2 / sum (x - y_r)^2)   (float64; inf if exact)

The integer code ``q`` is the recipe's own stored integer, in its own
range: the compat layer's integer output where it has one (ONNX Runtime's
``quantize_linear``, NVIDIA's ``tensor_quant``, OneFlow's ``Quantization``),
else ``rint(y / step) + zero_point`` in float64 (exact: ``y / step`` is an
integer to far better than 0.5).  ``step`` is the real value of one code
(``scale``; NVIDIA's ``1 / multiplier``).

>>> import numpy as np
>>> from quantcore.compare import compare
>>> x = np.array([-63.75, 0.25, 0.75], dtype=np.float32)   # scale 63.75 / 127.5 = 0.5
>>> r = compare(x, recipes=["torch_affine", "horizon", "horizon_even"], reference="horizon")
>>> [row.name for row in r.rows]
['torch_affine', 'horizon', 'horizon_even']
>>> r.row("horizon_even").causes
('rounding',)
>>> r.row("horizon_even").q, r.row("horizon").q   # ties -127.5, 0.5: to even vs up
(array([-128,    0,    2]), array([-127,    1,    2]))
"""
import dataclasses

import numpy as np

from . import qparams as Q
from .compat import horizon as horizon_c
from .compat import mindspore as mindspore_c
from .compat import nvidia as nvidia_c
from .compat import oneflow as oneflow_c
from .compat import onnxruntime as ort_c
from .compat import tensorflow as tf_c
from .compat.torch import MinMaxObserver as _TorchMinMax
from .compat.torch import fake_quantize_per_tensor_affine as _torch_fq

F32 = np.float32

#: the declared conventions, in the order causes are listed, with what each means
FIELDS = {
    "zero_in_range": "the [min, max] range widened to include 0 before the scale",
    "int_range": "the integer range [qmin, qmax] (narrow range drops a code)",
    "scale_formula": "how the scale follows from the statistics",
    "scale_arithmetic": "the precision the scale (and zero point) is computed in",
    "zero_point": "the zero-point rule (affine, nudged, or none)",
    "zero_point_rounding": "how the zero point is rounded",
    "rounding": "how x / scale is rounded to an integer (ties)",
    "apply_scale": "how x is brought to the integer grid",
    "zero_point_add": "where the zero point is added",
    "clamp": "what is clamped to the range",
    "dequantize": "how the fake-quant output is formed from the code",
}

_ZERO = dict(zero_point="none", zero_point_rounding=None, zero_point_add=None,
             zero_in_range=None, clamp="codes", dequantize="q * scale")


@dataclasses.dataclass(frozen=True)
class Recipe:
    """One framework's 8-bit per-tensor recipe.

    Attributes
    ----------
    name, framework : str
    conventions : dict
        A value for every key of :data:`FIELDS`; ``None`` where the field
        does not apply (a zero point of 0 is never added).
    run : callable
        ``run(x, lo, hi) -> (step, zero_point, q, y)``: float64 step, int
        zero point, int64 codes and the float32 fake-quant output.
    """

    name: str
    framework: str
    conventions: dict
    run: object


class Undefined(ValueError):
    """A recipe has no result on a tensor: the framework refuses its
    statistics or returns NaN / inf (TensorFlow and OneFlow when min == max)."""


def _codes(y, step, zp):
    with np.errstate(all="ignore"):
        t = np.rint(y.astype(np.float64) / step) + zp
    _finite(t)
    return t.astype(np.int64)


def _finite(y, *qparams):
    """Undefined unless the output and the qparams are finite."""
    if not (np.isfinite(y).all() and np.isfinite(np.asarray(qparams, np.float64)).all()):
        raise Undefined("the framework's scale, zero point or output is not finite for "
                        "these statistics")


def _run(recipe, x, lo, hi):
    """``recipe.run``, its refusals and non-finite results as :class:`Undefined`."""
    try:
        with np.errstate(all="ignore"):
            step, zp, q, y = recipe.run(x, lo, hi)
        _finite(y, step, zp)
        return step, zp, q, y
    except Undefined:
        raise
    except (ValueError, OverflowError) as exc:  # (MindSpore's refusal is a ValueError too)
        raise Undefined(" ".join(str(exc).split())) from None


def _torch(dtype, qscheme, qmin, qmax):
    def run(x, lo, hi):
        obs = _TorchMinMax(dtype=dtype, qscheme=qscheme)
        obs(np.array([lo, hi], dtype=F32))
        scale, zp = obs.calculate_qparams()
        s, z = float(scale[0]), int(zp[0])
        y = _torch_fq(x, s, z, qmin, qmax)
        return s, z, _codes(y, s, z), y
    return run


def _tf(narrow):
    def run(x, lo, hi):
        y = tf_c.fake_quant_with_min_max_vars(x, F32(lo), F32(hi), num_bits=8,
                                             narrow_range=narrow)
        _, _, scale, _, qzero = Q.nudge_tensorflow(F32(lo), F32(hi), int(narrow), 255)
        _finite(y, scale, qzero)
        s, z = float(scale[0]), int(qzero[0]) + int(narrow)   # (quant_zero is nzp - qmin)
        return s, z, _codes(y, s, z), y
    return run


def _ms(x, lo, hi):
    cell = mindspore_c.FakeQuantWithMinMaxObserver(min_init=float(lo), max_init=float(hi))
    y = cell(x)
    nmin, _, scale = Q.nudge_mindspore(F32(lo), F32(hi), 0, 255)
    s = float(scale[0])
    z = int(np.rint(-float(nmin[0]) / s))
    return s, z, _codes(y, s, z), y


def _oneflow(scheme):
    def run(x, lo, hi):
        stats = np.array([lo, hi], dtype=F32)
        scale, zp = oneflow_c.MinMaxObserver(quantization_scheme=scheme)(stats)
        q = oneflow_c.Quantization(quantization_scheme=scheme)(x, scale, zp)
        y = oneflow_c.FakeQuantization(quantization_scheme=scheme)(x, scale, zp)
        _finite(y, scale, zp)
        return float(scale[0]), int(zp[0]), q.astype(np.int64), y
    return run


def _nvidia(x, lo, hi):
    amax = F32(max(-lo, hi))
    q, mult = nvidia_c.tensor_quant(x, amax)
    y = nvidia_c.fake_tensor_quant(x, amax)
    return 1.0 / float(mult), 0, q.astype(np.int64), y


def _horizon(mode, qmin=None, qmax=None):
    def run(x, lo, hi):
        kwargs = {} if qmin is None else {"quant_min": qmin, "quant_max": qmax}
        fq = horizon_c.FakeQuantize(**kwargs)
        fq(np.array([lo, hi], dtype=F32))            # the observer sees the statistics
        fq.disable_observer()
        saved = horizon_c.QuantRoundMode.get()          # (a global of Horizon's)
        try:
            horizon_c.QuantRoundMode.set(mode)
            y = fq(x)
        finally:
            horizon_c.QuantRoundMode.set(saved)
        s = float(fq.scale[0])
        return s, 0, _codes(y, s, 0), y
    return run


def _ort(qtype, symmetric):
    def run(x, lo, hi):
        qmin, qmax = ort_c.get_qmin_qmax_for_qType(qtype, symmetric=symmetric)
        zp, scale = ort_c.compute_scale_zp(F32(lo), F32(hi), qmin, qmax, symmetric=symmetric)
        q = ort_c.quantize_linear(x, scale, zp)
        y = ort_c.dequantize_linear(q, scale, zp)
        return float(scale), int(zp), q.astype(np.int64), y
    return run


_AFFINE_RANGE = "(max - min) / (qmax - qmin)"
_HALF_RANGE = "amax / ((qmax - qmin) / 2)"

#: TensorFlow's nudged recipe (MindSpore's differs in its dequantization only).  TF
#: rounds the zero point half away from zero and MindSpore half up: the same on the
#: clamped zero point (>= qmin >= 0), so both are declared half_up
_TF = dict(zero_in_range=False, int_range=(0, 255), scale_formula=_AFFINE_RANGE,
           scale_arithmetic="float32", zero_point="nudged", zero_point_rounding="half_up",
           rounding="half_up", apply_scale="(x - nudged_min) / scale",
           zero_point_add="before rounding", clamp="values (nudged range)",
           dequantize="(q - zp) * scale")

#: every recipe; ``DEFAULT`` lists the ones compared unless chosen
RECIPES = {r.name: r for r in (
    Recipe("torch_affine", "PyTorch MinMaxObserver quint8 + fake_quantize_per_tensor_affine",
           dict(zero_in_range=True, int_range=(0, 255), scale_formula=_AFFINE_RANGE,
                scale_arithmetic="float32", zero_point="qmin - rint(min / scale)",
                zero_point_rounding="half_even", rounding="half_even",
                apply_scale="x * f32(1 / scale)", zero_point_add="after rounding",
                clamp="codes", dequantize="(q - zp) * scale"),
           _torch("quint8", "per_tensor_affine", 0, 255)),
    Recipe("torch_symmetric", "PyTorch MinMaxObserver qint8 per_tensor_symmetric",
           dict(_ZERO, int_range=(-128, 127), scale_formula=_HALF_RANGE,
                scale_arithmetic="float32", rounding="half_even",
                apply_scale="x * f32(1 / scale)"),
           _torch("qint8", "per_tensor_symmetric", -128, 127)),
    Recipe("tf", "TensorFlow fake_quant_with_min_max_vars", _TF, _tf(False)),
    Recipe("tf_narrow", "TensorFlow fake_quant_with_min_max_vars, narrow_range=True",
           dict(_TF, int_range=(1, 255)), _tf(True)),
    Recipe("mindspore", "MindSpore FakeQuantWithMinMaxObserver (inference, min/max_init)",
           dict(_TF, dequantize="q * scale + nudged_min"), _ms),
    Recipe("oneflow_affine", "OneFlow MinMaxObserver google/affine + FakeQuantization",
           dict(zero_in_range=False, int_range=(0, 255), scale_formula=_AFFINE_RANGE,
                scale_arithmetic="float32", zero_point="qmin - rint(min / scale)",
                zero_point_rounding="half_even", rounding="half_even",
                apply_scale="x / scale", zero_point_add="before rounding",
                clamp="codes", dequantize="(q - zp) * scale"),
           _oneflow("affine")),
    Recipe("oneflow_symmetric", "OneFlow MinMaxObserver google/symmetric + FakeQuantization",
           dict(_ZERO, int_range=(-128, 127), scale_formula="amax / (2**(b-1) - 1)",
                scale_arithmetic="float32", rounding="half_even", apply_scale="x / scale"),
           _oneflow("symmetric")),
    Recipe("nvidia", "NVIDIA pytorch_quantization tensor_quant (amax, narrow_range)",
           dict(_ZERO, int_range=(-127, 127), scale_formula="multiplier = qmax / amax",
                scale_arithmetic="float32", rounding="half_even",
                apply_scale="x * multiplier", dequantize="q / multiplier"),
           _nvidia),
    Recipe("horizon", "Horizon FakeQuantize qint8, QuantRoundMode bpu_round",
           dict(_ZERO, int_range=(-128, 127), scale_formula=_HALF_RANGE,
                scale_arithmetic="float32", rounding="half_up", apply_scale="x / scale"),
           _horizon("bpu_round")),
    Recipe("horizon_even", "Horizon FakeQuantize qint8, QuantRoundMode half_to_even",
           dict(_ZERO, int_range=(-128, 127), scale_formula=_HALF_RANGE,
                scale_arithmetic="float32", rounding="half_even", apply_scale="x / scale"),
           _horizon("half_to_even")),
    Recipe("horizon_even_narrow",
           "Horizon FakeQuantize qint8 [-127, 127], QuantRoundMode half_to_even",
           dict(_ZERO, int_range=(-127, 127), scale_formula=_HALF_RANGE,
                scale_arithmetic="float32", rounding="half_even", apply_scale="x / scale"),
           _horizon("half_to_even", -127, 127)),
    Recipe("ort_uint8", "ONNX Runtime compute_scale_zp uint8 + QuantizeLinear",
           dict(zero_in_range=True, int_range=(0, 255), scale_formula=_AFFINE_RANGE,
                scale_arithmetic="float64", zero_point="qmin - rint(min / scale)",
                zero_point_rounding="half_even", rounding="half_even",
                apply_scale="x / scale", zero_point_add="after rounding",
                clamp="codes", dequantize="(q - zp) * scale"),
           _ort(ort_c.QuantType.QUInt8, False)),
    Recipe("ort_int8_symmetric", "ONNX Runtime compute_scale_zp int8 symmetric + QuantizeLinear",
           dict(_ZERO, int_range=(-127, 127), scale_formula=_HALF_RANGE,
                scale_arithmetic="float64", rounding="half_even", apply_scale="x / scale"),
           _ort(ort_c.QuantType.QInt8, True)),
)}

DEFAULT = ("torch_affine", "torch_symmetric", "tf", "tf_narrow", "mindspore",
           "oneflow_affine", "oneflow_symmetric", "nvidia", "horizon", "ort_uint8",
           "ort_int8_symmetric")

for _r in RECIPES.values():  # every recipe declares every field, nothing else
    assert set(_r.conventions) == set(FIELDS), _r.name


def causes(a, b):
    """The declared conventions in which recipes ``a`` and ``b`` (names or
    :class:`Recipe`) differ, in :data:`FIELDS` order; a field that does not
    apply to one of them (``None``) is not a cause."""
    ca, cb = (_recipe(r).conventions for r in (a, b))
    return tuple(f for f in FIELDS
                 if ca[f] is not None and cb[f] is not None and ca[f] != cb[f])


def _recipe(r):
    if isinstance(r, Recipe):
        return r
    if r not in RECIPES:
        raise ValueError(f"recipe: unknown recipe {r!r}, expected one of "
                         f"{', '.join(RECIPES)}")
    return RECIPES[r]


@dataclasses.dataclass(frozen=True)
class Row:
    """One recipe's line of a :class:`Comparison` (module docstring); ``q``
    and ``y`` are the recipe's codes and fake-quant output (None without
    ``keep_arrays`` or a result)."""

    name: str
    step: float
    zero_point: int
    mismatch: float
    max_code_diff: int
    max_abs_diff: float
    sqnr_db: float
    causes: tuple
    q: np.ndarray = dataclasses.field(repr=False)
    y: np.ndarray = dataclasses.field(repr=False)
    #: why the recipe has no result on this tensor (its numbers are then NaN
    #: and ``q`` / ``y`` None); None when it has one
    undefined: str = None


@dataclasses.dataclass(frozen=True)
class Comparison:
    """The recipes' rows for one tensor, against ``reference``."""

    reference: str
    min: float
    max: float
    rows: tuple

    def row(self, name):
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(name)


def sqnr_db(x, y):
    """``10 log10(sum x^2 / sum (x - y)^2)`` in float64 (inf when ``y == x``)."""
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    noise = float(np.sum((x64 - y64) ** 2))
    signal = float(np.sum(x64 ** 2))
    if noise == 0.0:
        return float("inf")
    return 10.0 * np.log10(signal / noise) if signal > 0 else float("-inf")


def compare(x, recipes=DEFAULT, reference="torch_affine", *, keep_arrays=True):
    """Compare the recipes on the float32 tensor ``x`` (module docstring).

    Parameters
    ----------
    x : array_like of float32, at least one element, all finite
    recipes : sequence of recipe names (:data:`RECIPES`)
    reference : str
        A recipe name; added to ``recipes`` when missing.
    keep_arrays : bool
        Keep each row's codes ``q`` and output ``y`` (False: None, and only
        two recipes' arrays are held at a time).

    Returns
    -------
    Comparison
        A recipe without a result on ``x`` (the framework refuses its
        statistics or returns NaN, e.g. TensorFlow when ``min == max``) gets
        a row with ``undefined`` set; :class:`Undefined` (a ValueError) when
        that recipe is the reference.
    """
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise TypeError(f"x: expected a float32 array, got dtype {x.dtype}")
    if x.size == 0:
        raise ValueError("x: expected at least one element, got an empty array")
    if not np.isfinite(x).all():
        raise ValueError("x: expected finite values (NaN or inf would make the statistics "
                         "meaningless)")
    names = list(dict.fromkeys(recipes))
    if not names:
        raise ValueError("recipes: expected at least one recipe name")
    chosen = [_recipe(n) for n in names]
    ref = _recipe(reference)
    if ref.name not in names:
        chosen.insert(0, ref)
    x = np.ascontiguousarray(x).reshape(-1)
    lo, hi = F32(x.min()), F32(x.max())
    try:
        ref_result = _run(ref, x, lo, hi)
    except Undefined as exc:
        raise Undefined(f"reference: recipe {ref.name} has no result on this tensor "
                        f"(min {float(lo):.9g}, max {float(hi):.9g}): {exc}") from None
    _, _, q_ref, y_ref = ref_result
    y_ref64 = y_ref.astype(np.float64)
    rows = []
    nan = float("nan")
    for r in chosen:       # one recipe's arrays at a time (unless keep_arrays)
        try:
            step, zp, q, y = ref_result if r is ref else _run(r, x, lo, hi)
        except Undefined as exc:
            rows.append(Row(r.name, nan, 0, nan, 0, nan, nan, causes(ref, r), None, None,
                            str(exc)))
            continue
        dq = np.abs(q - q_ref)
        dy = np.abs(y.astype(np.float64) - y_ref64)
        rows.append(Row(r.name, step, zp, float(np.mean(dq != 0)), int(dq.max()),
                        float(dy.max()), sqnr_db(x, y), causes(ref, r),
                        q if keep_arrays else None, y if keep_arrays else None))
    return Comparison(ref.name, float(lo), float(hi), tuple(rows))


def table(comparison):
    """``(head, rows, notes)``: the comparison as strings, one row per
    recipe, and one note per recipe that differs from the reference in a
    declared convention (its causes; "no effect here" when neither a code
    nor an output differs)."""
    head = ("recipe", "scale", "zp", "codes != ref", "max |dq|", "max |dy|", "SQNR dB")
    rows, notes = [], []
    for r in comparison.rows:
        if r.undefined:
            rows.append((r.name, "-", "-", "-", "-", "-", "-"))
            notes.append(f"{r.name}: no result here: {r.undefined}")
            continue
        rows.append((r.name, f"{r.step:.6g}", str(r.zero_point), f"{100 * r.mismatch:.2f}%",
                     str(r.max_code_diff), f"{r.max_abs_diff:.3g}", f"{r.sqnr_db:.2f}"))
        if r.causes:
            effect = " (no effect here)" if r.mismatch == 0 and r.max_abs_diff == 0 else ""
            notes.append(f"causes of {r.name}: {', '.join(r.causes)}{effect}")
    return head, rows, notes


# ------------------------------------------------------------------ ONNX models
def _load_model(model):
    import onnx
    try:
        return onnx.shape_inference.infer_shapes(onnx.load(str(model)))
    except Exception as exc:  # protobuf's DecodeError, onnx's own errors
        raise ValueError(f"{model}: not an ONNX model ({' '.join(str(exc).split())})") from None


def _feeds(graph, inputs):
    inits = {i.name for i in graph.initializer}
    wanted = [i.name for i in graph.input if i.name not in inits]
    missing = sorted(set(wanted) - set(inputs))
    if missing:
        raise ValueError(f"--data: no array for the model input(s) {', '.join(missing)} "
                         f"(the data holds {', '.join(sorted(inputs)) or 'nothing'})")
    return {k: inputs[k] for k in wanted}


def _session(proto):
    import onnxruntime
    opts = onnxruntime.SessionOptions()
    opts.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    return onnxruntime.InferenceSession(proto.SerializeToString(), opts,
                                        providers=["CPUExecutionProvider"])


def model_tensors(model, inputs):
    """The float tensors of an ONNX model to compare: ``[(name, float32
    array)]``, its float initializers of more than one element (weights)
    and then the activations ONNX Runtime would calibrate
    (:func:`quantcore.onnx.select_tensors`) of one ORT run on the feeds
    ``inputs`` ({input name: array}, graph optimizations off, as ORT's
    calibrator).

    Parameters
    ----------
    model : str or os.PathLike
        An .onnx file.
    inputs : dict of str to ndarray
        One feed: every input of the model, whole.
    """
    from onnx import numpy_helper

    from .onnx import select_tensors
    proto = _load_model(model)
    graph = proto.graph
    feeds = _feeds(graph, inputs)
    weights = [(i.name, numpy_helper.to_array(i)) for i in graph.initializer]
    out = [(n, a.astype(F32)) for n, a in weights if a.dtype.kind == "f" and a.size > 1]
    names, infos = select_tensors(proto)
    present = {o.name for o in graph.output}
    for name in names:
        if name not in present:
            graph.output.append(infos[name])
    values = _session(proto).run(names, feeds)
    return out + [(n, np.asarray(v).astype(F32)) for n, v in zip(names, values)]


def _with_qdq(proto, qparams):
    """A copy of ``proto`` with QuantizeLinear -> DequantizeLinear after
    every tensor of ``qparams`` ({name: (scale, zero point, signed)}), its
    consumers reading the dequantized tensor; nodes kept in order."""
    import onnx
    from onnx import helper, numpy_helper
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    g = out.graph
    qdq = {}
    for name, (step, zp, signed) in qparams.items():
        g.initializer.extend([
            numpy_helper.from_array(np.array(step, F32), f"{name}/qc_scale"),
            numpy_helper.from_array(np.array(zp, np.int8 if signed else np.uint8),
                                    f"{name}/qc_zp")])
        qdq[name] = [
            helper.make_node("QuantizeLinear", [name, f"{name}/qc_scale", f"{name}/qc_zp"],
                             [f"{name}/qc_q"]),
            helper.make_node("DequantizeLinear",
                             [f"{name}/qc_q", f"{name}/qc_scale", f"{name}/qc_zp"],
                             [f"{name}/qc_dq"])]
    sources = {i.name for i in g.initializer} | {i.name for i in g.input}
    nodes = [n for name in qdq if name in sources for n in qdq[name]]
    for node in proto.graph.node:
        new = onnx.NodeProto()
        new.CopyFrom(node)
        del new.input[:]
        new.input.extend(f"{i}/qc_dq" if i in qdq else i for i in node.input)
        nodes.append(new)
        nodes.extend(n for o in node.output if o in qdq for n in qdq[o])
    del g.node[:]
    g.node.extend(nodes)
    return out


def qdq_accuracy(model, inputs, labels, recipes=DEFAULT):
    """The model's accuracy, float and with each recipe's qparams.

    Every tensor of :func:`model_tensors` gets the recipe's ``(scale, zero
    point)`` from its own min / max, as QuantizeLinear / DequantizeLinear
    nodes (ONNX Runtime's QDQ format: int8 for a signed range, else uint8);
    ORT then quantizes with *its* rounding (half to even, division) and the
    full range of the type, so this measures each recipe's qparams, not its
    rounding.  ``accuracy = mean(argmax(first output, -1) == labels)`` on
    the same feeds ``inputs`` the statistics came from.

    Returns
    -------
    dict
        ``{"float": accuracy, recipe: (accuracy, [tensors left in float: no
        result or a zero point outside the type])}``.
    """
    proto = _load_model(model)
    feeds = _feeds(proto.graph, inputs)
    labels = np.asarray(labels).reshape(-1)

    def accuracy(p):
        logits = np.asarray(_session(p).run(None, feeds)[0])
        if logits.reshape(-1, logits.shape[-1]).shape[0] != labels.size:
            raise ValueError(f"labels: expected {logits.size // logits.shape[-1]} labels "
                             f"(the model's first output is {list(logits.shape)}), got "
                             f"{labels.size}")
        return float(np.mean(np.argmax(logits, axis=-1).reshape(-1) == labels))
    tensors = model_tensors(model, inputs)
    result = {"float": accuracy(proto)}
    for name in recipes:
        r = _recipe(name)
        signed = r.conventions["int_range"][0] < 0
        qp, left = {}, []
        for t, x in tensors:
            flat = x.reshape(-1)
            if flat.size == 0 or not np.isfinite(flat).all():
                left.append(t)
                continue
            try:
                step, zp, _, _ = _run(r, flat, F32(flat.min()), F32(flat.max()))
            except Undefined:
                left.append(t)
                continue
            if not (-128 if signed else 0) <= zp <= (127 if signed else 255):
                left.append(t)
                continue
            qp[t] = (step, zp, signed)
        result[r.name] = (accuracy(_with_qdq(proto, qp)), left)
    return result
