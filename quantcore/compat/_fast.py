"""What the compat layers' per-call fast paths share.

At 1 Ki elements a call's Python overhead costs more than its kernel, so
the common case (a contiguous float32 / float64 numpy input, per-tensor
parameters) goes straight to the core's fast paths in :mod:`quantcore.ops`
with scalar parameters; everything else takes the general path, which does
every check and raises every documented error.
"""
import numpy as np

from .._cpu import _kernels as K

F32 = np.float32

#: qparams scheme name -> the kernel's scheme id (qc_qparams.h)
_SCHEME_IDS = {name: sid for name, (sid, _) in K.QP_SCHEMES.items()}

#: scheme_scalars' memo: the statistics of a layer rarely change between
#: calls (TF's min / max attributes, an eval-mode cell's range)
_MEMO = {}
_MEMO_SIZE = 1024


def scheme_scalars(name, a, b=None, quant_min=0, quant_max=0, eps=0.0, num_bits=0, flags=0):
    """The outputs of qparams scheme ``name`` (qc_qparams.h) for one tensor
    (float32 statistics ``a`` and ``b``) as a tuple of Python floats.

    The same kernel and numbers as :mod:`quantcore.qparams`' function of
    that scheme for one-element numpy input, without its array conversions
    and back-end dispatch; the caller rounds each value to float32 as that
    function does (an ops fast path does it when given the value).  Results
    for nonzero, non-NaN statistics are memoised (zeros are not: the key
    would not tell -0.0 from +0.0).
    """
    fa, fb = float(a), None if b is None else float(b)
    key = (name, fa, fb, quant_min, quant_max, eps, num_bits, flags)
    out = _MEMO.get(key)
    if out is not None:
        return out
    stats = np.array((a, a if b is None else b), F32)
    out = tuple(K.qparams(_SCHEME_IDS[name], stats[:1], None if b is None else stats[1:],
                          float(quant_min), float(quant_max), float(eps), int(num_bits),
                          int(flags)).reshape(-1).tolist())
    if fa and fa == fa and (fb is None or (fb and fb == fb)):
        if len(_MEMO) >= _MEMO_SIZE:
            _MEMO.clear()
        _MEMO[key] = out
    return out

