"""PyTorch 2.13 ``torch.ao.quantization`` on numpy arrays (CPU, x86-64).

Observers, fake-quantize modules and the fake-quant functions of
``torch.ao.quantization`` as plain Python classes over numpy arrays, bit for
bit with torch 2.13.0+cpu on x86-64 (spec/torch.md; DECISIONS.md "PyTorch").
Torch dtypes and qschemes are given as strings (``"quint8"``,
``"torch.per_channel_symmetric"``, ...) or as torch's own objects
(``torch.quint8``, ``torch.per_channel_symmetric``; recognised by type, torch
is not imported for it); attributes hold the strings.  This layer translates arguments:
per-element work goes through :func:`quantcore.ops._affine`, statistics
through :mod:`quantcore.observers` / :func:`quantcore.minmax` /
:class:`quantcore.calib.TorchHistogram`, qparams through
:mod:`quantcore.qparams`.  (The LSQ backward is still evaluated here in
numpy: the core has no kernel for it yet.)

Exceptions keep torch's type and text: where torch fails an ``assert``
this layer raises :class:`~quantcore.compat._errors.AssertionValueError`
(an ``AssertionError`` and a ``ValueError``); torch's ``RuntimeError`` from
argument checks is :class:`~quantcore.compat._errors.RuntimeValueError`
(``RuntimeError`` and ``ValueError``), or ``RuntimeTypeError``
(``RuntimeError`` and ``TypeError``) for a wrong dtype ("Scale must be Float
...", "expected scalar type Float ..."), so ``except RuntimeError`` catches
what it catches with torch and ``except ValueError`` what it catches in the
rest of quantcore.  ``NotImplementedError`` (also torch's "... not
implemented for 'Int'" on integer input), ``IndexError`` and ``TypeError``
are kept.  Constructor checks run in torch's order with torch's texts
(embedded space runs included).

State is updated in place with torch's sharing semantics: observers'
``min_val`` / ``max_val`` / ``histogram`` / ``eps`` and FakeQuantize's
``scale`` / ``zero_point`` / enable flags keep their identity across
forwards, ``reset_min_max_vals`` (per tensor) and ``load_state_dict``, and
``state_dict()`` holds those very arrays (torch's state dict shares its
buffers' storage).  Assigning an attribute binds a new array, as assigning
a torch buffer does; so does HistogramObserver's ``load_state_dict`` for
``min_val`` / ``max_val``, which torch assigns from the state dict.  Where torch ``resize_``s a buffer (the first
per-channel forward, a per-channel ``load_state_dict`` of another channel
count) a new array is bound here: a numpy array cannot change its size
while other references to it may exist.

Torch quirks reproduced (the tests that show each, in tests/)
-------------------------------------------------------------
Observers
* qparams: true division ``f32(f32(max - min) / f32(qmax - qmin))``, no
  ``min == max`` special case (``[0, 0]`` gives scale eps); zero points int32
  (affine), int64 (symmetric), float32 unrounded (float_qparams); symmetric
  zp 128 for quint8 / uint8 default ranges even with reduce_range (uint8 +
  symmetric + reduce_range: range (0, 127), zp 128), ``(qmin + qmax) // 2``
  for a custom range, 32768 for uint16; x86 NaN / inf -> INT32_MIN with
  int32 wrap in the zp (NaN: ``clamp(qmin - INT32_MIN)``).
  [test_spec_minmax_vectors, test_spec_other_vectors,
  test_per_tensor_observers_random, test_per_channel_observers_random]
* ``min > max`` raises (also min = +inf with a finite max), NaN never trips
  it; ``([1.0], [0])`` with torch's warning before any data.
  [test_observer_runtime_quirks]
* Ranges: custom only when both ends are given; validation in torch's order
  and words (the numbers are checked before the integer requirement);
  reduce_range floors a custom range, is ignored for 16/32-bit types and
  warns (torch's text); the (0, 15) fall-back for quint4x2 / float8;
  is_dynamic only for MovingAverageMinMaxObserver with averaging_constant 1.
  [test_observer_constructors_match_torch,
  test_observer_constructor_errors_and_warnings]
* x is cast to float32 before reducing (float64 0.1 -> 0.10000000149,
  integer input read as float32); NaN propagates into min / max and stays.
  [*_observers_random, test_quirk_integer_inputs]
* Moving average ``m = f32(m + f32(f32(c) * f32(cur - m)))`` (c = 1 is not
  memoryless); first call exactly when ``min_val == +inf and max_val ==
  -inf`` (one infinite side averages into NaN); averaging_constant not
  range-checked; per channel: first call = empty buffers, ``x.ndim >= 2``
  and ch_axis out of range raise IndexError.
  [test_observer_runtime_quirks, *_observers_random]
* state_dict: torch's keys, and torch's version ``_metadata``; a plain
  mapping (an .npz / safetensors file) has no versions, so torch -- and this
  layer -- treat it as a version-1 checkpoint and reset observer ``eps`` to
  ``finfo(float32).eps`` (the key may even be missing); HistogramObserver
  turns [0]-shaped min / max of such dicts into +-inf.
  [test_quirk_plain_state_dict_resets_eps, state round trips in
  test_compat_torch_random.py]
* HistogramObserver: +-inf dropped with torch's warning; integer input
  raises NotImplementedError (no integer histc); ``dst_nbins = 2 ** bits``
  even with reduce_range / a custom range; histc / linspace / bucketize /
  cumsum / the greedy L2 search as torch computes them in float32.
  [test_histogram_observer, test_histogram_observer_random]

FakeQuantize, FixedQParamsFakeQuantize, FusedMovingAvgObsFakeQuantize
* Range checks against ``iinfo(dtype)`` (dtype from the keywords or the
  ``with_args`` partial), then the observer may change the range
  (``default_fake_quant`` is (0, 127)); uint8 enable flags, int64 in the
  fused module; ch_axis -1 per tensor; every predefined partial of
  ``torch.ao.quantization.fake_quantize`` with the same keywords.
  [test_fake_quantize_constructors_match_torch, test_fake_quantize_module_quirks,
  test_every_torch_fake_quantize_default_exists]
* qparams recomputed even when fake quant is disabled; the per-tensor path
  is the tensor-qparams op (zero point read as a checked int32 and
  truncated, not range checked); a per-channel FakeQuantize with a negative
  ch_axis fails in forward; an empty input copies the default qparams (with
  the warning); FixedQParamsFakeQuantize shares the observer's buffers;
  ``backward`` is the STE mask of the last forward (identity when fake
  quant was off). [test_fake_quantize_modules_random,
  test_fake_quantize_module_quirks, test_fixed_qparams_observer_random]

Fake-quant functions
* ``inv = f32(1 / f32(scale))`` and multiply; integer zp added after
  rounding, float zp before (fused with an FMA for a float32 zp, not for a
  float16 zp); per tensor NaN and -inf map to qmin, +inf to qmax; per
  channel NaN and both infinities map to qmin (x86 int64 conversion); the
  mask uses the pre-clamp value; no scale check (0, negative, inf, NaN
  scales used as is); float64 input per tensor rounds in double and
  dequantizes in float32; float16 computes in float32.
  [test_spec_kernel_vectors, test_per_tensor_functions_random,
  test_per_channel_functions_random, test_quirk_half_zero_point_is_not_fused,
  test_fake_quantize_per_channel_float_zp_fma]
* Tensor-qparams overload: ``scale.item()`` as a checked float32,
  ``zero_point.item()`` as a checked int32 (NaN, |zp| > 2**31 - 1 and
  finite scales beyond float32 raise; 1.7 -> 1, -1.7 -> -1; float64 zero
  points without a float32 detour). [test_per_tensor_tensor_qparams_random,
  test_quirk_tensor_qparams_item_conversions]
* Per-channel checks in torch's order: scale float32, zp int32 / float32 /
  float16 (int64 rejected), 1-D, equal sizes, ``size(axis)`` (IndexError for
  a 0-d x or an axis out of range), qmin <= qmax, int zp range (an empty
  int zp raises), axis >= 0; integer x raises NotImplementedError.
  [test_per_channel_functions_random, test_fake_quantize_errors]

Learnable (LSQ)
* Forward zp ``nearbyint`` + clamp in float32 (per tensor), ``round`` +
  clamp in the zp's dtype then ``.int()`` (per channel, NaN -> INT32_MIN);
  per-tensor backward zp ``trunc(clamp(f32(zp + 0.5)))`` (not the forward
  one); the backward kernel's FMA contraction ``xq = rint(fmaf(x, inv, zb))``,
  ``fmaf(q - zb, s, -x)``; int64 clamp and mask (exact at int32 ranges);
  dX not scaled by grad_factor; float32-only backward; checks in torch's
  order (a NaN zero point raises); a 1-D per-channel input gives 0-d sums;
  X / dY broadcast; the empty-input bug returns ``(x, scale, zero_point)``.
  [test_spec_lsq_vectors, test_learnable_per_tensor_random,
  test_learnable_per_channel_random, test_quirk_lsq_backward_broadcasts_x_and_dy]

fused_moving_avg_obs_fake_quant
* Each running side resets independently when infinite; averaging constant
  rounded to float32, no FMA; ChooseQuantizationParams
  (:func:`quantcore.qparams.choose_qparams_fused`: double scale rounded once,
  0.1 fallback, 6.1e-5 floor, sparsity-preserving symmetric range with
  /(range/2), affine on one-signed data, int32 arithmetic); fake quant off
  returns a copy and leaves scale / zero_point untouched; the observer
  needs float32 x and state (float64 x works with the observer off); per
  row: x permuted and flattened (1-D x: IndexError), empty running buffers
  resize all four arrays before the axis check, only axis 0 when observing;
  ``ch_axis < x.ndim``; empty x returns a copy and changes nothing.
  [test_spec_fused_vectors, test_fused_moving_avg_obs_fake_quant_random,
  test_quirk_fused_float64_only_without_observer]

Exact integer steps and torch.histc
* int32-size ranges: torch clamps q and forms ``q - zp`` with exact
  integers (zero points beyond 2**24, ``2**31 - 1``); when a zero point or
  a range end is not exact in the compute dtype, the exact-integer kernel
  (``qc_fq_affine_exact``) runs instead of the vectorised one.
* float64 input, float zero point, per channel: ``x * inv + zp`` in double,
  rounded to float32 before ``lrintf`` (mode ``QC_ROUND_F32``).
* Per channel, q is an int64: never -0.0 (a float zero point 0 and x in
  (-scale/2, 0) give +0.0).
* ``torch.histc`` (HistogramObserver): a single-valued range widens by at
  least one float32 step each way; a value whose bin position overflows is
  counted in bin 0; an overflowing width counts nothing.
  [tests/test_compat_torch_core_gaps.py, with torch's recipes as models]

Not reproduced (consciously)
----------------------------
* Uninitialized memory: the per-row fused op resizes scale / zero_point
  without writing them when fake quant is off; here the new elements repeat
  the first value.
* Sign of a zero: torch's scale for eps <= 0 with all-zero statistics, its
  float_qparams zero point of a zero minimum and its min / max of signed
  zeros depend on its SIMD chunking (16-element blocks vs scalar tail);
  quantcore orders -0.0 < +0.0 and gives +0.0 scales.  Values are equal.
* Shared storage after ``HistogramObserver.load_state_dict``: torch binds
  the state dict's ``min_val`` / ``max_val`` tensors, which share the
  source module's storage, so the two observers then update each other's
  range; here the loaded module binds copies (old references are not
  updated, as in torch).
* Out-of-bounds and partial writes: torch's fused op writes out of bounds
  for empty per-tensor running buffers or fewer per-row running values than
  rows (here ValueError), and some torch ops update part of the state
  before raising (NaN into a fresh HistogramObserver stores a NaN range,
  the fused op with a bad scale after its moving average); a failing call
  here leaves the state unchanged.
* HistogramObserver bins float64 / float16 input in that precision in torch;
  here float32.
* Per-channel observers: torch broadcasts a 1-channel batch onto a
  C-channel state (and back); quantcore raises ValueError.
* Non-integral quant_min / quant_max that pass torch's checks (e.g. -0.5):
  torch carries on with floats, here TypeError.
* bfloat16 (numpy has none); float8 dtypes are accepted by observers, and
  FakeQuantize's iinfo check raises TypeError as torch's does.
* Autograd: ``backward(grad_output)`` gives the input gradient of the last
  forward; torch's requires-grad errors (scale / zero point requiring grad)
  have no equivalent.
* The LSQ backward sums dScale / dZeroPoint in float64 and rounds once
  (torch's float32 cascade order differs by a few ulp).
* Not provided (not in API.md): PlaceholderObserver and
  ``default_dynamic_quant_observer``, RecordingObserver, NoopObserver,
  ``_LearnableFakeQuantize``; state dicts of observer versions < 3
  (``min_vals`` / ``max_vals`` names).
* Message texts of errors whose torch text embeds tensor reprs ("min tensor(...)
  should be less than max ...") use numpy reprs.
"""
import functools
import numbers

