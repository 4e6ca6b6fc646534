"""Distributed calibration and fake quantization of chunked ``dask.array``s.

Calibration is a tree reduction of mergeable statistics: every chunk gives
its raw per-channel ``(min, max, flags)`` (one pass of the core kernel), the
partial results are folded ``split_every`` at a time, and the NaN /
signed-zero rule is applied once at the end, so the result equals
:func:`quantcore.minmax` over the whole array, bit for bit, whatever the
chunking.  Fake quantization is a ``map_blocks`` with each block's slice of
the per-channel parameters.

Chunks may be numpy or cupy arrays (each block runs on its own back end);
the per-channel statistics that travel between workers are small host
(numpy) arrays, and so are the results of :func:`minmax`.

``dask`` is an optional dependency (``pip install 'dask[array,distributed]'``).
"""
import numbers

import numpy as np

from . import ops
from ._arrays import FLOAT_DTYPES, normalize_axis, to_host
from .observers import MinMaxObserver, ObserverBase

__all__ = ["minmax", "calibrate", "fake_quant"]


def _require_dask():
    try:
        import dask
        import dask.array as da
    except ImportError as exc:  # pragma: no cover - exercised without dask
        raise ImportError("quantcore.dask needs dask: pip install 'dask[array]'") from exc
    return dask, da


def _check_array(darr, func):
    """A dask array of float16 / float32 / float64: TypeError otherwise."""
    _, da = _require_dask()
    if not isinstance(darr, da.Array):
        raise TypeError(f"{func}: expected a dask.array.Array, got {type(darr).__name__} "
                        "(use the quantcore function of the same name for in-memory arrays)")
    if np.dtype(darr.dtype).newbyteorder("=") not in FLOAT_DTYPES:
        raise TypeError(f"{func}: x must have a floating dtype (float16, float32 or float64), "
                        f"got {darr.dtype}")


def _check_split_every(split_every, func):
    if isinstance(split_every, bool) or not isinstance(split_every, numbers.Integral) or \
            split_every < 2:
        raise ValueError(f"{func}: split_every must be an integer >= 2, got {split_every!r}")
    return int(split_every)


def _block_stats(block, axis, offset, channels):
    """Raw (lo[C], hi[C], flags[C]) of one block, placed at its channels."""
    dtype = np.float64 if block.dtype == np.float64 else np.float32
    lo = np.full(channels, np.inf, dtype)
    hi = np.full(channels, -np.inf, dtype)
    fl = np.zeros(channels, np.uint8)
    if block.size == 0:
        return lo, hi, fl
    blo, bhi, bfl = (to_host(v) for v in ops._minmax_flags(block, axis,
                                                            "quantcore.dask.minmax"))
    if axis is None:
        lo[0], hi[0], fl[0] = blo, bhi, bfl
    else:
        n = block.shape[axis]
        lo[offset:offset + n], hi[offset:offset + n], fl[offset:offset + n] = blo, bhi, bfl
    return lo, hi, fl


def _fold(*parts):
    """Exact merge of raw partial statistics (NaN-skipping min / max, OR flags)."""
    lo, hi, fl = (p.copy() for p in parts[0])
    for plo, phi, pfl in parts[1:]:
        np.fmin(lo, plo, out=lo)
        np.fmax(hi, phi, out=hi)
        fl |= pfl
    return lo, hi, fl


def minmax(darr, axis=None, *, split_every=8, compute=True):
    """Per-tensor or per-channel (min, max) of a dask array, exactly as
    :func:`quantcore.minmax` on the whole array.

    Parameters
    ----------
    darr : dask.array.Array of float16 / float32 / float64 (numpy chunks)
    axis : int or None
    split_every : int
        Fan-in of the tree reduction (>= 2).
    compute : bool
        False returns a ``dask.delayed`` of the result instead.
    """
    dask, _ = _require_dask()
    func = "quantcore.dask.minmax"
    _check_array(darr, func)
    split_every = _check_split_every(split_every, func)
    axis = normalize_axis(axis, darr.ndim, func)
    channels = 1 if axis is None else darr.shape[axis]
    starts = None if axis is None else np.concatenate([[0], np.cumsum(darr.chunks[axis])])
    blocks = darr.to_delayed()
    parts = []
    for index in np.ndindex(blocks.shape):
        offset = 0 if axis is None else int(starts[index[axis]])
        parts.append(dask.delayed(_block_stats)(blocks[index], axis, offset, channels))
    if not parts:
        parts = [dask.delayed(_block_stats)(np.empty(0, np.float32), None, 0, channels)]
    while len(parts) > 1:
        parts = [dask.delayed(_fold)(*parts[k:k + split_every])
                 for k in range(0, len(parts), split_every)]
    result = dask.delayed(_finish)(parts[0], axis is None, np.dtype(darr.dtype))
    return result.compute() if compute else result


