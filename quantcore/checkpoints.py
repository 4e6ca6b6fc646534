"""Memory-mapped safetensors reading and streaming writing, for the
low-precision dtypes of LLM checkpoints: BF16, F16, F32, F64, F8_E4M3,
F8_E5M2 and the integer types.

Every tensor of a valid file is readable as its raw bytes, and the float
types above as numpy arrays -- with the ``ml_dtypes`` dtypes (``bfloat16``,
``float8_e4m3fn``, ``float8_e5m2``, ...) when that package is installed, and
always as float32 through :meth:`SafetensorsReader.float32` (BF16 by a shift
of its bits, FP8 by :func:`quantcore.fp8_decode`: exact).  Reading maps the
file (``numpy.memmap``, read only): a tensor costs memory only when
converted, one at a time, so converting the largest tensor of a file bounds
the peak, not the file size.  :class:`SafetensorsWriter` writes a file
tensor by tensor (header first, from the declared names, dtypes and
shapes), so a converted checkpoint is never held in memory whole.

File format (safetensors): 8 bytes little-endian header length N, N bytes
of JSON ``{name: {"dtype", "shape", "data_offsets": [begin, end]},
"__metadata__": {str: str}}``, then the data, offsets relative to its start.
Both the reader and the writer apply the format's own validation (that of
the reference ``safetensors`` package) and a little more; a file or a
declaration that breaks a rule raises ValueError naming the tensor and the
field:

- the header length is at most 100,000,000 bytes and within the file; the
  header is UTF-8 text holding one JSON object (no NaN / Infinity, nested
  at most 3 levels, no key twice in one object);
- each tensor entry holds exactly ``dtype`` (one of the format's dtype
  names, :data:`DTYPES` and the sub-byte ``F4`` / ``F6_*``), ``shape`` (a
  list of integers >= 0; ``true`` is not an integer) and ``data_offsets``
  (two integers);
- sorted by offset, the tensors are contiguous from 0 and end exactly at the
  end of the file, and each spans ``prod(shape) * bits / 8`` bytes (a whole
  number of bytes); ``prod(shape) * itemsize`` fits a numpy array;
- ``__metadata__`` (optional, may be null) maps strings to strings.

Stricter than the reference package: a key given twice (the reference
keeps the last), an unknown field in a tensor entry (the reference ignores
it), and a shape numpy cannot hold are refused.
"""
import json
import math
import operator
import os
import re
import struct
from collections.abc import Mapping

import numpy as np

from ._files import AtomicFile, copy_range, pread_into

__all__ = ["SafetensorsReader", "SafetensorsWriter", "load_safetensors", "DTYPES",
           "dtype_name", "read_header"]

#: safetensors dtype -> (item size, numpy dtype name: ml_dtypes' for the
#: formats numpy lacks)
DTYPES = {
    "F64": (8, "float64"), "F32": (4, "float32"), "F16": (2, "float16"),
    "BF16": (2, "bfloat16"), "F8_E4M3": (1, "float8_e4m3fn"), "F8_E5M2": (1, "float8_e5m2"),
    "F8_E8M0": (1, "float8_e8m0fnu"), "F8_E4M3FNUZ": (1, "float8_e4m3fnuz"),
    "F8_E5M2FNUZ": (1, "float8_e5m2fnuz"), "C64": (8, "complex64"),
    "I64": (8, "int64"), "U64": (8, "uint64"), "I32": (4, "int32"), "U32": (4, "uint32"),
    "I16": (2, "int16"), "U16": (2, "uint16"), "I8": (1, "int8"), "U8": (1, "uint8"),
    "BOOL": (1, "bool"),
}
#: the sub-byte dtypes: bits per value (read as raw bytes only)
SUBBYTE = {"F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}
_NAME_TO_ST = {v[1]: k for k, v in DTYPES.items()}
_FLOAT32_READ = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")
_FP8 = {"F8_E4M3": "e4m3fn", "F8_E5M2": "e5m2"}
#: a header larger than this is not believed (the reference's own limit)
_MAX_HEADER = 100_000_000
#: a header nests no deeper than {name: {"shape": [...]}}
_MAX_DEPTH = 3
_ENTRY_FIELDS = ("dtype", "shape", "data_offsets")
#: float32() reads a tensor's bytes this many at a time (F32: all at once)
_READ_BYTES = 1 << 24
#: the writer asks the kernel to start writing its file every this many
#: bytes (``AtomicFile.start_writeback``): the disk works while the next
#: tensors are computed, and the fsync at the end waits for the last piece
_WRITEBACK_BYTES = 1 << 23
_INTP_MAX = 2 ** 63 - 1
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)