import numpy as np

from .. import _arrays as A
from .. import observers as _obs
from .. import ops as _ops
from .. import qparams as Q
from .._warn import warn
from ..observers import store_into
from ..ops import _affine, affine_mode
from ._errors import AssertionValueError, RuntimeTypeError, RuntimeValueError

F32 = np.float32

__all__ = [
    "MinMaxObserver", "MovingAverageMinMaxObserver", "PerChannelMinMaxObserver",
    "MovingAveragePerChannelMinMaxObserver", "HistogramObserver", "FixedQParamsObserver",
    "FakeQuantize", "FixedQParamsFakeQuantize", "FusedMovingAvgObsFakeQuantize",
    "fake_quantize_per_tensor_affine", "fake_quantize_per_tensor_affine_cachemask",
    "fake_quantize_per_channel_affine", "fake_quantize_per_channel_affine_cachemask",
    "fake_quantize_learnable_per_tensor_affine",
    "fake_quantize_learnable_per_tensor_affine_backward",
    "fake_quantize_learnable_per_channel_affine",
    "fake_quantize_learnable_per_channel_affine_backward",
    "fused_moving_avg_obs_fake_quant",
    "enable_fake_quant", "disable_fake_quant", "enable_observer", "disable_observer",
    "default_observer", "default_weight_observer", "default_per_channel_weight_observer",
    "weight_observer_range_neg_127_to_127", "per_channel_weight_observer_range_neg_127_to_127",
    "default_histogram_observer", "default_float_qparams_observer",
    "default_float_qparams_observer_4bit", "default_fixed_qparams_range_neg1to1_observer",
    "default_fixed_qparams_range_0to1_observer", "default_symmetric_fixed_qparams_observer",
    "default_affine_fixed_qparams_observer",
    "default_fake_quant", "default_weight_fake_quant", "default_dynamic_fake_quant",
    "default_per_channel_weight_fake_quant", "default_embedding_fake_quant",
    "default_embedding_fake_quant_4bit", "default_histogram_fake_quant",
    "default_fixed_qparams_range_neg1to1_fake_quant",
    "default_fixed_qparams_range_0to1_fake_quant",
    "default_symmetric_fixed_qparams_fake_quant", "default_affine_fixed_qparams_fake_quant",
    "default_fused_act_fake_quant", "default_fused_wt_fake_quant",
    "default_fused_per_channel_wt_fake_quant", "fused_wt_fake_quant_range_neg_127_to_127",
    "fused_per_channel_wt_fake_quant_range_neg_127_to_127",
]

# ------------------------------------------------------------ dtypes, schemes
#: torch dtype name -> (iinfo min, iinfo max, bits); float8 has no iinfo
_IINFO = {
    "quint8": (0, 255, 8), "qint8": (-128, 127, 8), "qint32": (-2 ** 31, 2 ** 31 - 1, 32),
    "quint4x2": (0, 255, 8), "int8": (-128, 127, 8), "uint8": (0, 255, 8),
    "int16": (-2 ** 15, 2 ** 15 - 1, 16), "uint16": (0, 2 ** 16 - 1, 16),
    "int32": (-2 ** 31, 2 ** 31 - 1, 32),
}
_OBSERVER_DTYPES = ("qint8", "quint8", "quint4x2", "qint32", "int8", "uint8", "int16",
                    "int32", "float8_e5m2", "float8_e4m3fn", "uint16")
_QSCHEMES = ("per_tensor_affine", "per_tensor_symmetric", "per_channel_affine",
             "per_channel_symmetric", "per_channel_affine_float_qparams")

_PER_TENSOR_ONLY = ("{}'s qscheme only support torch.per_tensor_symmetric" + " " * 21
                    + "and torch.per_tensor_affine.")
_PER_CHANNEL_ONLY = ("{}'s qscheme only support" + " " * 21 + "torch.per_channel_symmetric, "
                     "torch.per_channel_affine and torch.per_channel_affine_float_qparams.")
_IINFO_MSG = "torch.iinfo() requires an integer input type. Use torch.finfo to handle 'torch.iinfo'"
_REDUCE_RANGE_WARNING = (
    "Please use quant_min and quant_max to specify the range for observers."
    "                     reduce_range will be deprecated in a future release of PyTorch.")
_NO_DATA_WARNING = ("must run observer before calling calculate_qparams. "
                    "Returning default values.")


def _name(value, what):
    """A dtype / qscheme string without its ``torch.`` prefix; torch's own
    ``torch.dtype`` / ``torch.qscheme`` objects give their name (their
    ``str`` is ``"torch.qint8"``)."""
    if type(value).__module__ == "torch" and type(value).__name__ in ("dtype", "qscheme"):
        value = str(value)
    if not isinstance(value, str):
        raise TypeError(
            f"{what} must be a torch dtype / qscheme or its name, such as "
            f"torch.quint8, 'quint8' or 'torch.per_tensor_affine', got {value!r}")
    return value[6:] if value.startswith("torch.") else value


def _dtype(value):
    name = _name(value, "dtype")
    if name not in _OBSERVER_DTYPES:
        raise AssertionValueError(
            "Default Observer only works for (torch.qint8, torch.quint8, torch.quint4x2, "
            "torch.qint32, torch.int8, torch.uint8, torch.int16, torch.int32, "
            "torch.float8_e5m2, torch.float8_e4m3fn, torch.uint16) "
            f"data type (got {value!r})")
    return name


def _qscheme(value):
    name = _name(value, "qscheme")
    if name not in _QSCHEMES:
        raise AssertionValueError(
            "Default Observer only works for per_tensor_affine, per_tensor_symmetric, "
            "per_channel_affine, per_channel_symmetric and per_channel_float_qparams "
            f"quantization scheme, got {value!r}")
    return name


def _is_per_tensor(q):
    return q in ("per_tensor_affine", "per_tensor_symmetric")


def _is_per_channel(q):
    return q in ("per_channel_affine", "per_channel_symmetric",
                 "per_channel_affine_float_qparams")


def _is_symmetric(q):
    return q in ("per_tensor_symmetric", "per_channel_symmetric")


def _qrange(dtype, reduce_range, quant_min, quant_max):
    """torch.ao.quantization.utils.validate_qmin_qmax + calculate_qmin_qmax."""
    custom = quant_min is not None and quant_max is not None
    if not custom:
        if dtype in ("qint8", "int8"):
            return (-64, 63) if reduce_range else (-128, 127), False
        if dtype in ("quint8", "uint8"):
            return (0, 127) if reduce_range else (0, 255), False
        if dtype in ("qint32", "int32"):
            return (-2 ** 31, 2 ** 31 - 1), False
        if dtype == "uint16":
            return (0, 2 ** 16 - 1), False
        if dtype == "int16":
            return (-2 ** 15, 2 ** 15 - 1), False
        return (0, 15), False
    qmin, qmax = quant_min, quant_max
    if not isinstance(qmin, numbers.Real) or not isinstance(qmax, numbers.Real):
        raise TypeError(f"torch observer: quant_min / quant_max must be integers, got "
                        f"{quant_min!r}, {quant_max!r}")
    if not qmin <= 0 <= qmax:
        raise AssertionValueError("Used-specified quantization range must include 0.")
    if qmin >= qmax:
        raise AssertionValueError("qmin must be strictly less than qmax for user-specified "
                                  "quantization range.")
    n = qmax - qmin + 1
    if dtype in ("qint8", "int8") and not 0 < n <= 256:
        raise AssertionValueError(
            "quantization range should be positive and not exceed the maximum "
            "bit range (=256).")
    if dtype in ("qint32", "int32") and not 0 < n <= 2 ** 32:
        raise AssertionValueError(
            "quantization range should be positive and not exceed the maximum "
            "bit range (=4294967296).")
    # torch validates the numbers first; a non-integral bound (which torch
    # would carry on with) is refused after its checks
    qmin = A.as_int(quant_min, "quant_min", "torch observer")
    qmax = A.as_int(quant_max, "quant_max", "torch observer")
    if reduce_range:
        qmin, qmax = qmin // 2, qmax // 2
    return (qmin, qmax), True


def _as_input(x, func):
    """x as a float numpy array (integer / bool input read as float32, as
    torch's ``x.to(torch.float32)``)."""
    if isinstance(x, (np.ndarray, np.generic)) and x.dtype.kind in "iub":
        return np.asarray(x).astype(F32)
    return A.as_float_array(x, "x", func)


def _array(value, dtype, name, func):
    try:
        return np.array(value, dtype=dtype, copy=True)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{func}: {name} must be numeric, got {value!r}") from exc


# ------------------------------------------------------------------ with_args
class _PartialWrapper:
    """torch's ``_PartialWrapper``: a chainable constructor with fixed
    keyword arguments (``p`` is the ``functools.partial``) and, with
    ``with_callable_args``, arguments computed at each construction."""

    def __init__(self, p):
        self.p = p
        self.callable_args = {}

    def __call__(self, *args, **keywords):
        for name, fn in self.callable_args.items():
            if name not in keywords:
                keywords = {**keywords, name: fn()}
        return self.p(*args, **keywords)

    def __repr__(self):
        return repr(self.p) + repr(self.callable_args)

    def with_args(self, **kwargs):
        return _with_args(self, **kwargs)

    def with_callable_args(self, **kwargs):
        result = _PartialWrapper(self.p)
        result.callable_args = {**self.callable_args, **kwargs}
        return result


def _with_args(cls_or_self, **kwargs):
    return _PartialWrapper(functools.partial(cls_or_self, **kwargs))


def _with_callable_args(cls_or_self, **kwargs):
    return _PartialWrapper(functools.partial(cls_or_self)).with_callable_args(**kwargs)


# ------------------------------------------------------------ state helpers
def _load_keys(module, state, strict, own):
    """Check a flat state dict against ``own`` keys; return missing / unexpected."""
    if not isinstance(state, dict) and not hasattr(state, "keys"):
        raise TypeError(f"{type(module).__name__}.load_state_dict: expected a mapping of "
                        f"arrays, got {type(state).__name__}")
    keys = set(state.keys())
    missing = [k for k in own if k not in keys]
    unexpected = sorted(keys - set(own))
    if strict and (missing or unexpected):
        raise RuntimeValueError(f"Error(s) in loading state_dict for {type(module).__name__}: "
                                f"Missing key(s): {missing}. Unexpected key(s): {unexpected}.")
    return missing


def _as_state_array(value, name, module):
    arr = np.asarray(value)
    if arr.dtype.kind not in "iufb":
        raise ValueError(f"{type(module).__name__}.load_state_dict: {name} must be numeric, "
                         f"got dtype {arr.dtype}")
    return arr


def _copy_into(module, name, value, shape=None, dtype=F32):
    """torch's ``param.copy_(input_param)`` with its shape check."""
    arr = _as_state_array(value, name, module)
    cur = getattr(module, name)
    want = cur.shape if shape is None else shape
    if arr.shape != want:
        raise RuntimeValueError(
            f"Error(s) in loading state_dict for {type(module).__name__}: size "
            f"mismatch for {name}: copying a param with shape {arr.shape} from "
            f"checkpoint, the shape in current model is {want}.")
    return arr.astype(dtype, copy=True)


