"""llama.cpp's importance-matrix files (``llama-imatrix``'s output), read as
``llama-quantize --imatrix FILE`` reads them: both formats, each entry
normalised to the per-column weights ggml's quantizers take.

The facts followed (llama-cpp-python 0.3.36's llama.cpp):

- ``common/imatrix-loader.cpp`` ``common_imatrix_load``: a GGUF file (the
  current format: for each weight ``W``, tensors ``W.in_sum2`` (the summed
  squared activations, ``n_mat`` rows of ``ne0``) and ``W.counts``
  (``n_mat`` token counts), both F32; keys ``imatrix.datasets``,
  ``imatrix.chunk_count``, ``imatrix.chunk_size``), else the legacy binary
  (int32 entry count; per entry int32 name length, the name, int32
  ``ncall``, int32 value count, that many float32; then optionally int32
  chunk count, int32 length and the dataset's name).  Each count is
  ``lround`` of its float.
- ``tools/quantize/quantize.cpp`` ``load_imatrix``: a GGUF file without all
  three keys is refused; GGUF sums are divided by their matrix's count (a
  count of 0 gives weights 1), legacy sums by ``ncall`` when it is > 0
  (float32 divisions).
- ``src/llama-quant.cpp``: every value must be finite; a weight's entry is
  looked up by its GGUF name and used when it has ``ne[0] * ne[2]`` values
  (one row of weights per expert), else refused (``token_embd``: used
  without); a weight with no entry is quantized without one.  The file is
  recorded in the output's keys ``quantize.imatrix.*``.
"""
import os
import struct

import numpy as np

__all__ = ["Imatrix", "ImatrixError", "read_imatrix"]

F32 = np.float32
#: the GGUF keys a current-format file must have (quantize.cpp load_imatrix)
META_KEYS = ("imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size")


class ImatrixError(ValueError):
    """An importance-matrix file that cannot be used, naming the file and the
    entry or field."""


class Imatrix:
    """The weights of an imatrix file: ``entries`` {weight name: float32
    weights (``n_mat * ne0``, one row per expert)}, ``datasets``,
    ``chunk_count``, ``legacy`` (the binary format), ``path``."""

    def __init__(self, path, entries, datasets, chunk_count, legacy):
        self.path, self.entries, self.datasets = path, entries, datasets
        self.chunk_count, self.legacy = chunk_count, legacy

    def for_tensor(self, name, row, n_expert=1):
        """The weights of GGUF weight ``name`` (rows of ``row`` values,
        ``n_expert`` experts), or None when the file has no entry (and for
        ``token_embd`` with an entry of another size, as llama-quantize).
        An entry of another size is refused."""
        w = self.entries.get(name)
        if w is None:
            return None
        if w.size != row * n_expert:
            if name.startswith("token_embd"):
                return None
            raise ImatrixError(f"{self.path}: imatrix entry {name!r} has {w.size} values, the "
                               f"tensor needs {row * n_expert} (its row length {row} x "
                               f"{n_expert} expert(s))")
        return w

    def keys(self):
        """[(key, value, kind)] llama-quantize adds to the output file, in its
        order (quantize.cpp's kv overrides: strings cut to 127 bytes; ints
        as uint32)."""
        out = [("quantize.imatrix.file", _cut(os.fspath(self.path)), "str")]
        if self.datasets:
            out.append(("quantize.imatrix.dataset", _cut(self.datasets[0]), "str"))
        out.append(("quantize.imatrix.entries_count", len(self.entries), "u32"))
        if self.chunk_count > 0:
            out.append(("quantize.imatrix.chunks_count", self.chunk_count, "u32"))
        return out


def _cut(s):
    """strncpy into llama_model_kv_override's 128-byte val_str: 127 bytes."""
    b = s.encode("utf-8")[:127]
    return b.decode("utf-8", errors="ignore")


def _lround(v):
    """C's lround (half away from zero) of float32 values, as int64."""
    v = np.asarray(v, np.float64)
    return (np.sign(v) * np.floor(np.abs(v) + 0.5)).astype(np.int64)


def read_imatrix(path):
    """An imatrix file (GGUF or legacy), normalised as llama-quantize does.

    Parameters
    ----------
    path : str
        The file ``llama-imatrix`` wrote.

    Returns
    -------
    Imatrix
        Per weight: GGUF format, ``in_sum2[j, i] / float32(lround(counts[j]))``
        (1 where the count is 0); legacy, ``sums[i] / float32(ncall)`` (the
        sums where ncall <= 0).

    Raises
    ------
    ImatrixError
        An unreadable file, a missing or malformed field, a name with only
        sums or only counts, a non-F32 tensor, a non-finite weight.
    """
    path = os.fspath(path)
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError as exc:
        raise ImatrixError(f"{path}: cannot read the imatrix file: "
                           f"{exc.strerror or exc}") from None
    im = _read_gguf(path) if head == b"GGUF" else _read_legacy(path)
    for name, w in im.entries.items():
        if not np.isfinite(w).all():
            raise ImatrixError(f"{path}: imatrix entry {name!r} holds a non-finite value "
                               "(llama-quantize refuses it)")
    return im


