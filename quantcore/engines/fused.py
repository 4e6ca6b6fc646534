"""NVFP4's fused sets, each weight read once.

NVFP4 (compressed-tensors' NVFP4A16, ModelOpt's W4A16_NVFP4) needs, before
a weight's codes, the absmax over its fused set (q/k/v, gate/up, experts'
w1/w3: one global scale, :func:`selection.fused_sets`).  A pass over every
weight before writing would read each twice; :class:`FusedSetReader` reads
a set's members together, at the first member's turn, keeps the group
maxima it needs anyway, and holds the other members' stored bits until
their own turn: one read and one maxima pass a weight, at most one fused
set in memory.
"""
import numpy as np

from . import compressed_tensors as CT
from .hf import read_weight
from .selection import fused_sets

F32 = np.float32


class FusedSetReader:
    """The weights ``chosen`` (of an ``hf.HFModel``) for an NVFP4 writer.

    :meth:`read` stands in for ``hf.read_weight`` in
    ``hf.write_quantized_dir``: the first read of a member of a fused set
    reads every member as stored and takes each one's group maxima (max |x|
    over groups of ``group`` along the rows: ``compressed_tensors.
    group_absmax``, NaN / inf refused naming the tensor); the set's absmax is
    the largest of them.  :meth:`take` then gives a weight's (group maxima,
    set absmax), once.
    """

    def __init__(self, chosen, group):
        self.group = group
        self.sets = fused_sets(chosen)
        self.waiting = {}  # {member read with its set: stored bits}
        self.found = {}  # {weight: (group maxima [O, I / group], set absmax)}

    def read(self, model, name, bits):
        """``name``'s stored bits in ``model`` (``hf.read_weight``), its set
        read with it."""
        if name in self.waiting:
            return self.waiting.pop(name)
        members = self.sets.get(name, (name,))
        xs = {m: read_weight(model, m, bits) for m in members}
        maxima = {m: CT.group_absmax(x, self.group, m) for m, x in xs.items()}
        amax = max(F32(g.max(initial=0)) for g in maxima.values())
        self.found.update({m: (g, amax) for m, g in maxima.items()})
        self.waiting.update({m: x for m, x in xs.items() if m != name})
        return xs[name]

    def take(self, name):
        """(group maxima float32 [O, I / group], absmax over the fused set)
        of a weight :meth:`read` has read."""
        return self.found.pop(name)
