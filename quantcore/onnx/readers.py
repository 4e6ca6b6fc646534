"""Data readers and feeds: the feeds of any reader, :class:`NpzReader`
(arrays split into batches), :class:`SpooledReader` (any reader made
replayable through a temporary file), the spill file of the one-call
calibration (``_Spill``) and the one-batch-ahead inference thread
(``_prefetch``)."""
import contextlib
import queue
import tempfile
import threading

import numpy as np

from .._files import pread_into as _pread
from .._files import scratch_file
from ..compat import onnxruntime as O


def _prefetch(produce):
    """Iterate over the generator ``produce()`` run in a background thread
    one item ahead: the model runs on batch ``i + 1`` while the caller
    reduces batch ``i`` (onnxruntime and the kernels release the GIL), never
    further ahead (batch ``i + 2`` is begun once the caller asks for
    ``i + 1``); an exception in ``produce`` is raised here; closing this
    generator stops the thread."""
    items = queue.SimpleQueue()
    # item i + 1 is made once the caller asked for item i (it is done with i - 1)
    made_ahead = threading.Semaphore(1)
    stop = threading.Event()

    def run():
        try:
            for item in produce():
                items.put((True, item))
                del item
                while not made_ahead.acquire(timeout=0.05):
                    if stop.is_set():
                        return
        except BaseException as exc:   # handed to the consumer, raised there
            items.put((False, exc))
        else:
            items.put((False, None))

    worker = threading.Thread(target=run, name="quantcore-onnx-inference", daemon=True)
    worker.start()
    try:
        while True:
            ok, item = items.get()
            if not ok:
                if item is not None:
                    raise item
                return
            yield item
            del item
            made_ahead.release()
    finally:
        stop.set()
        worker.join()