def _load_into(module, name, value, shape=None, target=None):
    """torch's ``param.copy_(input_param)`` of ``load_state_dict``: shape
    check, then a copy into the existing array (``target``, default
    ``module``) in place; a new array only where ``shape`` (torch's
    ``resize_`` before the copy) differs from the current one."""
    cur = getattr(module, name)
    new = _copy_into(module, name, value, shape=shape, dtype=cur.dtype)
    store_into(module if target is None else target, name, new, cur.dtype)


class _Module:
    """What the torch modules share: ``obj(x)`` is ``forward(x)``,
    ``train`` / ``eval``, ``state_dict`` / ``load_state_dict``."""

    training = True
    _BUFFERS = ()

    with_args = classmethod(_with_args)
    with_callable_args = classmethod(_with_callable_args)

    def __call__(self, x):
        return self.forward(x)

    def train(self, mode=True):
        self.training = bool(mode)
        return self

    def eval(self):
        return self.train(False)

    def _state_keys(self, prefix=""):
        return [prefix + b for b in self._BUFFERS]

    def _save(self, dest, prefix):
        # the buffers themselves: torch's state dict shares their storage
        for b in self._BUFFERS:
            dest[prefix + b] = getattr(self, b)

    def _load(self, state, prefix):
        for b in self._BUFFERS:
            if prefix + b in state:
                _load_into(self, b, state[prefix + b])

    #: torch's ``Module._version`` of the class (observers: 3, FakeQuantize: 1)
    _VERSION = 1

    def _metadata(self, dest, prefix):
        dest[prefix[:-1]] = {"version": self._VERSION}

    def state_dict(self):
        """Buffers as numpy arrays under torch's key names, in a dict that
        carries torch's ``_metadata`` (the module versions), as torch's does."""
        d = _StateDict()
        self._save(d, "")
        d._metadata = {}
        self._metadata(d._metadata, "")
        return d

    def _prepare(self, state, prefix, metadata):
        """torch's ``_load_from_state_dict`` rewrites, before the keys are
        matched (the eps reset of observers without a version)."""

    def load_state_dict(self, state_dict, strict=True):
        """Load a state dict with torch's keys (numpy arrays, e.g. from
        ``numpy.load`` of an ``.npz`` or ``safetensors.numpy.load_file``),
        as torch's ``load_state_dict`` does.

        A plain mapping carries no module versions, and torch then treats
        each observer as a version-1 checkpoint: its ``eps`` is reset to
        ``finfo(float32).eps`` whatever the file holds (and needs no ``eps``
        key).  The dict :meth:`state_dict` returns keeps the versions (its
        ``_metadata``), so it loads ``eps`` as stored, as in torch.
        """
        if not hasattr(state_dict, "keys"):
            raise TypeError(f"{type(self).__name__}.load_state_dict: expected a mapping of "
                            f"arrays, got {type(state_dict).__name__}")
        state = {k: state_dict[k] for k in state_dict.keys()}
        self._prepare(state, "", getattr(state_dict, "_metadata", None) or {})
        _load_keys(self, state, strict, self._state_keys())
        self._load(state, "")
        return self


class _StateDict(dict):
    """A state dict with torch's ``_metadata`` attribute."""

    _metadata = None


def _version(metadata, prefix):
    return metadata.get(prefix[:-1], {}).get("version")


_DEFAULT_EPS = float(np.finfo(np.float32).eps)


# ----------------------------------------------------------------- observers
class _UniformObserver(_Module):
    """UniformQuantizationObserverBase: dtype, qscheme, range, eps."""

    _BUFFERS = ("eps", "min_val", "max_val")

    def __init__(self, dtype, qscheme, reduce_range, quant_min, quant_max, eps, is_dynamic):
        self.dtype = _dtype(dtype)
        self.is_dynamic = bool(is_dynamic)
        if reduce_range:
            warn(_REDUCE_RANGE_WARNING, UserWarning)
        self.reduce_range = bool(reduce_range)
        self.eps = np.array([eps], dtype=F32)
        (self.quant_min, self.quant_max), self.has_customized_qrange = _qrange(
            self.dtype, reduce_range, quant_min, quant_max)

    def _check_symmetric_reduce(self, msg):
        if _is_symmetric(self.qscheme) and self.reduce_range and self.dtype == "quint8":
            raise NotImplementedError(msg)

    # statistics live in a quantcore observer; min_val / max_val are its arrays
    @property
    def min_val(self):
        return self._core.min_val

    @min_val.setter
    def min_val(self, value):
        # assigning binds a new array, as assigning a torch buffer does
        self._core.min_val = np.array(value, dtype=F32)

    @property
    def max_val(self):
        return self._core.max_val

    @max_val.setter
    def max_val(self, value):
        self._core.max_val = np.array(value, dtype=F32)

    _VERSION = 3

    def _prepare(self, state, prefix, metadata):
        if _version(metadata, prefix) in (None, 1):
            # "eps was moved to a buffer in version 2": reset to the default
            state[prefix + "eps"] = np.array([_DEFAULT_EPS], dtype=F32)

    def _calculate_qparams(self, min_val, max_val):
        """torch's ``_calculate_qparams`` through :mod:`quantcore.qparams`."""
        mn = np.asarray(min_val, dtype=F32)
        mx = np.asarray(max_val, dtype=F32)
        if not _check_min_max_valid(mn, mx):
            return np.array([1.0], dtype=F32), np.array([0], dtype=np.int64)
        qmin, qmax, eps = self.quant_min, self.quant_max, float(self.eps[0])
        if _is_symmetric(self.qscheme):
            if self.dtype in ("quint8", "uint8"):
                zp = (qmin + qmax) // 2 if self.has_customized_qrange else 128
            elif self.dtype == "uint16":
                zp = 2 ** 15
            else:
                zp = 0
            return Q.symmetric_qparams(mn, mx, qmin, qmax, eps, zero_point=zp)
        if self.qscheme == "per_channel_affine_float_qparams":
            return Q.float_qparams(mn, mx, qmin, qmax, eps)
        scale, zp = Q.affine_qparams(mn, mx, qmin, qmax, eps)
        return scale, zp.astype(np.int32)

    def calculate_qparams(self):
        """``(scale, zero_point)`` from the running statistics."""
        return self._calculate_qparams(self.min_val, self.max_val)

    def _load(self, state, prefix):
        if prefix + "eps" in state:
            _load_into(self, "eps", state[prefix + "eps"])
        for name in ("min_val", "max_val"):
            if prefix + name in state:
                # per channel torch resizes the buffer to the checkpoint's shape
                shape = None if self._per_tensor else np.shape(state[prefix + name])
                _load_into(self, name, state[prefix + name], shape=shape, target=self._core)
        self._sync_first()

    def _sync_first(self):
        """Tell the core observer whether the next batch is a first call."""
        self._core.num_batches = 0 if self._is_first() else max(self._core.num_batches, 1)

    def extra_repr(self):
        return f"min_val={self.min_val}, max_val={self.max_val}"

    def __repr__(self):
        return f"{type(self).__name__}({self.extra_repr()})"


def _check_min_max_valid(mn, mx):
    """torch.ao.quantization.utils.check_min_max_valid."""
    if mn.size == 0 or mx.size == 0:
        warn(_NO_DATA_WARNING, UserWarning)
        return False
    if mn.ndim == 0 or mx.ndim == 0:
        if mn == np.inf and mx == -np.inf:
            warn(_NO_DATA_WARNING, UserWarning)
            return False
        if mn > mx:
            raise AssertionValueError(f"min {mn} should be less than max {mx}")
    elif np.any(mn > mx):
        raise AssertionValueError(f"min {mn} should be less than max {mx}")
    return True


class MinMaxObserver(_UniformObserver):
    """``torch.ao.quantization.MinMaxObserver``: running min / max per tensor."""

    _per_tensor = True

    def __init__(self, dtype="quint8", qscheme="per_tensor_affine", reduce_range=False,
                 quant_min=None, quant_max=None, factory_kwargs=None,
                 eps=float(np.finfo(np.float32).eps), is_dynamic=False):
        qscheme = _qscheme(qscheme)
        if not _is_per_tensor(qscheme):
            raise NotImplementedError(_PER_TENSOR_ONLY.format("MinMaxObserver"))
        self.qscheme = qscheme
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max, eps, is_dynamic)
        self._core = self._make_core()
        self._check_symmetric_reduce("Cannot reduce range for symmetric" + " " * 40
                                     + "quantization for quint8")

    def _make_core(self):
        return _obs.MinMaxObserver(axis=None, nan_policy="propagate")

    def _is_first(self):
        return bool(self.min_val == np.inf and self.max_val == -np.inf)

    def forward(self, x_orig):
        """Record x and return it."""
        x = _as_input(x_orig, f"{type(self).__name__}.forward")
        if x.size == 0:
            return x_orig
        self._sync_first()
        self._core.update(x)
        return x_orig

    def reset_min_max_vals(self):
        """Back to ``min_val = +inf``, ``max_val = -inf``."""
        self._core.reset()


class MovingAverageMinMaxObserver(MinMaxObserver):
    """``torch.ao.quantization.MovingAverageMinMaxObserver``::

        first call (min_val == +inf and max_val == -inf): min/max of x
        later: m = f32(m + f32(f32(c) * f32(cur - m)))
    """

    def __init__(self, averaging_constant=0.01, dtype="quint8", qscheme="per_tensor_affine",
                 reduce_range=False, quant_min=None, quant_max=None,
                 eps=float(np.finfo(np.float32).eps), is_dynamic=False, *,
                 factory_kwargs=None):
        qscheme_name = _qscheme(qscheme)
        if not _is_per_tensor(qscheme_name):
            raise NotImplementedError(
                "MovingAverageMinMaxObserver's qscheme only support" + " " * 17
                + "torch.per_tensor_symmetric and torch.per_tensor_affine." + " " * 17
                + f"but got: torch.{qscheme_name}")
        self.averaging_constant = averaging_constant
        if is_dynamic and averaging_constant != 1:
            raise NotImplementedError(
                "MovingAverageMinMaxObserver doesn't support dynamic quantization for "
                f"averaging constant of {averaging_constant}")
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max, None, eps,
                         is_dynamic)

    def _make_core(self):
        core = _obs.MovingAverageMinMaxObserver(0.5, axis=None, nan_policy="propagate")
        # torch does not range-check the constant: set it after construction
        core.averaging_constant = float(self.averaging_constant)
        return core


class PerChannelMinMaxObserver(_UniformObserver):
    """``torch.ao.quantization.PerChannelMinMaxObserver``: running min / max
    per channel along ``ch_axis`` (x needs ndim >= 2)."""

    _per_tensor = False

    def __init__(self, ch_axis=0, dtype="quint8", qscheme="per_channel_affine",
                 reduce_range=False, quant_min=None, quant_max=None, factory_kwargs=None,
                 eps=float(np.finfo(np.float32).eps), is_dynamic=False):
        qscheme = _qscheme(qscheme)
        if not _is_per_channel(qscheme):
            raise NotImplementedError(_PER_CHANNEL_ONLY.format("PerChannelMinMaxObserver"))
        if is_dynamic:
            raise NotImplementedError(
                "PerChannelMinMaxObserver doesn't support dynamic quantization")
        self.qscheme = qscheme
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max, eps, is_dynamic)
        self.ch_axis = A.as_int(ch_axis, "ch_axis", type(self).__name__)
        self._core = self._make_core()
        self._check_symmetric_reduce("Cannot reduce range for symmetric quantization for "
                                     "quint8")

    def _make_core(self):
        return _obs.MinMaxObserver(axis=0, nan_policy="propagate")

    def _is_first(self):
        return self.min_val.size == 0 or self.max_val.size == 0

    def forward(self, x_orig):
        """Record x (per channel) and return it."""
        x = _as_input(x_orig, f"{type(self).__name__}.forward")
        if x.size == 0:
            return x_orig
        if not -x.ndim <= self.ch_axis < x.ndim:
            raise IndexError("list assignment index out of range")
        if x.ndim < 2:
            raise IndexError("Dimension out of range (expected to be in range of [-1, 0], "
                             "but got 1)")
        self._core.axis = self.ch_axis
        self._sync_first()
        self._core.update(x)
        return x_orig

    def reset_min_max_vals(self):
        """Back to empty ``min_val`` / ``max_val``."""
        self._core.reset()