def _bits(dt):
    return SUBBYTE[dt] if dt in SUBBYTE else 8 * DTYPES[dt][0]


def _index(v):
    """``v`` as a Python int when it is an integer (never a bool), else None."""
    if isinstance(v, (bool, np.bool_)):
        return None
    try:
        return operator.index(v)
    except TypeError:
        return None


def _check_text(what, s):
    """A name or metadata string: text that UTF-8 can encode (no lone
    surrogates from ``\\ud800`` escapes)."""
    if not isinstance(s, str):
        raise ValueError(f"{what} must be a string, got {type(s).__name__}")
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{what} {s[:40]!r} is not valid Unicode (a lone surrogate)") from None


def check_shape(where, shape, dt):
    """A shape as a tuple of ints >= 0 whose array numpy can hold
    (ValueError naming ``where``)."""
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
        raise ValueError(f"{where}: shape must be a list of integers, got {shape!r:.60}")
    dims = []
    for d in shape:
        i = _index(d)
        if i is None:
            raise ValueError(f"{where}: shape {list(shape)!r:.80} holds {d!r:.40}, not an "
                             "integer")
        if i < 0:
            raise ValueError(f"{where}: shape {list(shape)!r:.80} has a negative dimension")
        dims.append(i)
    nonzero = math.prod(d for d in dims if d) * max(1, DTYPES[dt][0] if dt in DTYPES else 1)
    if len(dims) > 64 or nonzero > _INTP_MAX:
        raise ValueError(f"{where}: shape {dims!r:.80} is too large for an array "
                         f"({len(dims)} dimensions; at most 64 and 2**63 - 1 bytes)")
    return tuple(dims)


def _tensor_bytes(where, dt, shape):
    bits = math.prod(shape) * _bits(dt)
    if bits % 8:
        raise ValueError(f"{where}: {dt}{list(shape)} is {bits} bits, not a whole number of "
                         "bytes")
    return bits // 8


def _unique_object(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"key {key[:60]!r} appears twice in one object")
        seen[key] = value
    return seen


def _refuse_constant(name):
    raise ValueError(f"{name} is not JSON")


def _depth(raw):
    """How deeply the JSON text nests (strings skipped)."""
    a = np.frombuffer(_JSON_STRING.sub(b'""', raw), np.uint8)
    step = np.isin(a, (0x7B, 0x5B)).astype(np.int64) - np.isin(a, (0x7D, 0x5D))
    return int(np.cumsum(step).max(initial=0))