def _read_legacy(path):
    with open(path, "rb") as fh:
        data = fh.read()
    pos = 0

    def take(n, what):
        nonlocal pos
        if pos + n > len(data):
            raise ImatrixError(f"{path}: legacy imatrix file ends inside {what} "
                               f"(byte {pos} of {len(data)})")
        pos += n
        return data[pos - n:pos]

    (n_entries,) = struct.unpack("<i", take(4, "the entry count"))
    if n_entries < 1:
        raise ImatrixError(f"{path}: no data in the imatrix file (entry count {n_entries}; "
                           "neither a GGUF nor a legacy imatrix file)")
    entries = {}
    for i in range(n_entries):
        (length,) = struct.unpack("<i", take(4, f"the name length of entry {i + 1}"))
        if length < 0:
            raise ImatrixError(f"{path}: entry {i + 1}: name length {length}")
        name = take(length, f"the name of entry {i + 1}").split(b"\0", 1)[0].decode("utf-8",
                                                                            "replace")
        ncall, nval = struct.unpack("<ii", take(8, f"the ncall / value count of entry {name!r}"))
        if nval < 1:
            raise ImatrixError(f"{path}: entry {name!r}: value count {nval}")
        sums = np.frombuffer(take(4 * nval, f"the {nval} values of entry {name!r}"), "<f4")
        entries[name] = (sums / F32(ncall)).astype(F32) if ncall > 0 else sums.astype(F32)
    chunk_count, datasets = 0, []
    if pos < len(data):  # the optional trailer: chunk count, dataset name
        if pos + 4 <= len(data):
            (chunk_count,) = struct.unpack("<i", data[pos:pos + 4])
            pos += 4
            if pos + 4 <= len(data):
                (length,) = struct.unpack("<i", data[pos:pos + 4])
                pos += 4
                if 0 < length <= len(data) - pos:
                    datasets.append(data[pos:pos + length].split(b"\0", 1)[0]
                                    .decode("utf-8", "replace"))
    return Imatrix(path, entries, datasets, chunk_count, legacy=True)


def _read_gguf(path):
    try:
        import gguf
    except ImportError:
        raise ImatrixError(f"{path}: a GGUF imatrix file needs the gguf package "
                           "(pip install quantcore[gguf])") from None
    try:
        r = gguf.GGUFReader(path)
    except Exception as exc:  # (gguf-py raises ValueError / struct.error / ...)
        raise ImatrixError(f"{path}: not a readable GGUF imatrix file: {exc}") from None
    if not r.tensors:
        raise ImatrixError(f"{path}: no data in the imatrix file (no tensors)")
    missing = [k for k in META_KEYS if k not in r.fields]
    if missing:
        raise ImatrixError(f"{path}: missing imatrix metadata {', '.join(missing)} "
                           "(llama-quantize refuses the file)")
    names = r.fields["imatrix.datasets"].contents()
    datasets = [str(v) for v in names] if isinstance(names, list) else []
    chunk_count = int(r.fields["imatrix.chunk_count"].contents())
    pairs = {}
    for t in r.tensors:
        for suffix, slot in ((".in_sum2", 0), (".counts", 1)):
            if t.name.endswith(suffix) and len(t.name) > len(suffix):
                if t.tensor_type != gguf.GGMLQuantizationType.F32:
                    raise ImatrixError(f"{path}: tensor {t.name!r} is "
                                       f"{t.tensor_type.name}, sums and counts must be F32")
                pairs.setdefault(t.name[:-len(suffix)], [None, None])[slot] = \
                    np.asarray(t.data, F32).reshape(-1)
    entries = {}
    for name, (sums, counts) in sorted(pairs.items()):
        if sums is None or counts is None:
            raise ImatrixError(f"{path}: imatrix entry {name!r} has "
                               f"{'counts' if sums is None else 'sums'} only (mismatched "
                               "sums and counts)")
        if counts.size == 0 or sums.size % counts.size:
            raise ImatrixError(f"{path}: imatrix entry {name!r}: {sums.size} sums for "
                               f"{counts.size} counts")
        c = _lround(counts).astype(F32)[:, None]
        s = sums.reshape(counts.size, -1)
        with np.errstate(divide="ignore", invalid="ignore"):
            entries[name] = np.where(c > 0, s / np.where(c > 0, c, F32(1)), F32(1)) \
                .astype(F32).reshape(-1)
    return Imatrix(path, entries, datasets, chunk_count, legacy=False)