def _finish(stats, per_tensor, dtype):
    lo, hi, fl = stats
    lo, hi = ops._finish_minmax(lo, hi, fl)
    if per_tensor:
        lo, hi = lo.reshape(()), hi.reshape(())
    return lo.astype(dtype), hi.astype(dtype)


def calibrate(darr, observer=None, *, split_every=8):
    """Fold a whole dask array into a mergeable observer (default a new
    :class:`quantcore.MinMaxObserver`) as one batch, by tree reduction.

    Moving-average observers are refused: their statistic depends on the
    order of batches, so it cannot be computed by a reduction.
    """
    _check_array(darr, "quantcore.dask.calibrate")
    obs = MinMaxObserver() if observer is None else observer
    if not isinstance(obs, ObserverBase):
        raise TypeError(f"quantcore.dask.calibrate: observer must be a quantcore observer, got "
                        f"{type(obs).__name__}")
    if not obs.mergeable:
        raise ValueError(f"quantcore.dask.calibrate: {type(obs).__name__} cannot be computed by a "
                         "tree reduction (its statistic depends on the batch order); use a "
                         "MinMaxObserver")
    lo, hi = minmax(darr, obs.axis, split_every=split_every)
    if (np.isnan(lo).any() or np.isnan(hi).any()) and obs.nan_policy != "propagate":
        if obs.nan_policy == "raise":
            raise ValueError("quantcore.dask.calibrate: the array contains NaN")
        obs._note_nonfinite_batch(stacklevel=2)
        return obs
    part = type(obs)(axis=obs.axis, nan_policy=obs.nan_policy)
    part.min_val, part.max_val, part.num_batches = lo.astype(np.float32), hi.astype(np.float32), 1
    return obs.merge(part)


def fake_quant(darr, scale, zero_point, quant_min, quant_max, *, axis=None, **kwargs):
    """``quantcore.fake_quant`` block by block (``map_blocks``); per-channel
    parameters are sliced to each block's channels.  Keywords as
    :func:`quantcore.fake_quant` (except ``out``)."""
    func = "quantcore.dask.fake_quant"
    _check_array(darr, func)
    if "out" in kwargs:
        raise TypeError(f"{func}: out= is not supported (the result is a new dask array)")
    axis = normalize_axis(axis, darr.ndim, func)
    # validate once, on the full parameters
    ops._affine_params(np.zeros((1,) * max(darr.ndim, 1), darr.dtype) if axis is None else
                       np.zeros([darr.shape[axis] if a == axis else 1 for a in range(darr.ndim)],
                                darr.dtype), scale, zero_point, quant_min, quant_max, axis,
                       kwargs.get("zero_point_add", "after_rounding"), "quantcore.dask.fake_quant")
    scale = np.asarray(scale)
    zero_point = np.asarray(zero_point)

    def block_fq(block, block_info=None):
        if axis is None or scale.ndim == 0:
            return ops.fake_quant(block, scale, zero_point, quant_min, quant_max, axis=axis,
                                  **kwargs)
        start, stop = block_info[0]["array-location"][axis]
        z = zero_point if zero_point.ndim == 0 else zero_point[start:stop]
        return ops.fake_quant(block, scale[start:stop], z, quant_min, quant_max, axis=axis,
                              **kwargs)

    # meta: the chunks' own array type (numpy or cupy), without a trial call
    return darr.map_blocks(block_fq, dtype=darr.dtype, meta=darr._meta)