def read_header(path):
    """The validated header of a safetensors file.

    Returns
    -------
    entries : dict
        ``{name: (dtype string, shape tuple, begin, end)}`` in file order;
        ``begin`` / ``end`` relative to the data section.
    metadata : dict
        ``__metadata__`` ({} when absent).
    data_start, data_size : int
        Offset of the data section in the file and its length in bytes.

    Raises
    ------
    ValueError
        Naming the tensor and the field, for any rule of the module
        docstring that the file breaks.
    IsADirectoryError, FileNotFoundError, PermissionError
        As ``open`` would.
    """
    if os.path.isdir(path):
        raise IsADirectoryError(21, "is a directory, expected a safetensors file", path)
    if os.path.exists(path) and not os.path.isfile(path):  # a FIFO would block open()
        raise ValueError(f"{path}: not a regular file (a device, FIFO or socket)")
    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than its 8-byte header)")
        (length,) = struct.unpack("<Q", head)
        if length > min(size - 8, _MAX_HEADER):
            raise ValueError(f"{path}: not a safetensors file (header length {length} does "
                             f"not fit the {size}-byte file, or exceeds {_MAX_HEADER})")
        raw = fh.read(length)

    def bad(why):
        return ValueError(f"{path}: not a safetensors file ({why})")
    depth = _depth(raw)
    if depth > _MAX_DEPTH:
        raise bad(f"header nests {depth} levels deep, at most {_MAX_DEPTH}")
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_object,
                            parse_constant=_refuse_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        why = " ".join(str(exc).split())  # (one line)
        raise bad(f"header is not JSON: {why[:80]}") from None
    if not isinstance(header, dict):
        raise bad("header is not a JSON object")
    metadata = header.pop("__metadata__", None)
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise bad(f"__metadata__ must map strings to strings, got {type(metadata).__name__}")
    for key, value in metadata.items():
        _check_text(f"{path}: __metadata__ key", key)
        _check_text(f"{path}: __metadata__[{key[:40]!r}]", value)
    data_size = size - 8 - length
    entries = {}
    for name, e in header.items():
        _check_text(f"{path}: tensor name", name)
        where = f"{path}: tensor {name[:80]!r}"
        if not isinstance(e, dict):
            raise ValueError(f"{where}: entry must be an object, got {type(e).__name__}")
        if set(e) != set(_ENTRY_FIELDS):
            missing = sorted(set(_ENTRY_FIELDS) - set(e))
            extra = sorted(set(e) - set(_ENTRY_FIELDS))
            raise ValueError(f"{where}: entry must hold exactly {list(_ENTRY_FIELDS)}"
                             + (f"; missing {missing}" if missing else "")
                             + (f"; unknown {[k[:40] for k in extra]}" if extra else ""))
        dt = e["dtype"]
        if not isinstance(dt, str) or (dt not in DTYPES and dt not in SUBBYTE):
            raise ValueError(f"{where}: dtype {dt!r:.60} is not a safetensors dtype "
                             f"({', '.join(list(DTYPES) + list(SUBBYTE))})")
        shape = check_shape(f"{where}", e["shape"], dt)
        offsets = e["data_offsets"]
        if not isinstance(offsets, list) or len(offsets) != 2 or \
                any(_index(o) is None or o < 0 for o in offsets):
            raise ValueError(f"{where}: data_offsets must be two integers >= 0, got "
                             f"{offsets!r:.80}")
        begin, end = offsets
        if end < begin:
            raise ValueError(f"{where}: data_offsets [{begin}, {end}] end before they begin")
        nbytes = _tensor_bytes(where, dt, shape)
        if end - begin != nbytes:
            raise ValueError(f"{where}: data_offsets [{begin}, {end}] span {end - begin} "
                             f"bytes, {dt}{list(shape)} takes {nbytes}")
        entries[name] = (dt, shape, begin, end)
    pos = 0
    for name, (_, _, begin, end) in sorted(entries.items(), key=lambda kv: kv[1][2:]):
        if begin != pos:
            what = "overlaps the tensor before it" if begin < pos else \
                f"leaves bytes {pos}..{begin} unused"
            raise ValueError(f"{path}: tensor {name[:80]!r}: data_offsets [{begin}, {end}] "
                             f"{what} (the tensors must tile the data section from 0)")
        if end > data_size:
            raise ValueError(f"{path}: tensor {name[:80]!r} lies outside the file: data_offsets "
                             f"[{begin}, {end}] end beyond its {data_size} data bytes")
        pos = end
    if pos != data_size:
        raise ValueError(f"{path}: not a safetensors file (the tensors cover {pos} bytes, "
                         f"the data section holds {data_size})")
    return entries, metadata, 8 + length, data_size


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