class MovingAveragePerChannelMinMaxObserver(PerChannelMinMaxObserver):
    """``torch.ao.quantization.MovingAveragePerChannelMinMaxObserver``."""

    def __init__(self, averaging_constant=0.01, ch_axis=0, dtype="quint8",
                 qscheme="per_channel_affine", reduce_range=False, quant_min=None,
                 quant_max=None, eps=float(np.finfo(np.float32).eps), is_dynamic=False, *,
                 factory_kwargs=None):
        if not _is_per_channel(_qscheme(qscheme)):
            raise NotImplementedError(
                _PER_CHANNEL_ONLY.format("MovingAveragePerChannelMinMaxObserver"))
        if is_dynamic:
            raise NotImplementedError(
                "MovingAveragePerChannelMinMaxObserver doesn't support dynamic quantization")
        self.averaging_constant = averaging_constant
        super().__init__(ch_axis, dtype, qscheme, reduce_range, quant_min, quant_max, None,
                         eps, is_dynamic)

    def _make_core(self):
        core = _obs.MovingAverageMinMaxObserver(0.5, axis=0, nan_policy="propagate")
        core.averaging_constant = float(self.averaging_constant)
        return core


class HistogramObserver(_UniformObserver):
    """``torch.ao.quantization.HistogramObserver`` on
    :class:`quantcore.calib.TorchHistogram` (histogram + greedy L2 search),
    then the MinMax qparams of the searched range."""

    _per_tensor = True
    _BUFFERS = ("eps", "histogram", "min_val", "max_val")

    def __init__(self, bins=2048, dtype="quint8", qscheme="per_tensor_affine",
                 reduce_range=False, quant_min=None, quant_max=None, factory_kwargs=None,
                 eps=float(np.finfo(np.float32).eps), is_dynamic=False):
        qscheme = _qscheme(qscheme)
        if not _is_per_tensor(qscheme):
            raise NotImplementedError(_PER_TENSOR_ONLY.format("HistogramObserver"))
        if is_dynamic:
            raise NotImplementedError("HistogramObserver doesn't support dynamic quantization")
        self.qscheme = qscheme
        super().__init__(dtype, qscheme, reduce_range, quant_min, quant_max, eps, is_dynamic)
        try:
            from ..calib import TorchHistogram
        except ImportError as exc:  # pragma: no cover - calib is part of the package
            raise NotImplementedError("HistogramObserver needs quantcore.calib.TorchHistogram, "
                                      "which is not available in this build") from exc
        self.bins = bins
        if self.dtype not in _IINFO:
            raise TypeError(_IINFO_MSG)
        self.dst_nbins = 2 ** _IINFO[self.dtype][2]
        self.upsample_rate = 16
        self._hist = TorchHistogram(bins=bins, upsample_rate=self.upsample_rate)

    # the TorchHistogram's own arrays (updated in place); assigning binds new ones
    @property
    def histogram(self):
        return self._hist.histogram

    @histogram.setter
    def histogram(self, value):
        self._hist.histogram = np.array(value, dtype=F32)

    @property
    def min_val(self):
        return self._hist.min_val

    @min_val.setter
    def min_val(self, value):
        self._hist.min_val = np.array(value, dtype=F32).reshape(())

    @property
    def max_val(self):
        return self._hist.max_val

    @max_val.setter
    def max_val(self, value):
        self._hist.max_val = np.array(value, dtype=F32).reshape(())

    def forward(self, x_orig):
        """Add x to the histogram and return it (float32 statistics: torch bins
        float64 / float16 input in that precision, not reproduced)."""
        if isinstance(x_orig, (np.ndarray, np.generic)) and x_orig.dtype.kind in "biu" \
                and np.size(x_orig):
            # torch.histc has no integer kernel
            raise NotImplementedError('"histogram_cpu" not implemented for '
                                      f"'{_torch_dtype_name(x_orig.dtype)}'")
        x = _as_input(x_orig, "HistogramObserver.forward")
        if x.size == 0:
            return x_orig
        try:
            self._hist.collect(x.astype(F32, copy=False))
        except ValueError as exc:  # NaN input: torch.histc's RuntimeError
            raise RuntimeValueError(str(exc)) from exc
        return x_orig

    def calculate_qparams(self):
        """Greedy L2 range search, then the MinMax qparams of that range."""
        if self.min_val == np.inf and self.max_val == -np.inf:
            warn("must run observer before calling calculate_qparams."
                 "                                    Returning default scale and "
                 "zero point ", UserWarning)
            return np.array([1.0], dtype=F32), np.array([0], dtype=np.int64)
        if self.bins != len(self.histogram):
            raise AssertionValueError(
                "The number of bins in histogram should be equal to the number "
                "of bins supplied while making this observer")
        new_min, new_max = self._hist.non_linear_param_search(self.dst_nbins)
        return self._calculate_qparams(np.asarray(new_min, F32), np.asarray(new_max, F32))

    def reset_min_max_vals(self):
        raise NotImplementedError("Cannot reset min/max values in the given observer.")

    def _prepare(self, state, prefix, metadata):
        super()._prepare(state, prefix, metadata)
        version = _version(metadata, prefix)
        if version is None or version < 3:
            # uninitialized [0]-shaped min / max of version-2 checkpoints
            for name, v in (("min_val", np.inf), ("max_val", -np.inf)):
                if prefix + name in state and np.shape(state[prefix + name]) == (0,):
                    state[prefix + name] = np.array(v, dtype=F32)

    def _load(self, state, prefix):
        if prefix + "eps" in state:
            _load_into(self, "eps", state[prefix + "eps"])
        if prefix + "histogram" in state:
            store_into(self._hist, "histogram",
                       _as_state_array(state[prefix + "histogram"], "histogram", self), F32)
        for name in ("min_val", "max_val"):
            if prefix + name in state:
                # torch binds the state dict's tensors here (setattr): references
                # to the old min_val / max_val are not updated; a copy is bound
                # (torch's shares the source module's storage, see the docstring)
                value = _as_state_array(state[prefix + name], name, self)
                setattr(self._hist, name, np.array(value, dtype=F32).reshape(()))


class FixedQParamsObserver(_Module):
    """``torch.ao.quantization.FixedQParamsObserver``: fixed ``scale``
    (float32[1]) and ``zero_point`` (int32[1]); forward is the identity."""

    _BUFFERS = ("scale", "zero_point")
    _VERSION = 1  # an ObserverBase, not a UniformQuantizationObserverBase (3)

    def __init__(self, scale, zero_point, dtype="quint8", qscheme="per_tensor_affine",
                 quant_min=0, quant_max=255, is_dynamic=False):
        if is_dynamic:
            raise NotImplementedError("FixedQParamsObserver doesn't support dynamic "
                                      "quantization")
        self.is_dynamic = False
        self.quant_min = quant_min
        self.quant_max = quant_max
        with np.errstate(over="ignore"):
            self.scale = np.array([scale], dtype=F32)
        zp = np.asarray(zero_point).reshape(())
        if zp.dtype.kind == "f" and not (-2.0 ** 31 <= zp <= 2.0 ** 31 - 1) or \
                zp.dtype.kind in "iu" and not -2 ** 31 <= int(zp) <= 2 ** 31 - 1:
            raise RuntimeValueError("value cannot be converted to type int32 without overflow")
        self.zero_point = np.array([zero_point], dtype=np.float64).astype(np.int32) \
            if zp.dtype.kind == "f" else np.array([int(zp)], dtype=np.int32)
        self.dtype = _name(dtype, "dtype")
        self.qscheme = _name(qscheme, "qscheme")

    def forward(self, X):
        return X

    def calculate_qparams(self):
        return self.scale, self.zero_point

    def _load(self, state, prefix):
        # in place: a FixedQParamsFakeQuantize shares these arrays
        for b in self._BUFFERS:
            if prefix + b in state:
                new = _copy_into(self, b, state[prefix + b], dtype=getattr(self, b).dtype)
                np.copyto(getattr(self, b), new)


# ----------------------------------------------------------- fake quantize
def _is_float_qparams(q):
    return q == "per_channel_affine_float_qparams"


class _FakeQuantizeBase(_Module):
    _FLAG_DTYPE = np.uint8

    def _init_flags(self):
        self.fake_quant_enabled = np.array([1], dtype=self._FLAG_DTYPE)
        self.observer_enabled = np.array([1], dtype=self._FLAG_DTYPE)

    def enable_fake_quant(self, enabled=True):
        self.fake_quant_enabled[0] = 1 if enabled else 0

    def disable_fake_quant(self):
        self.enable_fake_quant(False)

    def enable_observer(self, enabled=True):
        self.observer_enabled[0] = 1 if enabled else 0

    def disable_observer(self):
        self.enable_observer(False)

    def backward(self, grad_output):
        """Input gradient of the last forward: ``grad * mask`` (straight-through
        estimator), or ``grad`` itself where fake quant was off."""
        name = type(self).__name__
        if not hasattr(self, "_last_mask"):
            raise RuntimeError(f"{name}.backward: call forward first")
        g = A.as_float_array(grad_output, "grad_output", f"{name}.backward")
        mask = self._last_mask
        if mask is None:
            if g.shape != self._last_shape:
                raise RuntimeValueError(
                    f"{name}.backward: grad_output has shape {g.shape}, the last "
                    f"forward's input {self._last_shape}")
            return g.copy()
        if g.shape != mask.shape:
            raise RuntimeValueError(
                f"{name}.backward: grad_output has shape {g.shape}, the last "
                f"forward's input {mask.shape}")
        if g.size == 0:
            return g
        return _ops.ste_backward(g, mask)


