"""Memory-mapped safetensors reading and streaming writing, for the
low-precision dtypes of LLM checkpoints: BF16, F16, F32, F64, F8_E4M3,
F8_E5M2 and the integer types.

No tensor is refused: every tensor of a valid file is readable as its raw
bytes, and the float types above as numpy arrays -- with the ``ml_dtypes``
dtypes (``bfloat16``, ``float8_e4m3fn``, ``float8_e5m2``) when that package
is installed, and always as float32 through :meth:`SafetensorsReader.float32`
(BF16 by a shift of its bits, FP8 by :func:`quantcore.fp8_decode`: exact).
Reading maps the file (``numpy.memmap``, read only): a tensor costs memory
only when converted, one at a time, so converting the largest tensor of a
file bounds the peak, not the file size.  :class:`SafetensorsWriter` writes
a file tensor by tensor (header first, from the declared names, dtypes and
shapes), so a converted checkpoint is never held in memory whole.

File format (safetensors): 8 bytes little-endian header length N, N bytes
of JSON ``{name: {"dtype", "shape", "data_offsets": [begin, end]},
"__metadata__": {str: str}}``, then the data, offsets relative to its start.
A malformed file raises ValueError naming what is wrong.
"""
import json
import math
import os
import struct
from collections.abc import Mapping

import numpy as np

__all__ = ["SafetensorsReader", "SafetensorsWriter", "load_safetensors", "DTYPES",
           "dtype_name"]

#: safetensors dtype -> (item size, numpy dtype name or None for ml_dtypes-only)
DTYPES = {
    "F64": (8, "float64"), "F32": (4, "float32"), "F16": (2, "float16"),
    "BF16": (2, "bfloat16"), "F8_E4M3": (1, "float8_e4m3fn"), "F8_E5M2": (1, "float8_e5m2"),
    "I64": (8, "int64"), "U64": (8, "uint64"), "I32": (4, "int32"), "U32": (4, "uint32"),
    "I16": (2, "int16"), "U16": (2, "uint16"), "I8": (1, "int8"), "U8": (1, "uint8"),
    "BOOL": (1, "bool"),
}
_NAME_TO_ST = {v[1]: k for k, v in DTYPES.items()}
_FP8 = {"F8_E4M3": "e4m3fn", "F8_E5M2": "e5m2"}
#: a header larger than this is not believed (safetensors' own limit is 100 MB)
_MAX_HEADER = 100 * 1024 * 1024


def read_header(path):
    """The header of a safetensors file: (header dict, its ``__metadata__``
    included; offset of the data; data length in bytes).  ValueError naming
    what is wrong when the file is not a well-formed safetensors file."""
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than its 8-byte header)")
        (length,) = struct.unpack("<Q", head)
        if length > min(size - 8, _MAX_HEADER):
            raise ValueError(f"{path}: not a safetensors file (header length {length} does "
                             f"not fit the {size}-byte file)")
        raw = fh.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        why = " ".join(str(exc).split())  # (one line)
        raise ValueError(f"{path}: not a safetensors file (header is not JSON: "
                         f"{why[:80]})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: not a safetensors file (header is not a JSON object)")
    return header, 8 + length, size - 8 - length


def _ml_dtype(name):
    """The numpy dtype of a dtype name, ml_dtypes' when numpy lacks it (None
    when neither has it)."""
    try:
        return np.dtype(name)
    except TypeError:
        try:
            import ml_dtypes
        except ImportError:
            return None
        return np.dtype(getattr(ml_dtypes, name))


def dtype_name(dtype):
    """The safetensors dtype string of a numpy (or ml_dtypes) dtype."""
    name = np.dtype(dtype).name
    if name not in _NAME_TO_ST:
        raise ValueError(f"safetensors has no dtype for {name}")
    return _NAME_TO_ST[name]


