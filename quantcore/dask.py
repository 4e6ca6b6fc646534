"""Distributed calibration and fake quantization of chunked ``dask.array``s.

Calibration is a tree reduction of mergeable statistics: every block gives
the raw ``(min, max, flags)`` of its own channels (one pass of the core
kernel; per tensor one value), blocks that hold the same channels are
folded ``split_every`` at a time, the per-channel pieces are joined by
channel offset once at the end, and the NaN / signed-zero rule is applied
there, so the result equals :func:`quantcore.minmax` over the whole array,
bit for bit, whatever the chunking.  What travels between tasks is each
block's own slice of the statistics: a per-channel reduction over B blocks
of c channels each moves about B * c values, never B * C.  Fake
quantization is a ``map_blocks`` with each block's slice of the
per-channel parameters.

Chunks may be numpy or cupy arrays (each block runs on its own back end;
``meta`` is kept); only the per-block statistics leave a device, as small
host (numpy) arrays, and the results of :func:`minmax` are numpy arrays.

``dask`` is an optional dependency (``pip install 'dask[array,distributed]'``).
"""
import numbers

import numpy as np

from . import ops
from ._arrays import FLOAT_DTYPES, normalize_axis, to_host
from .observers import MinMaxObserver, ObserverBase

__all__ = ["minmax", "calibrate", "fake_quant"]

#: block status: statistics usable, a NaN or +-inf inside, no elements
_OK, _NONFINITE, _EMPTY = 0, 1, 2


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


def _block_stats(block, axis):
    """Raw ``(lo, hi, flags)`` of one block's own channels (host arrays, one
    value per tensor) and the block's status (_OK, _NONFINITE, _EMPTY)."""
    n = 1 if axis is None else block.shape[axis]
    if block.size == 0:
        dtype = np.float64 if block.dtype == np.float64 else np.float32
        return (np.full(n, np.inf, dtype), np.full(n, -np.inf, dtype),
                np.zeros(n, np.uint8)), _EMPTY
    lo, hi, flags = (np.array(to_host(v), ndmin=1) for v in
                     ops._minmax_flags(block, axis, "quantcore.dask.minmax"))
    nonfinite = bool((flags & ops.MM_NAN).any() or np.isinf(lo).any() or np.isinf(hi).any())
    return (lo, hi, flags.astype(np.uint8)), (_NONFINITE if nonfinite else _OK)


def _fold(parts, dropped=None):
    """Exact merge of raw statistics of the same channels (NaN-skipping
    min / max, OR of the flags); ``dropped[k]`` leaves part k out."""
    keep = [p for k, p in enumerate(parts) if dropped is None or not dropped[k]]
    if not keep:  # every part dropped: the identities
        lo, hi, fl = parts[0]
        return (np.full_like(lo, np.inf), np.full_like(hi, -np.inf), np.zeros_like(fl))
    lo, hi, fl = (v.copy() for v in keep[0])
    for plo, phi, pfl in keep[1:]:
        np.fmin(lo, plo, out=lo)
        np.fmax(hi, phi, out=hi)
        fl |= pfl
    return lo, hi, fl


def _reduce(dask, parts, split_every, dropped=None):
    """Tree reduction of the delayed ``parts`` (one channel group) with
    ``_fold``; the first level leaves out the parts whose delayed flag in
    ``dropped`` is true."""
    level = []
    for k in range(0, len(parts), split_every):
        drops = None if dropped is None else dropped[k:k + split_every]
        level.append(dask.delayed(_fold)(parts[k:k + split_every], drops))
    while len(level) > 1:
        level = [dask.delayed(_fold)(level[k:k + split_every])
                 for k in range(0, len(level), split_every)]
    return level[0]


def _slab_dropped(statuses, policy):
    """Whether a batch (the blocks of one slab, with these statuses) is left
    out under ``policy``: a non-finite batch under "skip"; and an empty one."""
    if all(s == _EMPTY for s in statuses):
        return True
    return policy == "skip" and any(s == _NONFINITE for s in statuses)


def _slab_status(statuses):
    if all(s == _EMPTY for s in statuses):
        return _EMPTY
    return _NONFINITE if any(s == _NONFINITE for s in statuses) else _OK


def _graph(darr, axis, split_every, policy=None):
    """The delayed reduction: ``(groups, slab_statuses)`` where ``groups``
    holds one delayed ``(lo, hi, flags)`` per channel block (in channel
    order) and ``slab_statuses`` one delayed status per batch.

    A batch is a block per tensor, and per channel a slab: the blocks that
    share their position on every axis but the channel axis (together they
    hold every channel).  With ``policy`` ("skip" / "propagate" / "raise")
    a slab's blocks are left out of the folds where
    :func:`_slab_dropped` says so."""
    dask, _ = _require_dask()
    blocks = darr.to_delayed()
    stats, statuses = {}, {}
    for index in np.ndindex(blocks.shape):
        stats[index], statuses[index] = dask.delayed(_block_stats, nout=2)(blocks[index], axis)
    slabs = {}
    for index in stats:
        key = index if axis is None else index[:axis] + index[axis + 1:]
        slabs.setdefault(key, []).append(index)
    slab_status = {key: dask.delayed(_slab_status)([statuses[i] for i in members])
                   for key, members in slabs.items()}
    dropped_of = None
    if policy is not None:
        dropped = {key: dask.delayed(_slab_dropped)([statuses[i] for i in members], policy)
                   for key, members in slabs.items()}
        dropped_of = {i: dropped[key] for key, members in slabs.items() for i in members}
    groups = {}
    for index in stats:
        groups.setdefault(0 if axis is None else index[axis], []).append(index)
    reduced = []
    for j in sorted(groups):
        members = groups[j]
        drops = None if dropped_of is None else [dropped_of[i] for i in members]
        reduced.append(_reduce(dask, [stats[i] for i in members], split_every, drops))
    return reduced, list(slab_status.values())