class FakeQuantize(_FakeQuantizeBase):
    """``torch.ao.quantization.FakeQuantize``: observer + qparams + fake quant.

    Buffers ``fake_quant_enabled`` / ``observer_enabled`` (uint8[1]),
    ``scale`` (float32[1], [C] per channel after a forward), ``zero_point``
    (int32, float32 for float_qparams); ``activation_post_process`` is the
    observer.
    """

    def __init__(self, observer=MovingAverageMinMaxObserver, quant_min=None, quant_max=None,
                 is_dynamic=False, **observer_kwargs):
        self._init_flags()
        if quant_min is not None and quant_max is not None:
            if quant_min > quant_max:
                raise AssertionValueError("quant_min must be less than or equal to quant_max")
            dtype = observer_kwargs.get("dtype", "quint8")
            if hasattr(observer, "p"):
                dtype = getattr(getattr(observer, "p", {}), "keywords", {}).get("dtype", dtype)
            dname = _name(dtype, "dtype")
            if dname not in _IINFO:
                raise TypeError(_IINFO_MSG)
            lo, hi, _ = _IINFO[dname]
            if lo > quant_min:
                raise AssertionValueError("quant_min out of bound")
            if quant_max > hi:
                raise AssertionValueError("quant_max out of bound")
            observer_kwargs.update({"quant_min": quant_min, "quant_max": quant_max})
        observer_kwargs["is_dynamic"] = is_dynamic
        self.activation_post_process = observer(**observer_kwargs)
        app = self.activation_post_process
        self.quant_min = app.quant_min
        self.quant_max = app.quant_max
        self.is_dynamic = app.is_dynamic
        zp_dtype = F32 if _is_float_qparams(app.qscheme) else np.int32
        self.scale = np.array([1.0], dtype=F32)
        self.zero_point = np.array([0], dtype=zp_dtype)
        self.dtype = app.dtype
        self.qscheme = app.qscheme
        self.ch_axis = app.ch_axis if hasattr(app, "ch_axis") else -1
        if not (_is_per_channel(self.qscheme) or _is_per_tensor(self.qscheme)):
            raise AssertionValueError(
                "Only per channel and per tensor quantization are supported in "
                f"fake quantize got qscheme: torch.{self.qscheme}")
        self.is_per_channel = _is_per_channel(self.qscheme)

    def calculate_qparams(self):
        return self.activation_post_process.calculate_qparams()

    def _store_qparams(self, scale, zero_point):
        """``self.scale.resize_(...).copy_(...)`` as torch: in place (a new
        array where the shape changes, see the module docstring)."""
        with np.errstate(invalid="ignore", over="ignore"):
            store_into(self, "scale", scale, F32)
            store_into(self, "zero_point", zero_point, self.zero_point.dtype)

    def forward(self, X):
        """Observe (if enabled), update scale / zero_point, fake-quantize (if enabled)."""
        if self.observer_enabled[0] == 1:
            self.activation_post_process(X)
            self._store_qparams(*self.calculate_qparams())
        self._last_shape = np.shape(X)
        self._last_mask = None
        if self.fake_quant_enabled[0] == 1:
            app = self.activation_post_process
            if self.is_per_channel:
                X, self._last_mask = fake_quantize_per_channel_affine_cachemask(
                    X, self.scale, self.zero_point, self.ch_axis, app.quant_min, app.quant_max)
            else:
                X, self._last_mask = _per_tensor_tensor_qparams(
                    X, self.scale, self.zero_point, app.quant_min, app.quant_max)
        return X

    def _save(self, dest, prefix):
        for name in ("fake_quant_enabled", "observer_enabled", "scale", "zero_point"):
            dest[prefix + name] = getattr(self, name)  # shared, as in torch
        self.activation_post_process._save(dest, prefix + "activation_post_process.")

    def _metadata(self, dest, prefix):
        super()._metadata(dest, prefix)
        self.activation_post_process._metadata(dest, prefix + "activation_post_process.")

    def _prepare(self, state, prefix, metadata):
        self.activation_post_process._prepare(state, prefix + "activation_post_process.",
                                              metadata)

    def _state_keys(self, prefix=""):
        return ([prefix + k for k in ("fake_quant_enabled", "observer_enabled", "scale",
                                      "zero_point")]
                + self.activation_post_process._state_keys(prefix + "activation_post_process."))

    def _load(self, state, prefix):
        for name in ("fake_quant_enabled", "observer_enabled"):
            if prefix + name in state:
                _load_into(self, name, state[prefix + name])
        # torch resizes scale / zero_point to the checkpoint's shape, then copies
        for name in ("scale", "zero_point"):
            if prefix + name in state:
                val = _as_state_array(state[prefix + name], name, self)
                _load_into(self, name, val, shape=val.shape)
        self.activation_post_process._load(state, prefix + "activation_post_process.")

    def extra_repr(self):
        return (f"fake_quant_enabled={self.fake_quant_enabled}, "
                f"observer_enabled={self.observer_enabled}, quant_min={self.quant_min}, "
                f"quant_max={self.quant_max}, dtype={self.dtype}, qscheme={self.qscheme}, "
                f"ch_axis={self.ch_axis}, scale={self.scale}, zero_point={self.zero_point}")

    def __repr__(self):
        return f"{type(self).__name__}({self.extra_repr()})"


class FixedQParamsFakeQuantize(FakeQuantize):
    """``torch.ao.quantization.FixedQParamsFakeQuantize``: shares the
    FixedQParamsObserver's scale / zero_point arrays."""

    def __init__(self, observer):
        super().__init__(observer=observer)
        if type(self.activation_post_process) is not FixedQParamsObserver:
            raise AssertionValueError(f"{type(self).__name__}'s observer must be a "
                                      "FixedQParamsObserver")
        self._observer_ctr = observer
        self.scale = self.activation_post_process.scale
        self.zero_point = self.activation_post_process.zero_point
        if not _is_per_tensor(self.qscheme):
            raise AssertionValueError(
                "Only per tensor quantization is supported FixedQParamsFakeQuantize "
                f"module, got qscheme:torch.{self.qscheme}")

    def calculate_qparams(self):
        return self.scale, self.zero_point

    def _load(self, state, prefix):
        for name in ("fake_quant_enabled", "observer_enabled", "scale", "zero_point"):
            if prefix + name in state:
                np.copyto(getattr(self, name),
                          _copy_into(self, name, state[prefix + name],
                                     dtype=getattr(self, name).dtype))
        self.activation_post_process._load(state, prefix + "activation_post_process.")


class FusedMovingAvgObsFakeQuantize(FakeQuantize):
    """``torch.ao.quantization.FusedMovingAvgObsFakeQuantize``: one call of
    :func:`fused_moving_avg_obs_fake_quant` per forward; int64 enable flags."""

    _FLAG_DTYPE = np.int64

    def __init__(self, observer=MovingAverageMinMaxObserver, quant_min=0, quant_max=255,
                 **observer_kwargs):
        super().__init__(observer, quant_min, quant_max, **observer_kwargs)
        if not isinstance(self.activation_post_process,
                          (MovingAverageMinMaxObserver, MovingAveragePerChannelMinMaxObserver)):
            raise AssertionValueError("Fused observer+fake_quant module only works with "
                                      "MovingAverageMinMaxObserver")
        self._init_flags()
        self.is_symmetric_quant = _is_symmetric(self.activation_post_process.qscheme)

    def forward(self, X):
        app = self.activation_post_process
        res = _fused(X, int(self.observer_enabled[0]), int(self.fake_quant_enabled[0]),
                     app.min_val, app.max_val, self.scale, self.zero_point,
                     app.averaging_constant, app.quant_min, app.quant_max, self.ch_axis,
                     self.is_per_channel, self.is_symmetric_quant)
        out, mask, rmin, rmax, scale, zp = res
        # torch writes the buffers in place (resized per channel on the first call)
        app._core._store(rmin, rmax)
        self._store_qparams(scale, zp)
        self._last_shape = np.shape(X)
        self._last_mask = mask
        return out


def _flag_call(attr, enabled):
    def apply(mod):
        if isinstance(mod, _FakeQuantizeBase):
            getattr(mod, attr)(enabled)
    return apply


def enable_fake_quant(mod):
    """``torch.ao.quantization.enable_fake_quant`` for one module."""
    _flag_call("enable_fake_quant", True)(mod)


def disable_fake_quant(mod):
    _flag_call("enable_fake_quant", False)(mod)


def enable_observer(mod):
    _flag_call("enable_observer", True)(mod)


def disable_observer(mod):
    _flag_call("enable_observer", False)(mod)


# ------------------------------------------------------- fake-quant kernels
_MODE_PER_TENSOR = affine_mode(nonfinite="nan_to_qmin")
_MODE_CHANNEL_INT = affine_mode(nonfinite="int64", dequant_wide=True)
_MODE_CHANNEL_FLOAT = affine_mode(zero_point_add="before_rounding", nonfinite="int64",
                                  dequant_wide=True, fma_zero_point=True)
#: a float16 zero point goes through c10::Half's operator+: no FMA contraction
_MODE_CHANNEL_HALF = affine_mode(zero_point_add="before_rounding", nonfinite="int64",
                                 dequant_wide=True)
#: float64 input, float zero point: x * inv + zp in double (no FMA), rounded to
#: float32, then lrintf
_MODE_CHANNEL_FLOAT_F64 = affine_mode(zero_point_add="before_rounding", nonfinite="int64",
                                      dequant_wide=True, round_f32=True)
#: float64 input per tensor: rounding in double, dequantization in float32
_MODE_PER_TENSOR_F64 = affine_mode(nonfinite="nan_to_qmin", dequant_narrow=True)


def _needs_exact(dtype, zero_points, qmin, qmax):
    """True when a zero point or a range end is not exact in the compute
    dtype (int32-size ranges in float32): torch's integer steps then need
    the exact-integer kernel."""
    work = A.compute_dtype(np.dtype(dtype)).type
    values = np.append(np.asarray(zero_points, dtype=np.float64).reshape(-1), (qmin, qmax))
    return not np.array_equal(values.astype(work).astype(np.float64), values)


def _f32_inverse(s):
    """torch's reciprocal ``f32(1 / f32(scale))`` (as float64 values)."""
    with np.errstate(divide="ignore", over="ignore"):
        return (F32(1) / np.asarray(s, dtype=F32)).astype(F32).astype(np.float64)


def _int_arg(value, name, func):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{func}(): argument '{name}' must be int, not {type(value).__name__}")
    return int(value)


_KERNEL_NAMES = {"fake_quantize_per_tensor_affine":
                 "fake_quantize_tensor_cachemask_kernel_type_handling",
                 "fake_quantize_per_channel_affine":
                 "fake_quantize_channel_cachemask_cpu_type_handling"}


def _fq_input(x, func):
    """x as a float array; an integer / bool array raises torch's
    NotImplementedError of the kernel's dtype dispatch."""
    if isinstance(x, np.ndarray) and x.dtype.kind in "biu":
        raise NotImplementedError(f'"{_KERNEL_NAMES.get(func, func)}" not implemented for '
                                  f"'{_torch_dtype_name(x.dtype)}'")
    return A.as_float_array(x, "x", func)


def _per_tensor(x, scale, zp, qmin, qmax, func):
    """Per-tensor kernel (torch.md 4.1); scale a float, zp an int."""
    arr = _fq_input(x, func)
    s = np.array([F32(scale)], dtype=np.float64)
    z = np.array([zp], dtype=np.float64)
    exact = _needs_exact(arr.dtype, z, qmin, qmax)
    with np.errstate(all="ignore"):
        if arr.dtype == np.float64:
            return _affine(arr, s, z, qmin, qmax, _MODE_PER_TENSOR_F64, None, None, True, func,
                           inv=_f32_inverse(s), exact=exact)
        return _affine(arr, s, z, qmin, qmax, _MODE_PER_TENSOR, None, None, True, func,
                       exact=exact)


def fake_quantize_per_tensor_affine_cachemask(x, scale, zero_point, quant_min, quant_max):
    """``torch.ops.aten.fake_quantize_per_tensor_affine_cachemask`` -> (out, mask).

    Python-number ``scale`` / ``zero_point``; arrays select the
    tensor-qparams overload (see :func:`fake_quantize_per_tensor_affine`).
    """
    if isinstance(scale, np.ndarray) or isinstance(zero_point, np.ndarray):
        return _per_tensor_tensor_qparams(x, scale, zero_point, quant_min, quant_max)
    func = "fake_quantize_per_tensor_affine"
    qmin = _int_arg(quant_min, "quant_min", func)
    qmax = _int_arg(quant_max, "quant_max", func)
    zp = _int_arg(zero_point, "zero_point", func)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"{func}(): argument 'scale' must be float, not {type(scale).__name__}")
    if qmin > qmax:
        raise RuntimeValueError(_QMIN_QMAX_MSG)
    if not qmin <= zp <= qmax:
        raise RuntimeValueError(_ZP_RANGE_MSG)
    return _per_tensor(x, float(scale), zp, qmin, qmax, func)


def _item(value, name, func):
    """torch's ``Tensor.item()``: the one element of a numeric array as a
    Python number (bool and integers as int, floats as float)."""
    a = np.asarray(value)
    if a.dtype.kind not in "biuf":
        raise TypeError(f"{func}: {name} must be a numeric array, got dtype {a.dtype}")
    if a.size != 1:
        raise RuntimeValueError(f"a Tensor with {a.size} elements cannot be converted to Scalar")
    v = a.reshape(-1)[0]
    return int(v) if a.dtype.kind in "biu" else float(v)


def _item_float(value, name, func):
    """``.item().toFloat()``: a checked conversion (a finite value beyond
    the float32 range raises), then rounded to float32."""
    v = _item(value, name, func)
    if np.isfinite(v) and abs(v) > float(np.finfo(F32).max):
        raise RuntimeValueError("value cannot be converted to type float without overflow")
    with np.errstate(over="ignore"):
        return F32(v)


def _item_int(value, name, func):
    """``.item().toInt()``: a checked conversion to int32 (NaN and values
    outside [-2**31, 2**31 - 1] raise), truncating a float."""
    v = _item(value, name, func)
    if isinstance(v, float) and (v != v or not -2.0 ** 31 <= v <= 2.0 ** 31 - 1):
        raise RuntimeValueError("value cannot be converted to type int without overflow")
    if isinstance(v, int) and not -2 ** 31 <= v <= 2 ** 31 - 1:
        raise RuntimeValueError("value cannot be converted to type int without overflow")
    return int(v)


_QMIN_QMAX_MSG = "`quant_min` should be less than or         equal to `quant_max`."
_ZP_RANGE_MSG = "`zero_point` must be between `quant_min` and `quant_max`."