class SafetensorsReader(Mapping):
    """A safetensors file, memory-mapped: ``reader[name]`` is a read-only
    array view of the file (raw ``uint8`` bytes for a dtype numpy cannot
    hold without ml_dtypes), ``reader.float32(name)`` a float32 copy,
    ``reader.info(name)`` its (dtype string, shape), ``reader.metadata`` the
    ``__metadata__`` dict.  Use as a context manager or call :meth:`close`.
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        header, self._data_start, data_size = read_header(self.path)
        size = self._data_start + data_size
        self.metadata = dict(header.pop("__metadata__", None) or {})
        self._entries = {}
        for name, e in header.items():
            try:
                dt, shape, (begin, end) = e["dtype"], [int(d) for d in e["shape"]], \
                    e["data_offsets"]
            except (TypeError, KeyError, ValueError):
                raise ValueError(f"{self.path}: tensor {name!r} has a malformed entry") from None
            if not (0 <= begin <= end <= data_size) or any(d < 0 for d in shape):
                raise ValueError(f"{self.path}: tensor {name!r} lies outside the file "
                                 f"(offsets {begin}..{end}, {data_size} data bytes)")
            if dt in DTYPES and DTYPES[dt][0] * math.prod(shape) != end - begin:
                raise ValueError(f"{self.path}: tensor {name!r} ({dt}{shape}) has "
                                 f"{end - begin} bytes")
            self._entries[name] = (dt, tuple(shape), int(begin), int(end))
        self._map = np.memmap(self.path, dtype=np.uint8, mode="r") if size else \
            np.zeros(0, np.uint8)

    # -- Mapping -------------------------------------------------------------
    def __getitem__(self, name):
        dt, shape, begin, end = self._entry(name)
        raw = self._map[self._data_start + begin:self._data_start + end]
        dtype = _ml_dtype(DTYPES[dt][1]) if dt in DTYPES else None
        if dtype is None:  # an unknown dtype, or BF16 / FP8 without ml_dtypes
            return raw
        return raw.view(dtype).reshape(shape)

    def __iter__(self):
        return iter(self._entries)

    def __len__(self):
        return len(self._entries)

    def _entry(self, name):
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor {name!r}") from None

    def info(self, name):
        """(safetensors dtype string, shape) of a tensor."""
        dt, shape, _, _ = self._entry(name)
        return dt, shape

    def nbytes(self, name):
        _, _, begin, end = self._entry(name)
        return end - begin

    def raw(self, name):
        """The tensor's bytes (a read-only uint8 view of the file)."""
        _, _, begin, end = self._entry(name)
        return self._map[self._data_start + begin:self._data_start + end]

    def is_float(self, name):
        return self._entry(name)[0] in ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")

    def float32(self, name, rows=None):
        """The tensor as a new float32 array, exactly (F16 / BF16 / FP8
        values are all float32 values; F64 is rounded to nearest).  With
        ``rows`` (a slice): those rows of the tensor seen as 2-D
        ``[-1, shape[-1]]``, shape ``(rows, shape[-1])``."""
        dt, shape, begin, end = self._entry(name)
        if not self.is_float(name):
            raise ValueError(f"{self.path}: tensor {name!r} is {dt}, not a float tensor")
        raw = self.raw(name)
        item = DTYPES[dt][0]
        if rows is not None:
            k = shape[-1] if shape else 1
            start, stop, _ = rows.indices(math.prod(shape[:-1]) if shape else 1)
            raw = raw[start * k * item:stop * k * item]
            shape = (max(stop - start, 0), k)
        if dt == "BF16":
            out = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif dt in _FP8:
            from .formats import fp8_decode
            out = fp8_decode(np.ascontiguousarray(raw), _FP8[dt])
        else:
            out = raw.view(np.dtype(DTYPES[dt][1])).astype(np.float32)
        return out.reshape(shape)

    def close(self):
        self._map = np.zeros(0, np.uint8)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def load_safetensors(path):
    """A :class:`SafetensorsReader` (a read-only, memory-mapped mapping from
    tensor names to arrays)."""
    return SafetensorsReader(path)


class SafetensorsWriter:
    """Write a safetensors file tensor by tensor.

    ``SafetensorsWriter(path, [(name, dtype, shape), ...], metadata)`` writes
    the header; then ``write(name, array)`` (or ``write_bytes``) for each
    tensor in the declared order; ``close()`` checks that every tensor was
    written.  ``dtype`` is a safetensors string ("BF16", "U8", ...) or a
    numpy dtype.  The file is written to ``path + ".partial"`` and renamed
    on success, so a failed run leaves no truncated file behind.
    """

    def __init__(self, path, entries, metadata=None):
        self.path = os.fspath(path)
        self._order = []
        header = {}
        offset = 0
        for name, dtype, shape in entries:
            st = dtype if isinstance(dtype, str) and dtype in DTYPES else dtype_name(dtype)
            nbytes = DTYPES[st][0] * math.prod(shape)
            header[name] = {"dtype": st, "shape": [int(d) for d in shape],
                            "data_offsets": [offset, offset + nbytes]}
            self._order.append((name, nbytes))
            offset += nbytes
        if metadata:
            header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)  # data aligned to 8 bytes
        self._tmp = self.path + ".partial"
        self._fh = open(self._tmp, "wb")
        self._fh.write(struct.pack("<Q", len(blob)) + blob)
        self._next = 0

    def write(self, name, array):
        """Write the next tensor (C order; its bytes must match the
        declaration)."""
        self.write_bytes(name, np.ascontiguousarray(array).reshape(-1).view(np.uint8))

    def write_bytes(self, name, data):
        if self._next >= len(self._order):
            raise ValueError(f"{self.path}: {name!r} was not declared")
        want, nbytes = self._order[self._next]
        if name != want:
            raise ValueError(f"{self.path}: expected tensor {want!r} next, got {name!r}")
        mv = memoryview(data).cast("B")
        if mv.nbytes != nbytes:
            raise ValueError(f"{self.path}: tensor {name!r} has {mv.nbytes} bytes, declared "
                             f"{nbytes}")
        self._fh.write(mv)
        self._next += 1

    def close(self):
        """Finish the file (rename it into place)."""
        self._fh.close()
        if self._next != len(self._order):
            os.unlink(self._tmp)
            raise ValueError(f"{self.path}: {len(self._order) - self._next} declared tensors "
                             "were not written")
        os.replace(self._tmp, self.path)

    def abort(self):
        """Drop the partial file."""
        self._fh.close()
        if os.path.exists(self._tmp):
            os.unlink(self._tmp)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is None:
            self.close()
        else:
            self.abort()
        return False
