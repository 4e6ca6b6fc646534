"""Tensor files for the command line: ``.npy``, ``.npz`` and ``.safetensors``.

Each file is listed first (names, shapes, dtypes from the headers) and each
tensor read only when it is used, so a large checkpoint is never held in
memory at once.  Problems of the whole file (missing, not the format its
name says, a corrupt header) raise :class:`CliError`; a tensor that cannot
be read as numbers (Python objects, an unknown dtype, bytes missing) is
listed with a ``problem`` and left out by the caller, with a note.

Nothing is ever unpickled.  safetensors files are read and written through
:mod:`quantcore.checkpoints` (which validates a header as the format's
reference does), so neither needs the safetensors package; bfloat16 is
widened to float32 exactly, float8 (E4M3, E5M2) too when ``ml_dtypes`` is
installed.
"""
import math
import os
import zipfile

import numpy as np

from ._files import atomic_write, refuse_same_file

__all__ = ["CliError", "TensorEntry", "list_tensors", "save_tensors", "check_writable",
           "write_or_fail", "write_path_or_fail", "one_line"]

#: safetensors dtype names numpy reads directly
_SAFETENSORS_DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2",
    "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
    "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?",
}
#: and the float formats numpy lacks: (bytes per value, ml_dtypes name)
_WIDENED = {"BF16": (2, None), "F8_E4M3": (1, "float8_e4m3fn"), "F8_E5M2": (1, "float8_e5m2")}
_SAFETENSORS_CODES = {np.dtype(v): k for k, v in _SAFETENSORS_DTYPES.items()}


class CliError(Exception):
    """A user error: reported as one line, exit status 2."""


def one_line(text):
    return " ".join(str(text).split())


class TensorEntry:
    """One tensor of a file, read on demand.

    Attributes
    ----------
    name : str
    shape : tuple of int
    dtype : str
        The file's dtype name (numpy's, or safetensors' for the formats
        numpy lacks, e.g. ``"BF16"``).
    is_float : bool
        Floating point (what ``calibrate`` quantizes), readable or not.
    problem : str or None
        Why the values cannot be read; ``load`` raises CliError with it.
    widened : bool
        ``load`` returns float32 for a narrower float format (exact).
    """

    def __init__(self, name, shape, dtype, is_float, reader, problem=None, widened=False):
        self.name, self.shape, self.dtype = name, tuple(int(d) for d in shape), str(dtype)
        self.is_float, self.problem, self.widened = bool(is_float), problem, widened
        self._reader = reader

    @property
    def size(self):
        return math.prod(self.shape)

    @property
    def ndim(self):
        return len(self.shape)

    def load(self):
        """The values as a numpy array (float formats numpy lacks: float32)."""
        if self.problem:
            raise CliError(self.problem)
        try:
            return self._reader()
        except CliError:
            raise
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
            raise CliError(f"cannot read: {one_line(exc)}") from None


def _dtype_problem(dtype):
    """Why a numpy dtype is not read (None: it is)."""
    if dtype.hasobject:
        return f"holds Python objects (dtype {dtype}), which are never unpickled"
    if dtype.kind not in "fiub":
        return f"dtype {dtype} is not a real number type"
    return None


# ------------------------------------------------------------------- .npy
def _npy_header(fh, where):
    """(shape, fortran_order, dtype) of the .npy stream at its start."""
    from .state import npy_header
    try:
        return npy_header(fh)
    except ValueError as exc:
        raise CliError(f"{where}: {one_line(exc)}") from None


def _list_npy(path, base):
    with open(path, "rb") as fh:
        if fh.read(6) != b"\x93NUMPY":
            raise CliError(f"{path}: not a .npy file (no NumPy header)")
        fh.seek(0)
        shape, _, dtype = _npy_header(fh, path)
        start, end = fh.tell(), os.fstat(fh.fileno()).st_size

    def read():
        return np.load(path, allow_pickle=False)
    problem = _dtype_problem(dtype)
    if problem is None and end - start < math.prod(shape) * dtype.itemsize:
        problem = (f"cannot read: the file holds {end - start} bytes of data, shape {shape} "
                   f"needs {math.prod(shape) * dtype.itemsize}")
    return [TensorEntry(base, shape, dtype, dtype.kind == "f", read, problem)]