def _per_tensor_tensor_qparams(x, scale, zero_point, quant_min, quant_max,
                               fake_quant_enabled=1):
    """``torch._fake_quantize_per_tensor_affine_cachemask_tensor_qparams``:
    ``scale.item()`` as float32, ``zero_point.item()`` as int32 (checked,
    truncated; not range checked)."""
    func = "fake_quantize_per_tensor_affine"
    qmin = _int_arg(quant_min, "quant_min", func)
    qmax = _int_arg(quant_max, "quant_max", func)
    if qmin > qmax:
        raise RuntimeValueError(_QMIN_QMAX_MSG)
    arr = _fq_input(x, func)
    # C++ evaluates the kernel's arguments right to left: zero point first
    zp = _item_int(zero_point, "zero_point", func)
    s = _item_float(scale, "scale", func)
    if not fake_quant_enabled:
        return arr, np.ones(arr.shape, dtype=np.bool_)
    return _per_tensor(arr, float(s), zp, qmin, qmax, func)


def fake_quantize_per_tensor_affine(x, scale, zero_point, quant_min, quant_max):
    """``torch.fake_quantize_per_tensor_affine``.

    With Python numbers (``scale: float, zero_point: int``): checks
    ``quant_min <= quant_max`` and ``quant_min <= zero_point <= quant_max``
    (no scale check).  With arrays (the ``tensor_qparams`` overload used by
    FakeQuantize): one-element ``scale`` / ``zero_point``, the zero point
    truncated to an int and not range-checked.  Per element, in float32::

        q_f = zp + rint(x * f32(1 / f32(scale)))
        q   = clamp(q_f, qmin, qmax)      NaN and -inf -> qmin, +inf -> qmax
        out = f32(f32(q - zp) * scale)
    """
    return fake_quantize_per_tensor_affine_cachemask(x, scale, zero_point, quant_min,
                                                     quant_max)[0]


def _dim_size(arr, axis):
    """torch's ``self.size(axis)`` with its dimension wrapping and IndexErrors."""
    if arr.ndim == 0:
        raise IndexError(f"Dimension specified as {axis} but tensor has no dimensions")
    if not -arr.ndim <= axis < arr.ndim:
        raise IndexError(f"Dimension out of range (expected to be in range of "
                         f"[{-arr.ndim}, {arr.ndim - 1}], but got {axis})")
    return arr.shape[axis]


def _channel_params(arr, scale, zero_point, axis, qmin, qmax, func):
    """``fake_quantize_per_channel_affine_cachemask``'s checks, in torch's order."""
    s = np.asarray(scale)
    z = np.asarray(zero_point)
    if s.dtype != np.float32:
        raise RuntimeTypeError(
            f"Scale must be Float or BFloat16, found {_torch_dtype_name(s.dtype)}")
    if z.dtype not in (np.dtype(np.int32), np.dtype(np.float32), np.dtype(np.float16)):
        raise RuntimeTypeError("Zero-point must be Int32, Float or Half, found "
                               f"{_torch_dtype_name(z.dtype)}")
    if s.ndim != 1:
        raise RuntimeValueError("scale should be a 1-D tensor")
    if z.ndim != 1:
        raise RuntimeValueError("zero point should be a 1-D tensor")
    if s.size != z.size:
        raise RuntimeValueError("scale and zero-point need to have the same dimensions")
    axis = _int_arg(axis, "axis", func)
    if s.size != _dim_size(arr, axis):
        raise RuntimeValueError("dimensions of scale and zero-point are not consistent with input "
                                "tensor")
    if qmin > qmax:
        raise RuntimeValueError(_QMIN_QMAX_MSG)
    if z.dtype == np.int32:
        if z.size == 0:
            raise RuntimeValueError(
                "min(): Expected reduction dim to be specified for input.numel() "
                "== 0. Specify the reduction dim with the 'dim' argument.")
        if z.min() < qmin or z.max() > qmax:
            raise RuntimeValueError(_ZP_RANGE_MSG)
    if not 0 <= axis <= arr.ndim:
        raise RuntimeValueError("`axis` must be between 0 and number of dimensions of input")
    return s, z


_TORCH_DTYPE_NAMES = {"float64": "Double", "float32": "Float", "float16": "Half",
                      "int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char",
                      "uint8": "Byte", "bool": "Bool"}


def _torch_dtype_name(dtype):
    return _TORCH_DTYPE_NAMES.get(np.dtype(dtype).name, np.dtype(dtype).name)


def fake_quantize_per_channel_affine_cachemask(x, scale, zero_point, axis, quant_min,
                                               quant_max):
    """``torch.ops.aten.fake_quantize_per_channel_affine_cachemask`` -> (out, mask)."""
    func = "fake_quantize_per_channel_affine"
    qmin = _int_arg(quant_min, "quant_min", func)
    qmax = _int_arg(quant_max, "quant_max", func)
    arr = _fq_input(x, func)
    s, z = _channel_params(arr, scale, zero_point, axis, qmin, qmax, func)
    return _per_channel(arr, s, z, axis, qmin, qmax, func)


def _per_channel(arr, s, z, axis, qmin, qmax, func):
    """Per-channel kernel (torch.md 4.2) on validated parameters."""
    mode = (_MODE_CHANNEL_INT if z.dtype.kind in "iu" else
            _MODE_CHANNEL_FLOAT_F64 if arr.dtype == np.float64 else
            _MODE_CHANNEL_HALF if z.dtype == np.float16 else _MODE_CHANNEL_FLOAT)
    if arr.size == 0:
        return arr.copy(), np.zeros(arr.shape, dtype=np.bool_)
    s64 = s.astype(np.float64)
    z64 = z.astype(np.float64)  # exact (int32, float32 or float16); rounded to T by the kernel
    inv = _f32_inverse(s64)  # torch's float32 reciprocal, widened for float64 input
    exact = _needs_exact(arr.dtype, z64, qmin, qmax)
    with np.errstate(all="ignore"):
        if arr.ndim == 0:
            return _affine(arr.reshape(1), s64, z64, qmin, qmax, mode, 0, None, True,
                           func, inv=inv, exact=exact)[0].reshape(()), np.ones((), np.bool_)
        return _affine(arr, s64, z64, qmin, qmax, mode, int(axis), None, True, func, inv=inv,
                       exact=exact)


def fake_quantize_per_channel_affine(x, scale, zero_point, axis, quant_min, quant_max):
    """``torch.fake_quantize_per_channel_affine``.

    ``scale`` float32[C]; ``zero_point`` int32 (range-checked), float32 or
    float16 (not checked) [C]; ``axis >= 0``.  Per element, ``inv =
    f32(1 / scale[c])``::

        int zp:   q = int64(f32(zp + rint(f32(x * inv))))
        float zp: q = int64(rint(f32(zp + f32(x * inv))))
        (x86: NaN, +-inf -> INT64_MIN -> qmin)
        out = (double(clamp(q)) - zp) * double(scale)   rounded to x's dtype
    """
    return fake_quantize_per_channel_affine_cachemask(x, scale, zero_point, axis, quant_min,
                                                      quant_max)[0]


# ---------------------------------------------------------- learnable (LSQ)
def _lsq_check(quant_min, quant_max, func):
    qmin = _int_arg(quant_min, "quant_min", func)
    qmax = _int_arg(quant_max, "quant_max", func)
    return qmin, qmax


def _first_float(value, name, func):
    """torch's ``t[0].item<float>()``."""
    a = np.asarray(value)
    if a.ndim == 0:
        raise IndexError("invalid index of a 0-dim tensor. Use `tensor.item()` in Python or "
                         "`tensor.item<T>()` in C++ to convert a 0-dim tensor to a number")
    if a.shape[0] == 0:
        raise IndexError("index 0 is out of bounds for dimension 0 with size 0")
    return _item_float(a[0], name, func)


def fake_quantize_learnable_per_tensor_affine(x, scale, zero_point, quant_min, quant_max,
                                              grad_factor=1.0):
    """``torch._fake_quantize_learnable_per_tensor_affine``: zero point
    ``int64(clamp(nearbyint(f32(zp[0])), f32(qmin), f32(qmax)))``, then the
    per-tensor kernel (which checks the range)."""
    func = "fake_quantize_learnable_per_tensor_affine"
    qmin, qmax = _lsq_check(quant_min, quant_max, func)
    s = _first_float(scale, "scale", func)
    zp = _clamp_trunc(np.rint(_first_float(zero_point, "zero_point", func)), qmin, qmax)
    return fake_quantize_per_tensor_affine(x, float(s), zp, qmin, qmax)


def _clamp_trunc(v, qmin, qmax):
    """``int64(min(max(v, f32(qmin)), f32(qmax)))`` as torch's
    ``_get_zero_point_from_tensor`` (float32, NaN -> INT64_MIN on x86)."""
    v = F32(v)
    lo, hi = F32(qmin), F32(qmax)
    c = lo if v < lo else v
    c = hi if hi < c else c
    if not np.isfinite(c):
        return -2 ** 63
    return int(np.trunc(np.float64(c)))


def _rounded_zero_points(zero_point, qmin, qmax):
    """``zero_point.round().clamp_(qmin, qmax)`` in the zero point's own
    dtype (bounds cast to it, NaN kept)."""
    z = np.asarray(zero_point)
    if z.dtype.kind != "f":
        z = z.astype(F32)
    with np.errstate(over="ignore"):
        lo, hi = z.dtype.type(qmin), z.dtype.type(qmax)
    r = np.rint(z)
    r = np.where(r < lo, lo, r)
    return np.where(hi < r, hi, r).astype(z.dtype)


def _to_int32(z):
    """``.to(torch.int)`` on x86: NaN, inf and out-of-range values -> INT32_MIN."""
    z = np.asarray(z, np.float64)
    ok = np.isfinite(z) & (z > -2.0 ** 31 - 1) & (z < 2.0 ** 31)
    return np.where(ok, np.trunc(np.where(ok, z, 0)), -2.0 ** 31).astype(np.int32)


def fake_quantize_learnable_per_channel_affine(x, scale, zero_point, axis, quant_min,
                                               quant_max, grad_factor=1.0):
    """``torch._fake_quantize_learnable_per_channel_affine``: zero point
    ``zp.round().clamp(qmin, qmax).int()``, then the per-channel kernel."""
    func = "fake_quantize_learnable_per_channel_affine"
    qmin, qmax = _lsq_check(quant_min, quant_max, func)
    zi = _to_int32(_rounded_zero_points(zero_point, qmin, qmax))
    return fake_quantize_per_channel_affine(x, scale, zi.reshape(np.shape(zero_point)), axis,
                                            qmin, qmax)