def _join(groups):
    """The per-channel-block statistics joined in channel order."""
    return tuple(np.concatenate([g[k] for g in groups]) for k in range(3))


def _finish(groups, per_tensor, dtype, nan_policy):
    lo, hi, fl = _join(groups)
    if nan_policy == "omit":
        fl = fl & np.uint8(~ops.MM_NAN & 0xFF)
    lo, hi = ops._finish_minmax(lo, hi, fl)
    if per_tensor:
        lo, hi = lo.reshape(()), hi.reshape(())
    return lo.astype(dtype), hi.astype(dtype)


def minmax(darr, axis=None, *, nan_policy="propagate", split_every=8, compute=True):
    """Per-tensor or per-channel (min, max) of a dask array, exactly as
    :func:`quantcore.minmax` on the whole array.

    Parameters
    ----------
    darr : dask.array.Array of float16 / float32 / float64 (numpy or cupy chunks)
    axis : int or None
    nan_policy : {"propagate", "omit"}
        As :func:`quantcore.minmax`: a NaN makes its channel's results NaN,
        or NaNs are skipped (an all-NaN channel gives ``(+inf, -inf)``).
    split_every : int
        Fan-in of the tree reduction (>= 2).
    compute : bool
        False returns a ``dask.delayed`` of the result instead.
    """
    dask, _ = _require_dask()
    func = "quantcore.dask.minmax"
    _check_array(darr, func)
    if nan_policy not in ("propagate", "omit"):
        raise ValueError(f"{func}: nan_policy must be 'propagate' or 'omit', got {nan_policy!r}")
    split_every = _check_split_every(split_every, func)
    axis = normalize_axis(axis, darr.ndim, func)
    groups, _ = _graph(darr, axis, split_every)
    result = dask.delayed(_finish)(groups, axis is None, np.dtype(darr.dtype), nan_policy)
    return result.compute() if compute else result


def _finish_calibrate(groups, slab_statuses, policy):
    """(lo, hi, batches used, non-finite batches) of the calibration."""
    lo, hi, fl = _join(groups)
    lo, hi = ops._finish_minmax(lo, hi, fl)
    nonfinite = sum(s == _NONFINITE for s in slab_statuses)
    used = sum(s != _EMPTY for s in slab_statuses) - (nonfinite if policy == "skip" else 0)
    return lo.astype(np.float32), hi.astype(np.float32), used, nonfinite


def calibrate(darr, observer=None, *, split_every=8):
    """Fold a dask array into a mergeable observer (default a new
    :class:`quantcore.MinMaxObserver`) by tree reduction, block by block.

    Every block is one batch (per channel: every slab of blocks that
    together hold all channels -- the blocks at one position along the
    other axes), so the observer ends as it would after ``update``-ing the
    batches one by one in memory, in any order (the running min / max
    merges exactly): ``num_batches`` grows by the number of batches used,
    and the observer's ``nan_policy`` applies per batch -- under "skip" a
    batch holding NaN or +-inf is left out (counted in
    ``nonfinite_batches``, one RuntimeWarning for all of them), so one bad
    value discards only its batch; "propagate" lets it in; "raise" raises
    ValueError.  Empty blocks are no batches.

    Moving-average observers are refused: their statistic depends on the
    order of batches, so it cannot be computed by a reduction.
    """
    dask, _ = _require_dask()
    func = "quantcore.dask.calibrate"
    _check_array(darr, func)
    obs = MinMaxObserver() if observer is None else observer
    if not isinstance(obs, ObserverBase):
        raise TypeError(f"{func}: observer must be a quantcore observer, got "
                        f"{type(obs).__name__}")
    if not obs.mergeable:
        raise ValueError(f"{func}: {type(obs).__name__} cannot be computed by a tree reduction "
                         "(its statistic depends on the batch order); use a MinMaxObserver")
    split_every = _check_split_every(split_every, func)
    axis = normalize_axis(obs.axis, darr.ndim, func)
    if darr.size == 0:
        return obs  # no batch
    groups, slab_statuses = _graph(darr, axis, split_every, obs.nan_policy)
    lo, hi, used, nonfinite = dask.delayed(_finish_calibrate)(
        groups, slab_statuses, obs.nan_policy).compute()
    if nonfinite and obs.nan_policy == "raise":
        raise ValueError(f"{func}: {nonfinite} block(s) contain NaN or inf")
    if nonfinite and obs.nan_policy == "skip":
        obs._note_nonfinite_batch(nonfinite)
    if used:
        part = type(obs)(axis=obs.axis, nan_policy=obs.nan_policy)
        part._store(lo.reshape(()) if axis is None else lo, hi.reshape(()) if axis is None else hi)
        part.num_batches = used
        obs.merge(part)
    return obs


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