def _float32_of(dt, raw):
    """float32 values of the C-contiguous little-endian bytes ``raw`` of
    safetensors dtype ``dt`` (F16 / BF16 / FP8 exactly; F64 rounded to
    nearest, beyond float32: +-inf)."""
    if dt == "BF16":  # the upper half of a float32, in place (no temporary)
        out = np.empty(raw.size // 2, np.uint32)
        out[...] = raw.view(np.uint16)
        out <<= 16
        return out.view(np.float32)
    if dt in _FP8:
        from .formats import fp8_decode
        return fp8_decode(raw, _FP8[dt])
    with np.errstate(over="ignore"):
        return raw.view(np.dtype(DTYPES[dt][1])).astype(np.float32)


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
        self._entries, self.metadata, self._data_start, data_size = read_header(self.path)
        self._size = self._data_start + data_size
        self._file = open(self.path, "rb", buffering=0)
        self._fd = self._file.fileno()
        self._check()
        self._map = np.memmap(self._file, dtype=np.uint8, mode="r") if self._size else \
            np.zeros(0, np.uint8)

    def _check(self, name=None):
        """ValueError when the file no longer has the size its header gives
        (truncated or rewritten since it was opened): reading a mapped page
        past its end would kill the process with SIGBUS."""
        if self._file is None:
            raise ValueError(f"{self.path}: the reader is closed")
        size = os.fstat(self._fd).st_size
        if size != self._size:
            what = f" (reading tensor {name!r})" if name is not None else ""
            raise ValueError(f"{self.path}: the file changed while it was read{what}: it has "
                             f"{size} bytes, its header describes {self._size}; was it "
                             "overwritten or truncated?")

    # -- Mapping -------------------------------------------------------------
    def __getitem__(self, name):
        dt, shape, begin, end = self._entry(name)
        self._check(name)
        raw = self._map[self._data_start + begin:self._data_start + end]
        dtype = _ml_dtype(DTYPES[dt][1]) if dt in DTYPES else None
        if dtype is None:  # a sub-byte dtype, or BF16 / FP8 without ml_dtypes
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
        """The tensor's bytes (a read-only uint8 view of the file: the
        file's size is checked now, not when the view is read later)."""
        _, _, begin, end = self._entry(name)
        self._check(name)
        return self._map[self._data_start + begin:self._data_start + end]

    def read_bytes(self, name, start=0, stop=None):
        """Bytes ``start:stop`` of a tensor as a new uint8 array, read with
        ``os.preadv`` (no memory map: a file truncated meanwhile gives
        OSError, never SIGBUS)."""
        _, _, begin, end = self._entry(name)
        start, stop, _ = slice(start, stop).indices(end - begin)
        out = np.empty(max(stop - start, 0), np.uint8)
        self._pread(name, out, begin + start)
        return out

    def copy_to(self, name, fd):
        """Append the tensor's bytes to the file open for writing at ``fd``,
        at its position, a piece of ``_READ_BYTES`` at a time
        (``_files.copy_range``: in the kernel where the system can), the
        file's size checked before each piece: a file truncated meanwhile
        gives ValueError or OSError naming the tensor, never SIGBUS."""
        _, _, begin, end = self._entry(name)
        for start in range(begin, end, _READ_BYTES):
            self._check(name)
            copy_range(self._fd, fd, self._data_start + start, min(_READ_BYTES, end - start),
                       f"{self.path}: tensor {name!r} (the file was truncated?)")

    def _pread(self, name, view, offset):
        """Fill ``view`` from data-section ``offset`` (the size checked first)."""
        self._check(name)
        pread_into(self._fd, view, self._data_start + offset,
                   f"{self.path}: tensor {name!r} (the file was truncated?)")

    def is_float(self, name):
        """Whether :meth:`float32` reads the tensor (F64, F32, F16, BF16,
        F8_E4M3, F8_E5M2)."""
        return self._entry(name)[0] in _FLOAT32_READ

    def float32(self, name, rows=None, cols=None, *, width=None):
        """The tensor as a new float32 array, exactly (F16 / BF16 / FP8
        values are all float32 values; F64 is rounded to nearest).  With
        ``rows`` / ``cols`` (slices, any step, as numpy slices): that block
        of the tensor seen as 2-D ``[-1, width]`` (``width`` dividing its
        size; default ``shape[-1]``), shape ``(rows, cols)`` (a long row is
        read a piece at a time)."""
        dt, shape, begin, end = self._entry(name)
        if not self.is_float(name):
            raise ValueError(f"{self.path}: tensor {name!r} is {dt}, not a float tensor read "
                             f"as float32 ({', '.join(_FLOAT32_READ)})")
        item = DTYPES[dt][0]
        ranges, shape_out = [(begin, end - begin)], shape
        if rows is not None or cols is not None:
            for what, s in (("rows", rows), ("cols", cols)):
                if s is not None and not isinstance(s, slice):
                    raise TypeError(f"{what} must be a slice, got {type(s).__name__}")
            if width is None:
                nrows, k = (math.prod(shape[:-1]), shape[-1]) if shape else (1, 1)
            else:
                n, k = math.prod(shape), width
                if type(k) is not int or k < 1 or n % k:
                    raise ValueError(f"{self.path}: width {k!r} does not divide the {n} values "
                                     f"of tensor {name!r}")
                nrows = n // k
            r = range(nrows)[slice(None) if rows is None else rows]
            c = range(k)[slice(None) if cols is None else cols]
            shape_out = (len(r), len(c))
            if (r.step == 1 or len(r) < 2) and (c.step == 1 or len(c) < 2):
                # a block of whole rows is one range of the file, else one per row
                ranges = [(begin + r.start * k * item, len(r) * k * item)] if len(c) == k \
                    else [(begin + (i * k + c.start) * item, len(c) * item) for i in r]
                ranges = [(o, n) for o, n in ranges if n]
            else:   # any other step: the mapped bytes (the file's size checked first)
                table = self.raw(name).reshape(nrows, k, item)
                table = table[slice(None) if rows is None else rows]
                table = table if cols is None else table[:, cols]
                return _float32_of(dt, np.ascontiguousarray(table).reshape(-1)).reshape(
                    shape_out)
        return self._float32_ranges(name, dt, ranges, shape_out)

    def _float32_ranges(self, name, dt, ranges, shape):
        """float32 of the tensor bytes ``ranges`` [(offset, nbytes)], read
        with pread a bounded piece at a time (F32 straight into the result)."""
        item = DTYPES[dt][0]
        out = np.empty(math.prod(shape), np.float32)
        at = 0
        for offset, nbytes in ranges:
            if dt == "F32":
                self._pread(name, out[at:at + nbytes // 4], offset)
                at += nbytes // 4
                continue
            for lo in range(0, nbytes, _READ_BYTES // item * item):
                piece = np.empty(min(_READ_BYTES // item * item, nbytes - lo), np.uint8)
                self._pread(name, piece, offset + lo)
                out[at:at + piece.size // item] = _float32_of(dt, piece)
                at += piece.size // item
        return out.reshape(shape)

    def close(self):
        self._map = np.zeros(0, np.uint8)
        if self._file is not None:
            self._file.close()
            self._file = None

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
    numpy dtype; ``shape`` integers >= 0; ``metadata`` maps strings to
    strings (numbers are written as their ``str``).  A declaration the
    reader would refuse (a name twice, a negative or non-integer dimension,
    a sub-byte tensor of a fractional byte count, a header over the
    format's limit) raises ValueError naming the tensor.  The file is
    written through :class:`quantcore._files.AtomicFile` (a temporary beside
    ``path``, with no name at all on Linux, fsync-ed and renamed by
    ``close``), so a failed or killed run leaves neither a truncated file
    nor a temporary, and any previous file at ``path`` intact.
    """

    def __init__(self, path, entries, metadata=None):
        self.path = os.fspath(path)
        if os.path.isdir(self.path):
            raise IsADirectoryError(21, "is a directory, expected a safetensors file path",
                                    self.path)
        self._order = []
        header = {}
        offset = 0
        for name, dtype, shape in entries:
            _check_text(f"{self.path}: tensor name", name)
            where = f"{self.path}: tensor {name[:80]!r}"
            if name in header or name == "__metadata__":
                raise ValueError(f"{where}: declared twice (or named __metadata__)")
            st = dtype if isinstance(dtype, str) and (dtype in DTYPES or dtype in SUBBYTE) \
                else dtype_name(dtype)
            shape = check_shape(where, shape, st)
            nbytes = _tensor_bytes(where, st, shape)
            header[name] = {"dtype": st, "shape": list(shape),
                            "data_offsets": [offset, offset + nbytes]}
            self._order.append((name, nbytes))
            offset += nbytes
        if metadata:
            if not isinstance(metadata, Mapping):
                raise TypeError(f"metadata must map strings to strings, got "
                                f"{type(metadata).__name__}")
            meta = {}
            for key, value in metadata.items():  # numbers are written as their str()
                key, value = (str(v) if isinstance(v, (int, float, np.number)) else v
                              for v in (key, value))
                _check_text(f"{self.path}: metadata key", key)
                _check_text(f"{self.path}: metadata[{key[:40]!r}]", value)
                meta[key] = value
            header["__metadata__"] = meta
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)  # data aligned to 8 bytes
        if len(blob) > _MAX_HEADER:
            raise ValueError(f"{self.path}: the header would be {len(blob)} bytes, more than "
                             f"the format's {_MAX_HEADER}")
        self._out = AtomicFile(self.path)
        self._fh = self._out.file
        try:
            self._fh.write(struct.pack("<Q", len(blob)) + blob)
        except BaseException:
            self._out.discard()
            raise
        self._next = 0
        self._unsynced = 0  # bytes written since the last start_writeback

    def _wrote(self, nbytes):
        """Count ``nbytes`` written; start the kernel's writeback every
        ``_WRITEBACK_BYTES``."""
        self._unsynced += nbytes
        if self._unsynced >= _WRITEBACK_BYTES:
            self._out.start_writeback()
            self._unsynced = 0

    def write(self, name, array):
        """Write the next tensor (C order, little-endian whatever the byte
        order of ``array``; its bytes must match the declaration)."""
        arr = np.asarray(array)
        if arr.dtype.kind == "O":
            raise TypeError(f"{self.path}: tensor {name!r} holds Python objects")
        if arr.dtype.byteorder != "|" and arr.dtype.newbyteorder("<") != arr.dtype:
            arr = arr.astype(arr.dtype.newbyteorder("<"))  # big-endian: the values, swapped
        self.write_bytes(name, np.ascontiguousarray(arr).reshape(-1).view(np.uint8))

    def _expect(self, name):
        """The declared byte count of ``name``, the next tensor to write."""
        if self._next >= len(self._order):
            raise ValueError(f"{self.path}: {name!r} was not declared")
        want, nbytes = self._order[self._next]
        if name != want:
            raise ValueError(f"{self.path}: expected tensor {want!r} next, got {name!r}")
        return nbytes

    def write_bytes(self, name, data):
        nbytes = self._expect(name)
        mv = memoryview(data).cast("B")
        if mv.nbytes != nbytes:
            raise ValueError(f"{self.path}: tensor {name!r} has {mv.nbytes} bytes, declared "
                             f"{nbytes}")
        self._fh.write(mv)
        self._next += 1
        self._wrote(nbytes)

    def copy_from(self, reader, name, source=None):
        """Write tensor ``name`` as the bytes of ``reader``'s tensor
        ``source`` (default ``name``), copied file to file in the kernel a
        bounded piece at a time (:meth:`SafetensorsReader.copy_to`): no
        memory map, so an input truncated during the copy is an error naming
        it, never SIGBUS, and no buffer whatever the tensor's size."""
        source = name if source is None else source
        nbytes = self._expect(name)
        size = reader.nbytes(source)
        if size != nbytes:
            raise ValueError(f"{self.path}: tensor {name!r} is declared {nbytes} bytes, "
                             f"{reader.path}: tensor {source!r} has {size}")
        self._fh.flush()
        reader.copy_to(source, self._fh.fileno())
        self._fh.seek(0, os.SEEK_END)  # (the buffered writer's position: the file's end)
        self._next += 1
        self._wrote(nbytes)

    def close(self):
        """Finish the file (fsync it and rename it into place)."""
        if self._next != len(self._order):
            self._out.discard()
            raise ValueError(f"{self.path}: {len(self._order) - self._next} declared tensors "
                             "were not written")
        self._out.commit()

    def abort(self):
        """Drop the partial file (the previous file at ``path``, if any, is
        left as it was)."""
        self._out.discard()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is None:
            self.close()
        else:
            self.abort()
        return False