def _fmaf(a, b, c):
    """``fmaf(a, b, c)`` on float32 arrays, rounded once: ``a * b`` is exact in
    float64, the sum is made exact with TwoSum and rounded to odd, and the
    round-to-odd float64 rounds correctly to float32 (53 >= 24 + 2)."""
    p = a.astype(np.float64) * b.astype(np.float64)
    c = np.asarray(c, np.float64)
    s = p + c
    bb = s - p
    err = (p - (s - bb)) + (c - bb)          # s + err == p + c exactly
    even = (s.view(np.int64) & 1) == 0
    fix = (err != 0) & even & np.isfinite(s)
    s = np.where(fix, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return s.astype(F32)


def _x86_int64(v):
    """``static_cast<int64_t>(float)`` on x86: NaN, inf and values outside
    the int64 range give INT64_MIN."""
    v = np.asarray(v, np.float64)
    ok = np.isfinite(v) & (v >= -2.0 ** 63) & (v < 2.0 ** 63)
    return np.where(ok, np.where(ok, v, 0).astype(np.int64), np.int64(-2 ** 63))


def _lsq_grads(dY, x, s, zb, qmin, qmax, gf, axis, func):
    """Per-element LSQ gradients (torch.md 5), torch's CPU kernel as compiled
    (FMA contraction):

        xq = int64(rint(fmaf(x, inv, zb)))            x86 conversion
        in = qmin <= xq <= qmax                        int64 compare
        d  = f32(clamp(xq) - zb)   (exact int64 difference per tensor;
                                    float32(q) - zb per channel, float zb)
        dX = dY * in
        dS = in ? f32(f32(f32(dY * fmaf(d, s, -x)) * inv) * gf)
                : f32(f32(dY * f32(q_bound - zb)) * gf)
        dZ = in ? 0 : f32(f32(f32(-dY) * s) * gf)
    """
    with np.errstate(all="ignore"):
        shape = [1] * x.ndim
        if axis is not None:
            shape[axis] = x.shape[axis]
        s32 = s.astype(F32).reshape(shape)
        z64 = zb.reshape(shape)
        z32 = z64.astype(F32)         # the fma addend: zb as a float
        inv = (F32(1) / s32).astype(F32)
        x = x.astype(F32, copy=False)
        xq = _x86_int64(np.rint(_fmaf(x, inv, z32)))
        mask = (xq >= qmin) & (xq <= qmax)
        q = np.clip(xq, qmin, qmax)
        gf = F32(gf)
        if axis is None:   # int64 zero point: exact integer differences
            zi = int(z64.item())
            dsmall, dbig = F32(qmin - zi), F32(qmax - zi)
            qz = (q - zi).astype(F32)
        else:              # float zero point: float32 differences
            dsmall = (F32(qmin) - z32).astype(F32)
            dbig = (F32(qmax) - z32).astype(F32)
            qz = (q.astype(F32) - z32).astype(F32)
        diff = _fmaf(qz, np.broadcast_to(s32, qz.shape), -x)
        dX = _ops.ste_backward(dY, mask)
        inside = (((dY * diff).astype(F32) * inv).astype(F32) * gf).astype(F32)
        outside = (np.where(xq < qmin, (dY * dsmall).astype(F32),
                            (dY * dbig).astype(F32)) * gf).astype(F32)
        dS = np.where(mask, inside, outside).astype(F32)
        dZ = np.where(mask, F32(0), ((-dY * s32).astype(F32) * gf).astype(F32)).astype(F32)
    return dX, dS, dZ


def _lsq_f32(arrays):
    """torch's ``TORCH_CHECK(t.scalar_type() == ScalarType::Float)`` per input."""
    for name, a in arrays:
        if a.dtype != np.float32:
            raise RuntimeTypeError(
                f"Expected {name}.scalar_type() == ScalarType::Float to be true, "
                "but got false.")


def fake_quantize_learnable_per_tensor_affine_backward(grad, x, scale, zero_point, quant_min,
                                                       quant_max, grad_factor=1.0):
    """``torch.ops.aten._fake_quantize_learnable_per_tensor_affine_backward``
    -> ``(dX, dScale[1], dZeroPoint[1])``.

    Backward zero point ``zb = trunc(clamp(f32(zp + 0.5), qmin, qmax))`` (not
    the forward one); per element ``xq = int64(rint(fmaf(x, inv, zb)))``::

        dX = dY * (qmin <= xq <= qmax)
        xq < qmin: dS = dY * (qmin - zb) * gf;  dZ = -dY * s * gf
        xq > qmax: dS = dY * (qmax - zb) * gf;  dZ = -dY * s * gf
        else:      dS = dY * fmaf(f32(xq - zb), s, -x) * inv * gf;  dZ = 0

    summed to shape [1] (in float64, rounded once; ``quantcore.torch``
    sums with torch's own reduction instead).  Empty x returns ``(x, scale,
    zero_point)`` (torch's bug).
    """
    dX, dS, dZ, summed = _lsq_terms_per_tensor(grad, x, scale, zero_point, quant_min,
                                               quant_max, grad_factor)
    if summed:
        return dX, dS, dZ
    return (dX, np.array([dS.sum(dtype=np.float64)], dtype=F32),
            np.array([dZ.sum(dtype=np.float64)], dtype=F32))


def _lsq_terms_per_tensor(grad, x, scale, zero_point, quant_min, quant_max, grad_factor=1.0):
    """The per-tensor LSQ backward before its sums: torch's checks in
    torch's order, then ``(dX, dScale_vec, dZeroPoint_vec, False)`` per
    element (the vectors torch sums), or ``(x, scale, zero_point, True)``
    for an empty x (torch's early return)."""
    func = "fake_quantize_learnable_per_tensor_affine_backward"
    qmin, qmax = _lsq_check(quant_min, quant_max, func)
    s = _first_float(scale, "scale", func)
    zb = _clamp_trunc(F32(_first_float(zero_point, "zero_point", func) + F32(0.5)), qmin,
                      qmax)
    g, xa, sa, za = (np.asarray(v) for v in (grad, x, scale, zero_point))
    _lsq_f32([("dY", g), ("X", xa), ("scale", sa), ("zero_point", za)])
    if g.size != xa.size:
        raise RuntimeValueError("`X` and `dY` are not the same size")
    if not (qmin <= 0 and qmax >= 0):
        raise RuntimeValueError("`quant_min` should be less than or         equal to "
                                "`quant_max`, and the quantization range should include 0.")
    if not qmin <= zb <= qmax:
        raise RuntimeValueError(_ZP_RANGE_MSG)
    if xa.size == 0:
        return xa, sa, za, True
    if g.shape != xa.shape:   # torch's TensorIterator broadcasts X and dY
        try:
            shape = np.broadcast_shapes(g.shape, xa.shape)
        except ValueError as exc:
            raise RuntimeValueError(f"{func}: X {xa.shape} and dY {g.shape} do not "
                                    "broadcast") from exc
        g, xa = np.broadcast_to(g, shape), np.broadcast_to(xa, shape)
    return _lsq_grads(g, xa, np.array([float(s)]), np.array([float(zb)]), qmin, qmax,
                      grad_factor, None, func) + (False,)


def fake_quantize_learnable_per_channel_affine_backward(grad, x, scale, zero_point, axis,
                                                        quant_min, quant_max, grad_factor=1.0):
    """``torch.ops.aten._fake_quantize_learnable_per_channel_affine_backward``
    -> ``(dX, dScale[C], dZeroPoint[C])``; zero point ``clamp(rint(zp))``
    (float), otherwise the per-tensor formulas per channel, summed over the
    non-axis dimensions (a 1-D x sums everything: 0-d results; float64
    sums rounded once)."""
    dX, dS, dZ, summed = _lsq_terms_per_channel(grad, x, scale, zero_point, axis, quant_min,
                                                quant_max, grad_factor)
    if summed:
        return dX, dS, dZ
    if dX.ndim == 1:
        # torch sums a 1-D input to 0-d gradients
        return (dX, np.asarray(dS.sum(dtype=np.float64), dtype=F32),
                np.asarray(dZ.sum(dtype=np.float64), dtype=F32))
    other = _lsq_sum_axes(dX.ndim, axis)
    return (dX, dS.sum(axis=other, dtype=np.float64).astype(F32),
            dZ.sum(axis=other, dtype=np.float64).astype(F32))


def _lsq_sum_axes(ndim, axis):
    """The dimensions the per-channel LSQ backward sums over (all but axis)."""
    return tuple(d for d in range(ndim) if d != axis)


def _lsq_terms_per_channel(grad, x, scale, zero_point, axis, quant_min, quant_max,
                           grad_factor=1.0):
    """The per-channel LSQ backward before its sums, as
    :func:`_lsq_terms_per_tensor` (checks in torch's order)."""
    func = "fake_quantize_learnable_per_channel_affine_backward"
    qmin, qmax = _lsq_check(quant_min, quant_max, func)
    g, xa, sa, za = (np.asarray(v) for v in (grad, x, scale, zero_point))
    zr = _rounded_zero_points(za, qmin, qmax)
    _lsq_f32([("dY_", g), ("X_", xa), ("scale_", sa), ("zero_point_", za)])
    if g.shape != xa.shape:
        raise RuntimeValueError("`X` and `dY` are not the same size")
    if not (qmin <= 0 and qmax >= 0):
        raise RuntimeValueError("Expecting `quant_min` <= 0 and `quant_max` >= 0")
    if sa.ndim != 1:
        raise RuntimeValueError("scale should be a 1-D tensor")
    if za.ndim != 1:
        raise RuntimeValueError("zero point should be a 1-D tensor")
    if sa.size != za.size:
        raise RuntimeValueError("scale and zero-point need to have the same dimensions")
    axis = _int_arg(axis, "axis", func)
    if sa.size != _dim_size(xa, axis):
        raise RuntimeValueError("dimensions of scale and zero-point are not consistent with "
                                "input tensor")
    if zr.size == 0:
        raise RuntimeValueError("aminmax(): cannot compute aminmax over an empty dimension as "
                                "the operation has no identity.")
    if np.isnan(zr).any() or zr.min() < qmin or zr.max() > qmax:
        raise RuntimeValueError(_ZP_RANGE_MSG)
    if not 0 <= axis < xa.ndim:
        raise RuntimeValueError("`axis` must be between 0 and number of dimensions of input")
    if xa.size == 0:
        return xa, sa, za, True
    return _lsq_grads(g, xa, sa.astype(np.float64), zr.astype(np.float64), qmin, qmax,
                      grad_factor, axis, func) + (False,)


# ------------------------------------------------------------- fused op
def _need_f32(arr, what="self"):
    """torch's ``data_ptr<float>()`` on a non-float32 tensor."""
    if arr.dtype != np.float32:
        raise RuntimeTypeError(
            f"expected scalar type Float but found {_torch_dtype_name(arr.dtype)}")


def _fused(x, observer_on, fake_quant_on, running_min, running_max, scale, zero_point,
           averaging_const, quant_min, quant_max, ch_axis, per_row_fake_quant,
           symmetric_quant):
    """The fused op as a pure function, in torch's order of steps and checks
    (``fused_moving_avg_obs_fake_quant_cpu``).  Returns ``(out, mask,
    running_min, running_max, scale, zero_point)``: new arrays for the
    state that torch changes, the arguments themselves otherwise.  Nothing
    is written here, so a failing call leaves the state as it was (torch may
    have updated part of it before raising)."""
    func = "fused_moving_avg_obs_fake_quant"
    arr = _fq_input(x, func)
    qmin = _int_arg(quant_min, "quant_min", func)
    qmax = _int_arg(quant_max, "quant_max", func)
    ch_axis = _int_arg(ch_axis, "ch_axis", func)
    rmin, rmax = np.asarray(running_min), np.asarray(running_max)
    s_arr, z_arr = np.asarray(scale), np.asarray(zero_point)
    if arr.size == 0:
        return arr.copy(), np.ones(arr.shape, np.bool_), rmin, rmax, s_arr, z_arr
    if not ch_axis < arr.ndim:
        raise RuntimeValueError("Error in fused_moving_avg_obs_fake_quant_cpu: ch_axis must be < "
                                "self.dim()")
    observe = _item_int(observer_on, "observer_on", func)
    c = F32(averaging_const)
    if per_row_fake_quant:
        y = arr
        if arr.ndim != 2:
            perm = list(range(arr.ndim))
            perm[ch_axis], perm[0] = 0, ch_axis
            y = arr.transpose(perm)
            if y.ndim < 2:
                raise IndexError(f"Dimension out of range (expected to be in range of "
                                 f"[{-max(y.ndim, 1)}, {max(y.ndim, 1) - 1}], but got 1)")
            y = y.reshape(y.shape[0], -1)
        size = _dim_size(arr, ch_axis)
        if rmin.size == 0:
            # torch resizes all four buffers; the new scale / zero_point
            # elements are uninitialized memory there, copies of the first
            # (or 1.0 / 0) here
            rmin = np.full(size, np.inf, F32)
            rmax = np.full(size, -np.inf, F32)
            s_arr = np.resize(s_arr if s_arr.size else np.ones(1, s_arr.dtype), size)
            z_arr = np.resize(z_arr if z_arr.size else np.zeros(1, z_arr.dtype), size)
        if observe:
            if ch_axis != 0:
                raise RuntimeValueError(
                    "Per-channel FakeQuant in fused_moving_avg_obs_fake_quant is "
                    "only supported on axis == 0")
            _need_f32(y)
            _need_f32(rmin)
            _need_f32(rmax)
            if rmin.size < y.shape[0] or rmax.size < y.shape[0]:
                raise ValueError(f"{func}: running_min / running_max have {rmin.size} values, "
                                 f"x has {y.shape[0]} rows")
            cur_min, cur_max = _ops.minmax(y, axis=0)
            rmin, rmax = _moving_average(rmin, rmax, cur_min, cur_max, c)
    elif observe:
        _need_f32(arr)
        _need_f32(rmin)
        _need_f32(rmax)
        if rmin.size == 0 or rmax.size == 0:
            raise ValueError(f"{func}: running_min / running_max are empty (torch writes out "
                             "of bounds)")
        cur_min, cur_max = _ops.minmax(arr)
        rmin, rmax = _moving_average(rmin, rmax, cur_min.reshape(1), cur_max.reshape(1), c)
    if not _item_int(fake_quant_on, "fake_quant_on", func):
        return arr.copy(), np.ones(arr.shape, np.bool_), rmin, rmax, s_arr, z_arr
    if per_row_fake_quant:
        _need_f32(rmin)
        _need_f32(rmax)
        n = rmin.size
        if s_arr.ndim == 0 or z_arr.ndim == 0:
            raise IndexError("invalid index of a 0-dim tensor. Use `tensor.item()` in Python "
                             "or `tensor.item<T>()` in C++ to convert a 0-dim tensor to a "
                             "number")
        for name, t in (("scale", s_arr), ("zero_point", z_arr)):
            if t.shape[0] < n:
                raise IndexError(f"select(): index {t.shape[0]} out of range for tensor of "
                                 f"size [{t.shape[0]}] at dimension 0")
        sc, zp = Q.choose_qparams_fused(rmin, rmax[:n], qmin, qmax, bool(symmetric_quant))
        s_arr, z_arr = s_arr.copy(), z_arr.copy()
        with np.errstate(invalid="ignore", over="ignore"):
            s_arr[:n] = sc.reshape(s_arr[:n].shape[:1] + (1,) * (s_arr.ndim - 1))
            z_arr[:n] = zp.astype(np.int32).reshape(z_arr[:n].shape[:1] + (1,) *
                                                    (z_arr.ndim - 1))
        out, mask = fake_quantize_per_channel_affine_cachemask(arr, s_arr, z_arr, ch_axis,
                                                               qmin, qmax)
        return out, mask, rmin, rmax, s_arr, z_arr
    mn = _item_float(rmin, "running_min", func)
    mx = _item_float(rmax, "running_max", func)
    sc, zp = Q.choose_qparams_fused(np.array([mn], F32), np.array([mx], F32), qmin, qmax,
                                    bool(symmetric_quant))
    if s_arr.ndim == 0 or z_arr.ndim == 0:
        raise IndexError("invalid index of a 0-dim tensor. Use `tensor.item()` in Python or "
                         "`tensor.item<T>()` in C++ to convert a 0-dim tensor to a number")
    if s_arr.shape[0] == 0 or z_arr.shape[0] == 0:
        raise IndexError("index 0 is out of bounds for dimension 0 with size 0")
    s_arr, z_arr = s_arr.copy(), z_arr.copy()
    with np.errstate(invalid="ignore", over="ignore"):
        s_arr[0] = sc[0]
        z_arr[0] = np.int32(zp[0])
    out, mask = _per_tensor_tensor_qparams(arr, s_arr, z_arr, qmin, qmax)
    return out, mask, rmin, rmax, s_arr, z_arr


def _moving_average(rmin, rmax, cur_min, cur_max, c):
    """torch's fused update of the first ``len(cur)`` running values:
    ``r = cur if isinf(r) else f32(r + f32(c * f32(cur - r)))`` per side
    (the moving average of :mod:`quantcore.observers`, then the per-side
    reset)."""
    n = cur_min.size
    core = _obs.MovingAverageMinMaxObserver(0.5, axis=None, nan_policy="propagate")
    core.averaging_constant = float(c)
    rmin, rmax = rmin.copy(), rmax.copy()
    fmin, fmax = rmin.reshape(-1), rmax.reshape(-1)
    old_min, old_max = fmin[:n].copy(), fmax[:n].copy()
    core.min_val, core.max_val = old_min, old_max
    avg_min, avg_max = core._combine(cur_min.astype(F32).reshape(-1),
                                     cur_max.astype(F32).reshape(-1), False)
    fmin[:n] = np.where(np.isinf(old_min), cur_min.reshape(-1), np.asarray(avg_min).reshape(-1))
    fmax[:n] = np.where(np.isinf(old_max), cur_max.reshape(-1), np.asarray(avg_max).reshape(-1))
    return rmin, rmax


def fused_moving_avg_obs_fake_quant(x, observer_on, fake_quant_on, running_min, running_max,
                                    scale, zero_point, averaging_const, quant_min, quant_max,
                                    ch_axis, per_row_fake_quant=False, symmetric_quant=False):
    """``torch.fused_moving_avg_obs_fake_quant``: updates ``running_min``,
    ``running_max``, ``scale`` and ``zero_point`` in place and returns the
    fake-quantized x.

    Observer on (float32 x and running buffers only): per side
    ``r = cur if isinf(r) else f32(r + f32(f32(c) * f32(cur - r)))``.
    Fake quant on: ``(scale, zp) = choose_qparams_fused(r_min, r_max, ...)``
    (:func:`quantcore.qparams.choose_qparams_fused`), stored, then the
    per-tensor (tensor-qparams) or per-channel kernel.  Fake quant off: a
    copy of x, scale / zero_point untouched.  Per row, empty running buffers
    resize all four arrays to [C] (their arrays must own their data for
    that).  An empty x returns a copy and changes nothing.
    """
    state = (running_min, running_max, scale, zero_point)
    for name, a in zip(("running_min", "running_max", "scale", "zero_point"), state):
        if not isinstance(a, np.ndarray):
            raise TypeError(f"fused_moving_avg_obs_fake_quant: {name} must be a numpy array "
                            "(it is updated in place)")
    res = _fused(x, observer_on, fake_quant_on, running_min, running_max, scale, zero_point,
                 averaging_const, quant_min, quant_max, ch_axis, per_row_fake_quant,
                 symmetric_quant)
    for name, target, value in zip(("running_min", "running_max", "scale", "zero_point"),
                                   state, res[2:]):
        if value is not target:
            _write_back(target, value, name)
    return res[0]


def _write_back(target, value, name):
    if target.size != value.size:
        try:
            target.resize(value.shape, refcheck=False)
        except ValueError as exc:
            raise ValueError(f"fused_moving_avg_obs_fake_quant: {name} has {target.size} "
                             f"values and must be resized to {value.size}; pass an array "
                             "that owns its data") from exc
    if target.shape != value.shape:
        target.shape = value.shape
    np.copyto(target, value, casting="unsafe")


# ------------------------------------------------------- predefined objects
default_observer = MinMaxObserver.with_args(quant_min=0, quant_max=127)
default_weight_observer = MinMaxObserver.with_args(dtype="qint8",
                                                   qscheme="per_tensor_symmetric")
weight_observer_range_neg_127_to_127 = MinMaxObserver.with_args(
    dtype="qint8", qscheme="per_tensor_symmetric", quant_min=-127, quant_max=127, eps=2 ** -12)
default_histogram_observer = HistogramObserver.with_args(quant_min=0, quant_max=127)
default_per_channel_weight_observer = PerChannelMinMaxObserver.with_args(
    dtype="qint8", qscheme="per_channel_symmetric")
per_channel_weight_observer_range_neg_127_to_127 = PerChannelMinMaxObserver.with_args(
    dtype="qint8", qscheme="per_channel_symmetric", quant_min=-127, quant_max=127,
    eps=2 ** -12)
default_float_qparams_observer = PerChannelMinMaxObserver.with_args(
    dtype="quint8", qscheme="per_channel_affine_float_qparams", ch_axis=0)
default_float_qparams_observer_4bit = PerChannelMinMaxObserver.with_args(
    dtype="quint4x2", qscheme="per_channel_affine_float_qparams", ch_axis=0)
default_fixed_qparams_range_neg1to1_observer = FixedQParamsObserver.with_args(
    scale=2.0 / 256.0, zero_point=128, dtype="quint8", quant_min=0, quant_max=255)
default_fixed_qparams_range_0to1_observer = FixedQParamsObserver.with_args(
    scale=1.0 / 256.0, zero_point=0, dtype="quint8", quant_min=0, quant_max=255)
default_symmetric_fixed_qparams_observer = default_fixed_qparams_range_neg1to1_observer
default_affine_fixed_qparams_observer = default_fixed_qparams_range_0to1_observer

default_fake_quant = FakeQuantize.with_args(
    observer=MovingAverageMinMaxObserver, quant_min=0, quant_max=255, dtype="quint8",
    qscheme="per_tensor_affine", reduce_range=True)
default_weight_fake_quant = FakeQuantize.with_args(
    observer=MovingAverageMinMaxObserver, quant_min=-128, quant_max=127, dtype="qint8",
    qscheme="per_tensor_symmetric", reduce_range=False)
default_dynamic_fake_quant = FakeQuantize.with_args(
    observer=MovingAverageMinMaxObserver, quant_min=0, quant_max=255, is_dynamic=True,
    dtype="quint8", averaging_constant=1)
default_fixed_qparams_range_neg1to1_fake_quant = FixedQParamsFakeQuantize.with_args(
    observer=default_fixed_qparams_range_neg1to1_observer)
default_fixed_qparams_range_0to1_fake_quant = FixedQParamsFakeQuantize.with_args(
    observer=default_fixed_qparams_range_0to1_observer)
default_symmetric_fixed_qparams_fake_quant = default_fixed_qparams_range_neg1to1_fake_quant
default_affine_fixed_qparams_fake_quant = default_fixed_qparams_range_0to1_fake_quant
default_per_channel_weight_fake_quant = FakeQuantize.with_args(
    observer=MovingAveragePerChannelMinMaxObserver, quant_min=-128, quant_max=127,
    dtype="qint8", qscheme="per_channel_symmetric", reduce_range=False, ch_axis=0)
default_embedding_fake_quant = FakeQuantize.with_args(
    observer=MovingAveragePerChannelMinMaxObserver, qscheme="per_channel_affine_float_qparams",
    dtype="quint8", quant_min=0, quant_max=255, ch_axis=0, averaging_constant=1)
default_embedding_fake_quant_4bit = FakeQuantize.with_args(
    observer=MovingAveragePerChannelMinMaxObserver, qscheme="per_channel_affine_float_qparams",
    ch_axis=0, dtype="quint4x2", averaging_constant=1)
default_histogram_fake_quant = FakeQuantize.with_args(
    observer=HistogramObserver, quant_min=0, quant_max=255, dtype="quint8",
    qscheme="per_tensor_affine", reduce_range=True)
default_fused_act_fake_quant = FusedMovingAvgObsFakeQuantize.with_args(
    observer=MovingAverageMinMaxObserver, quant_min=0, quant_max=255, dtype="quint8")
default_fused_wt_fake_quant = FusedMovingAvgObsFakeQuantize.with_args(
    observer=MovingAverageMinMaxObserver, quant_min=-128, quant_max=127, dtype="qint8",
    qscheme="per_tensor_symmetric")
default_fused_per_channel_wt_fake_quant = FusedMovingAvgObsFakeQuantize.with_args(
    observer=MovingAveragePerChannelMinMaxObserver, quant_min=-128, quant_max=127,
    dtype="qint8", qscheme="per_channel_symmetric")
fused_wt_fake_quant_range_neg_127_to_127 = FusedMovingAvgObsFakeQuantize.with_args(
    observer=MovingAverageMinMaxObserver, quant_min=-127, quant_max=127, dtype="qint8",
    qscheme="per_tensor_symmetric", eps=2 ** -12)
fused_per_channel_wt_fake_quant_range_neg_127_to_127 = FusedMovingAvgObsFakeQuantize.with_args(
    observer=MovingAveragePerChannelMinMaxObserver, quant_min=-127, quant_max=127,
    dtype="qint8", qscheme="per_channel_symmetric", eps=2 ** -12)


# cupy input: computed on the CPU path through host memory (see _arrays.stage_cupy)
A.stage_cupy_api(globals(), __all__)