class _Spill:
    """Arrays appended to one temporary file (raw bytes, no pickle): whole
    batches read back in order (``write`` / ``read``), or each tensor's
    pieces gathered across chunks (``write_parts`` / ``gather``).  The file
    has no name (unlinked as it is made, quantcore._files.scratch_file):
    no exit, SIGKILL or a full disk included, leaves it behind; it is read
    back through its descriptor with ``os.preadv`` (no shared position:
    threads may gather at once)."""

    def __init__(self, directory=None):
        self.file = scratch_file(directory, prefix="quantcore_onnx_", suffix=".spill")
        self.path = f"the spill file in {directory or tempfile.gettempdir()}"
        self.index = []
        self.pieces = {}    # name: [(offset, dtype, bytes, batches)]
        self.nbytes = 0

    def _append(self, a):
        """Write a C-contiguous array; its offset in the file."""
        offset = self.nbytes
        if a.size:
            self.file.write(memoryview(a.reshape(-1)).cast("B"))
        self.nbytes += a.nbytes
        return offset

    def write(self, batch):
        entry = []
        for name, a in batch.items():
            a = np.asarray(a)
            if not a.flags.c_contiguous:   # (np.ascontiguousarray makes 0-d arrays 1-d)
                a = a.copy(order="C")
            entry.append((name, a.dtype, a.shape))
            self._append(a)
        self.index.append(entry)

    def write_parts(self, chunk, batches):
        """{name: pieces} of ``batches`` batches: a name's one piece holds
        them all, or each of its pieces is one batch (1-d, one dtype)."""
        for name, parts in chunk.items():
            per_piece = batches if len(parts) == 1 else 1
            where = self.pieces.setdefault(name, [])
            for p in parts:
                where.append((self._append(np.ascontiguousarray(p)), p.dtype, p.nbytes, per_piece))

    def gather(self, name, max_bytes):
        """Yield ``(batches, values)`` of tensor ``name``: its pieces in the
        order written, read back joined into 1-d arrays of at most
        ``max_bytes`` (or one piece).  Calls for different tensors may run
        in threads (positioned reads)."""
        self.file.flush()
        pieces = self.pieces.get(name, [])
        i = 0
        while i < len(pieces):
            j, nbytes = i + 1, pieces[i][2]
            while j < len(pieces) and nbytes + pieces[j][2] <= max_bytes:
                nbytes += pieces[j][2]
                j += 1
            out = np.empty(nbytes // pieces[i][1].itemsize, pieces[i][1])
            view, at = memoryview(out).cast("B"), 0
            for offset, _, size, _ in pieces[i:j]:
                self._read_into(view[at:at + size], offset)
                at += size
            yield sum(p[3] for p in pieces[i:j]), out
            i = j

    def _read_into(self, view, offset):
        """Fill ``view`` from the file at ``offset`` (one read returns at
        most about 2 GiB: _pread loops)."""
        try:
            _pread(self.file.fileno(), view, offset, self.path)
        except OSError as exc:
            raise OSError(f"{self.path}: the spilled activations were cut short ({exc})") \
                from None

    def read(self):
        self.file.flush()
        offset = 0
        for entry in self.index:
            batch = {}
            for name, dtype, shape in entry:
                a = np.empty(shape, dtype)
                self._read_into(memoryview(a.reshape(-1)).cast("B"), offset)
                offset += a.nbytes
                batch[name] = a
            yield batch

    def close(self):
        """Drop the file (nothing to unlink: it has no name; a failed flush
        on a full disk is ignored)."""
        with contextlib.suppress(OSError, ValueError):
            self.file.close()
        if not self.file.closed:
            with contextlib.suppress(OSError, ValueError):
                self.file.raw.close()


class SpooledReader:
    """Any reader made replayable: the feeds of ``data`` (a
    CalibrationDataReader, an iterable of feeds, a callable returning one)
    are copied to a temporary file as they are first read (raw bytes, no
    pickle; memory: one feed), and every later iteration reads them back
    from it.  ``close()`` (or the end of a ``with`` block) removes the file."""

    def __init__(self, data, directory=None):
        self.data = data
        self.directory = directory
        self._spill = None
        self.batches = None

    def __iter__(self):
        if self.batches is not None:
            yield from self._spill.read()
            return
        self.close()
        self._spill = _Spill(self.directory)
        n = 0
        for feed in O.iter_batches(self.data, "reader"):
            self._spill.write(feed)
            n += 1
            yield feed
        self.batches = n

    def __len__(self):
        if self.batches is None:
            raise TypeError("SpooledReader: the length is known once the data was read")
        return self.batches

    def close(self):
        if self._spill is not None:
            self._spill.close()
        self._spill, self.batches = None, None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def replayable(data):
    """True when ``data`` can be read twice: a callable returning a fresh
    iterable, a reader with ``rewind()``, or an iterable that is not its own
    iterator (a list, a :class:`NpzReader`, a :class:`SpooledReader`)."""
    if callable(data) and not hasattr(data, "get_next"):
        return True
    if hasattr(data, "get_next"):
        return hasattr(data, "rewind")
    try:
        return iter(data) is not data
    except TypeError:
        return False


def _feeds(data):
    """Feeds of ``data``: a CalibrationDataReader, an iterable of dicts, or a
    callable returning one; a reader with ``rewind()`` is rewound first."""
    if hasattr(data, "rewind"):
        data.rewind()
    return O.iter_batches(data, "calibrate")


class NpzReader:
    """A CalibrationDataReader over arrays: ``inputs`` {input name: array}
    split into batches of ``batch_size`` rows along each input's batch axis
    (``batch_axes`` {input name: axis or None}, default 0; None, and every
    0-d array: not batched, the whole array in every batch, e.g. a sample
    rate).  ``rewind()`` starts again, ``len()`` is the number of batches,
    ``set_range`` as ORT's."""

    def __init__(self, inputs, batch_size=1, batch_axes=None):
        if not inputs:
            raise ValueError("NpzReader: no input arrays")
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or \
                batch_size < 1:
            raise ValueError(f"NpzReader: batch_size must be an int >= 1, got {batch_size!r}")
        batch_axes = dict(batch_axes or {})
        unknown = sorted(set(batch_axes) - set(inputs))
        if unknown:
            raise ValueError(f"NpzReader: batch_axes names no input {', '.join(unknown)} "
                             f"(inputs: {', '.join(inputs)})")
        self.axes = {}
        for k, v in inputs.items():
            axis = batch_axes.get(k, 0 if np.ndim(v) else None)
            if axis is not None:
                if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or \
                        not -np.ndim(v) <= axis < np.ndim(v):
                    raise ValueError(f"NpzReader: batch axis of {k!r} must be an axis of its "
                                     f"shape {np.shape(v)} or None, got {axis!r}")
                axis = int(axis) % np.ndim(v)
            self.axes[k] = axis
        sizes = {k: np.shape(v)[a] for k, v in inputs.items()
                 if (a := self.axes[k]) is not None}
        if not sizes:
            raise ValueError("NpzReader: no input is batched (every batch axis is None)")
        if len(set(sizes.values())) != 1:
            raise ValueError(f"NpzReader: the batched inputs have different numbers of rows "
                             f"along their batch axes {self._axes_text()}: {sizes}")
        self.inputs = inputs
        self.rows = next(iter(sizes.values()))
        self.batch_size = int(batch_size)
        self.start, self.end = 0, len(self)
        self.pos = self.start

    def _axes_text(self):
        return "{" + ", ".join(f"{k}: {a}" for k, a in self.axes.items()) + "}"

    def __len__(self):
        return -(-self.rows // self.batch_size)

    def set_range(self, start_index, end_index):
        self.start, self.end = start_index, min(end_index, len(self))
        self.pos = start_index

    def rewind(self):
        self.pos = self.start

    def get_next(self):
        if self.pos >= self.end:
            return None
        lo = self.pos * self.batch_size
        self.pos += 1
        sl = slice(lo, lo + self.batch_size)
        return {k: v if (a := self.axes[k]) is None else v[(slice(None),) * a + (sl,)]
                for k, v in self.inputs.items()}

    def __iter__(self):
        self.rewind()
        while True:
            b = self.get_next()
            if b is None:
                return
            yield b
