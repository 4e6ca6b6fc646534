"""NVIDIA pytorch_quantization's MaxCalibrator (see quantcore.calib)."""

import numpy as np

from .. import _arrays as A
from .._locks import Locked, locked, locked_with_other
from ._common import (_check_int, _check_keys, _check_merge_partner, _check_num_bits, _device_amax,
                      _f32, _keep_up, _max_into)


# ------------------------------------------------------------ MaxCalibrator
class MaxCalibrator(Locked):
    """Running absolute maximum, NVIDIA ``pytorch_quantization`` style.

    Parameters
    ----------
    num_bits : int, default 8
        Kept for the quantizer that uses the amax (2..16).
    axis : None, int or tuple of ints
        None: one amax per tensor (a 0-d array).  Otherwise the axes that are
        *kept*: every other axis is reduced and the result keeps its
        dimensions, e.g. ``axis=0`` on (2, 2) gives shape (2, 1) and
        ``axis=(1,)`` on (2, 3, 4) gives (1, 3, 1).  A result of one element
        is squeezed to 0-d.  Negative axes count from the end.
    unsigned : bool, default False
    track_amax : bool, default False
        Keep a copy of every batch's amax in ``amaxs``.

    Notes
    -----
    ``collect(x)`` computes ``local = max(|x|)`` over the reduced axes and
    then ``amax = maximum(amax, local)`` elementwise.  float16 and float32
    input give a float32 amax, float64 a float64 amax.  A NaN in ``x``
    raises ValueError and leaves the state unchanged (PQ would store NaN);
    +-inf gives an inf amax, as in PQ.
    """

    def __init__(self, num_bits=8, axis=None, unsigned=False, track_amax=False):
        func = "MaxCalibrator"
        self._num_bits = _check_num_bits(num_bits, func)
        if axis is not None:
            axes = (axis,) if not isinstance(axis, (tuple, list)) else tuple(axis)
            for a in axes:
                _check_int(a, "axis", func)
            if len(set(axes)) != len(axes):
                raise ValueError(f"{func}: axis has repeated entries: {axis!r}")
            axis = tuple(int(a) for a in axes)
        self._axis = axis
        self._unsigned = bool(unsigned)
        self._track_amax = bool(track_amax)
        self._amax = None
        self.amaxs = []

    num_bits = property(lambda self: self._num_bits)
    axis = property(lambda self: self._axis)
    unsigned = property(lambda self: self._unsigned)

    def _reduce(self, arr, func):
        if self._axis is None:
            keep = ()
        else:
            keep = []
            for a in self._axis:
                if not -arr.ndim <= a < arr.ndim:
                    raise ValueError(f"{func}: axis {a} is out of range for an array of "
                                     f"ndim {arr.ndim}")
                keep.append(a % arr.ndim)
            keep = tuple(sorted(keep))
        if arr.size == 0:
            raise ValueError(f"{func}: x is empty")
        work = A.compute_dtype(arr.dtype)
        if A.is_cupy_array(arr):
            local = _device_amax(arr, keep, work)
            nan = bool(A.array_module(arr).isnan(local).any())  # (a one-byte read)
        elif not keep:
            local = np.asarray(np.abs(arr).max().astype(work))
            nan = bool(np.isnan(local).any())
        else:
            red = tuple(d for d in range(arr.ndim) if d not in keep)
            local = np.abs(arr).max(axis=red, keepdims=True).astype(work)
            nan = bool(np.isnan(local).any())
        if nan:
            raise ValueError(f"{func}: x contains NaN")
        if local.size == 1:
            local = local.reshape(())
        return local

    @locked
    def collect(self, x):
        """Update the running amax with the abs-max of ``x``.

        Raises
        ------
        ValueError
            NaN in ``x``, an empty ``x``, an axis out of range, or an amax
            whose shape differs from the one collected before
            ("amax shape changed").
        """
        func = "MaxCalibrator.collect"
        arr = A.as_float_array(x, "x", func)
        local = self._reduce(arr, func)
        if self._amax is None:
            self._amax = local.copy()
        else:
            if local.shape != self._amax.shape:
                raise ValueError(f"{func}: amax shape changed! got {local.shape}, collected "
                                 f"{self._amax.shape} before")
            self._amax = _keep_up(self._amax, local)
            if isinstance(local, np.ndarray):
                np.maximum(self._amax, local, out=self._amax)  # in place, as PQ's copy_
            else:
                _max_into(self._amax, local)
        if self._track_amax:
            self.amaxs.append(local.copy())

    @locked
    def compute_amax(self):
        """The collected amax (a copy), or None before any ``collect``."""
        return None if self._amax is None else self._amax.copy()

    @locked
    def reset(self):
        """Forget everything collected."""
        self._amax = None
        self.amaxs = []

    @locked_with_other
    def merge(self, other):
        """Fold in another calibrator's statistics: ``amax = maximum(a, b)``.

        Exact: merging calibrators that saw disjoint chunks gives the amax of
        a single pass over all of them.
        """
        func = "MaxCalibrator.merge"
        _check_merge_partner(self, other, MaxCalibrator, "_axis", "axis differs", func)
        if other._amax is None:
            return self
        if self._amax is None:
            self._amax = other._amax.copy()
        else:
            if other._amax.shape != self._amax.shape:
                raise ValueError(f"{func}: amax shapes differ ({self._amax.shape} vs "
                                 f"{other._amax.shape})")
            theirs = _keep_up(other._amax, self._amax)
            self._amax = np.maximum(self._amax, theirs) if isinstance(theirs, np.ndarray) \
                else _max_into(self._amax.copy(), theirs)
        if self._track_amax:
            self.amaxs.extend(a.copy() for a in other.amaxs)
        return self

    @locked
    def state_dict(self):
        """``{"collected": bool, "amax": ndarray}`` (amax is an empty float32
        array when nothing was collected)."""
        amax = np.zeros((0,), _f32) if self._amax is None else self._amax.copy()
        return {"collected": self._amax is not None, "amax": amax}

    @locked
    def load_state_dict(self, state):
        """Restore what :meth:`state_dict` returned."""
        func = "MaxCalibrator.load_state_dict"
        _check_keys(state, ("collected", "amax"), func)
        if not state["collected"]:
            self._amax = None
            return
        amax = A.array_module(state["amax"]).array(state["amax"], copy=True)
        if amax.dtype.kind != "f":
            raise TypeError(f"{func}: amax must be a float array, got {amax.dtype}")
        self._amax = amax

    def __repr__(self):
        return (f"MaxCalibrator(num_bits={self._num_bits}, axis={self._axis!r}, "
                f"unsigned={self._unsigned}, track_amax={self._track_amax})")