# ------------------------------------------------------------------- .npz
def _list_npz(path):
    if not zipfile.is_zipfile(path):
        raise CliError(f"{path}: not an .npz file (not a zip archive)")
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise CliError(f"{path}: cannot read: {one_line(exc)}") from None
    entries = []
    with archive:
        names = archive.namelist()
        twice = sorted({m for m in names if names.count(m) > 1})
        if twice:
            raise CliError(f"{path}: not a valid .npz file (members {twice[:3]} appear twice)")
        for member in names:
            name = member[:-4] if member.endswith(".npy") else member
            try:
                with archive.open(member) as fh:
                    shape, _, dtype = _npy_header(fh, f"{path}:{name}")
                    have = archive.getinfo(member).file_size - fh.tell()
            except CliError as exc:
                entries.append(TensorEntry(name, (), "unknown", False, None, str(exc)))
                continue
            except (zipfile.BadZipFile, OSError, EOFError) as exc:
                entries.append(TensorEntry(name, (), "unknown", False, None,
                                           f"cannot read: {one_line(exc)}"))
                continue

            def read(member=member):
                with np.load(path, allow_pickle=False) as npz:
                    return npz[member[:-4] if member.endswith(".npy") else member]
            problem = _dtype_problem(dtype)
            if problem is None and have < math.prod(shape) * dtype.itemsize:
                problem = (f"cannot read: the member holds {have} bytes of data, shape {shape} "
                           f"needs {math.prod(shape) * dtype.itemsize}")
            entries.append(TensorEntry(name, shape, dtype, dtype.kind == "f", read, problem))
    return entries


# ----------------------------------------------------------- .safetensors
def _safetensors_header(path):
    """(entries, metadata, offset of the data, data length), validated by
    :func:`quantcore.checkpoints.read_header`; CliError when the file is not
    a well-formed safetensors file."""
    from .checkpoints import read_header
    try:
        return read_header(path)
    except ValueError as exc:
        raise CliError(one_line(exc)) from None


def _safetensors_entry(path, name, entry, data_start):
    code, shape, begin, _ = entry
    if code in _SAFETENSORS_DTYPES:
        dtype, widen = np.dtype(_SAFETENSORS_DTYPES[code]), None
    elif code in _WIDENED:
        widen, dtype = _WIDENED[code][1], None
    else:
        return TensorEntry(name, shape, code, False, None,
                           f"dtype {code!r} is not read (not a real number type numpy holds)")
    count = math.prod(shape)
    start = data_start + begin

    def raw(dt):
        with open(path, "rb") as fh:
            fh.seek(start)
            values = np.fromfile(fh, dtype=dt, count=count)
        if values.size != count:
            raise CliError(f"cannot read: the file ends {count - values.size} values early")
        return values.reshape(shape)

    if dtype is not None:
        return TensorEntry(name, shape, dtype.newbyteorder("="), dtype.kind == "f",
                           lambda: raw(dtype).astype(dtype.newbyteorder("="), copy=False))
    if code == "BF16":   # the upper 16 bits of a float32: widening is exact
        return TensorEntry(name, shape, code, True, lambda: (
            raw(np.dtype("<u2")).astype(np.uint32) << 16).view(np.float32), widened=True)
    try:
        import ml_dtypes
    except ImportError:
        return TensorEntry(name, shape, code, True, None,
                           f"{code} values need the ml_dtypes package to be read "
                           "(pip install ml_dtypes)")
    fp8 = np.dtype(getattr(ml_dtypes, widen))
    return TensorEntry(name, shape, code, True, lambda: raw(fp8).astype(np.float32),
                       widened=True)


def _list_safetensors(path):
    entries, _, data_start, _ = _safetensors_header(path)
    return [_safetensors_entry(path, name, entry, data_start)
            for name, entry in entries.items()]


def safetensors_metadata(path):
    """The ``__metadata__`` of a safetensors file ({} when absent)."""
    return dict(_safetensors_header(path)[1])


# ------------------------------------------------------------------ public
def list_tensors(path):
    """The :class:`TensorEntry` list of a .npy, .npz or .safetensors file."""
    if not os.path.exists(path):
        raise CliError(f"{path}: no such file")
    if os.path.isdir(path):
        raise CliError(f"{path}: is a directory, expected a .npy, .npz or .safetensors file")
    if not os.path.isfile(path):  # (a FIFO would block open())
        raise CliError(f"{path}: not a regular file (a device, FIFO or socket)")
    base = os.path.splitext(os.path.basename(path))[0]
    try:
        if path.endswith(".npy"):
            return _list_npy(path, base)
        if path.endswith(".npz"):
            return _list_npz(path)
        if path.endswith(".safetensors"):
            return _list_safetensors(path)
    except OSError as exc:
        raise CliError(f"{path}: cannot read: {exc.strerror or one_line(exc)}") from None
    raise CliError(f"{path}: unknown file type (expected .npy, .npz or .safetensors)")


def _save_safetensors(tensors, path, metadata):
    from .checkpoints import SafetensorsWriter
    arrays = {name: np.asarray(arr) for name, arr in tensors.items()}
    for name, arr in arrays.items():
        if arr.dtype.newbyteorder("<") not in _SAFETENSORS_CODES:
            raise CliError(f"{name}: dtype {arr.dtype} cannot be written to a safetensors file")
    try:
        writer = SafetensorsWriter(path, [(n, a.dtype, a.shape) for n, a in arrays.items()],
                                   metadata)
    except (ValueError, TypeError) as exc:
        raise CliError(one_line(exc)) from None
    with writer:
        for name, arr in arrays.items():
            writer.write(name, arr)


def save_tensors(tensors, path, metadata=None):
    """Write ``{name: array}`` to a .npy (one tensor), .npz or .safetensors
    file (``metadata``: the safetensors ``__metadata__`` strings), atomically
    (quantcore._files: a previous file survives any failure, nothing is left
    behind)."""
    if path.endswith(".npy"):
        if len(tensors) != 1:
            raise CliError(f"{path}: .npy holds one tensor, got {len(tensors)}; use .npz")

        def writer():
            with atomic_write(path) as fh:
                np.save(fh, next(iter(tensors.values())))
    elif path.endswith(".npz"):
        def writer():
            with atomic_write(path) as fh:
                np.savez(fh, **tensors)
    elif path.endswith(".safetensors"):
        writer = lambda: _save_safetensors(tensors, path, metadata)  # noqa: E731
    else:
        raise CliError(f"{path}: unknown output type (expected .npy, .npz or .safetensors)")
    write_or_fail(path, writer)


def write_or_fail(path, writer):
    try:
        writer()
    except OSError as exc:
        raise CliError(f"{path}: cannot write: {exc.strerror or one_line(exc)}") from None


def write_path_or_fail(path, writer):
    """``writer(p)`` for a library that writes a file at a path it is given
    (matplotlib's images and PDFs): ``p`` is a temporary beside ``path``,
    renamed onto it once ``writer`` returns (``_files.atomic_path``), so a
    failed or killed run leaves any previous ``path`` as it was; OSError as
    :func:`write_or_fail`."""
    from ._files import atomic_path

    def atomic():
        with atomic_path(path) as temporary:
            writer(temporary)
    write_or_fail(path, atomic)


def check_writable(path, option, inputs=()):
    """Fail before a long run when an output cannot be created, or when it
    is one of ``inputs`` (the same file by any path: symlinks, symlinked
    folders, hard links)."""
    try:
        refuse_same_file(path, inputs, option)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise CliError(f"{option} {path}: folder {folder} does not exist")
    if os.path.isdir(path):
        raise CliError(f"{option} {path}: is a directory")
    if not os.access(folder, os.W_OK):
        raise CliError(f"{option} {path}: folder {folder} is not writable")
