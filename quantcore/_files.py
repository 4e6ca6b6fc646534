"""Every file quantcore writes goes through here: atomic outputs, temporary
files that leave nothing behind, and the output-is-the-input check.

- :class:`AtomicFile` / :func:`atomic_write`: a file written under a
  temporary name beside the final one (same folder, so the rename is one
  file system's), flushed, ``fsync``-ed, renamed onto the final name with
  ``os.replace`` and the folder ``fsync``-ed.  On Linux the file is first
  opened without any name (``O_TMPFILE``) and given its temporary name only
  at the end, just before the rename, so even SIGKILL while writing leaves
  nothing; elsewhere (or where the file system refuses ``O_TMPFILE``) the
  temporary name is ``.<name>.<pid>.<random>.tmp`` from the start.  On any
  exception the temporary is removed (before its close, which may raise
  again on a full disk) and the previous file at the final name is
  untouched; two writers of one name never mix (each has its own
  temporary, the last rename wins whole).
- :func:`atomic_path`: the same for a library that writes to a path (ONNX
  Runtime's model and its external data): it writes into a temporary folder
  beside the final name, under the final file name, and every file it
  wrote is renamed into the final folder (the named file last).
- :func:`atomic_dir`: a directory output, built in a temporary folder beside
  it and renamed into place (an existing one is renamed aside first and
  removed after: POSIX has no atomic exchange of two folders).
- :func:`scratch_file`: a binary temporary file with no name at all
  (unlinked while open), read back with :func:`pread_into`.
- :func:`refuse_same_file`: an output that is one of the inputs (the same
  file through a symlink, a symlinked folder or a hard link) is refused.
- :func:`start_writeback`: a hint to the kernel to start writing a file's
  dirty pages now (Linux ``sync_file_range``), so that the fsync at the end
  of a long write waits for little (a writer calls it every few MiB).

Temporaries left by a process that died (SIGKILL during a named-temporary
write) are named after its process id, and the next write of the same
output removes those whose process no longer runs.
"""
import contextlib
import errno
import io
import os
import secrets
import shutil
import stat
import sys

__all__ = ["AtomicFile", "atomic_write", "atomic_path", "atomic_dir", "temp_dir_beside",
           "scratch_file",
           "pread_into", "refuse_same_file", "same_file"]

_SUFFIX = ".tmp"


def _split(path):
    path = os.fspath(path)
    folder, base = os.path.split(os.path.abspath(path))
    if not base:
        raise IsADirectoryError(errno.EISDIR, "expected a file name", path)
    return folder, base


def _temp_name(folder, base):
    """``folder/.<base>.<pid>.<random>.tmp`` (the name cut to fit NAME_MAX)."""
    return os.path.join(folder, f".{base[:180]}.{os.getpid()}.{secrets.token_hex(6)}{_SUFFIX}")


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # (EPERM: another user's live process)
        return True
    return True


def _remove_stale(folder, base):
    """Remove the temporaries of ``base`` left by processes that no longer
    run (a SIGKILL while a named temporary existed)."""
    head = f".{base[:180]}."
    with contextlib.suppress(OSError), os.scandir(folder) as it:
        for entry in it:
            name = entry.name
            if not (name.startswith(head) and name.endswith(_SUFFIX)):
                continue
            pid = name[len(head):].split(".", 1)[0]
            if not pid.isdigit() or int(pid) == os.getpid() or _pid_alive(int(pid)):
                continue
            _remove(entry.path)


def _remove(path):
    with contextlib.suppress(OSError):
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)


def fsync_dir(folder):
    """Make a rename in ``folder`` durable (file systems that cannot sync a
    folder are skipped)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


#: {st_dev: whether an unnamed file can be given a name there} (probed once)
_UNNAMED_OK = {}


def _link_unnamed(fd, name):
    """Give the unnamed file ``fd`` the name ``name`` (linkat through
    /proc/self/fd with AT_SYMLINK_FOLLOW; plain link() would link the
    /proc symlink itself)."""
    proc = os.open("/proc/self/fd", os.O_RDONLY)
    try:
        os.link(str(fd), name, src_dir_fd=proc, follow_symlinks=True)
    finally:
        os.close(proc)


def _open_unnamed(folder):
    """An fd of a new file in ``folder`` with no name (Linux O_TMPFILE), or
    None where the OS or file system cannot make one and name it later."""
    flag = getattr(os, "O_TMPFILE", 0)
    if not flag or not os.path.isdir("/proc/self/fd"):
        return None
    try:
        dev = os.stat(folder).st_dev
        fd = os.open(folder, flag | os.O_WRONLY | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL, errno.ENOENT):
            return None   # (ENOENT: a kernel without O_TMPFILE reads it as O_DIRECTORY)
        raise
    if dev not in _UNNAMED_OK:   # one probe per file system: can one be named?
        probe, name = os.open(folder, flag | os.O_WRONLY, 0o600), _temp_name(folder, "probe")
        try:   # (its own file: a linked and unlinked one cannot be linked again)
            _link_unnamed(probe, name)
            os.unlink(name)
            _UNNAMED_OK[dev] = True
        except OSError:
            _UNNAMED_OK[dev] = False
        finally:
            os.close(probe)
    if not _UNNAMED_OK[dev]:
        os.close(fd)
        return None
    return fd


class AtomicFile:
    """A file written under a temporary name and renamed onto ``path`` by
    :meth:`commit` (module docstring); :meth:`discard` (or an exception in
    its ``with`` block) drops it, leaving any previous ``path`` as it was.

    Attributes
    ----------
    file : file object
        Binary (``text=False``) or UTF-8 text, buffered.
    path : str
        The final name.
    """

    def __init__(self, path, text=False):
        self.path = os.fspath(path)
        self._folder, base = _split(self.path)
        if os.path.isdir(self.path):
            raise IsADirectoryError(errno.EISDIR, "is a directory, expected a file path",
                                    self.path)
        _remove_stale(self._folder, base)
        self._base = base
        self._tmp = None    # the temporary's name (None while it has none)
        fd = _open_unnamed(self._folder)
        if fd is None:
            fd, self._tmp = self._open_named()
        self._fd = fd
        self._raw = raw = os.fdopen(fd, "wb")
        self.file = io.TextIOWrapper(raw, encoding="utf-8") if text else raw
        self._done = False

    def _open_named(self):
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
        while True:
            tmp = _temp_name(self._folder, self._base)
            try:
                return os.open(tmp, flags, 0o666), tmp
            except FileExistsError:
                continue

    def _name_it(self):
        """Give the unnamed file its temporary name (linkat through /proc)."""
        while True:
            tmp = _temp_name(self._folder, self._base)
            try:
                _link_unnamed(self._fd, tmp)
                self._tmp = tmp
                return
            except FileExistsError:
                continue

    def start_writeback(self):
        """Flush the file object and let the kernel start writing what was
        written so far (:func:`start_writeback`: a hint; :meth:`commit`'s
        fsync is what makes it durable)."""
        self.file.flush()
        return start_writeback(self._fd)

    def commit(self):
        """Flush, fsync, rename onto the final name, fsync the folder."""
        if self._done:
            return
        try:
            self.file.flush()
            os.fsync(self._fd)
            with contextlib.suppress(OSError):   # keep the permissions of the file replaced
                os.chmod(self._fd, stat.S_IMODE(os.stat(self.path).st_mode))
            if self._tmp is None:
                self._name_it()
            self.file.close()
            os.replace(self._tmp, self.path)
        except BaseException:
            self.discard()
            raise
        self._done = True
        self._tmp = None
        fsync_dir(self._folder)

    def discard(self):
        """Drop the temporary (unlinked before its close, which may raise
        again on a full disk); the final name is untouched."""
        if self._done:
            return
        self._done = True
        if self._tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._tmp)
            self._tmp = None
        with contextlib.suppress(OSError, ValueError):
            self.file.close()
        if not self._raw.closed:   # (a failed flush may leave it open)
            with contextlib.suppress(OSError, ValueError):
                self._raw.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is None:
            self.commit()
        else:
            self.discard()
        return False


@contextlib.contextmanager
def atomic_write(path, text=False):
    """``with atomic_write(path) as fh:`` write to ``fh``; ``path`` gets the
    whole file when the block ends without an exception, else stays as it
    was (:class:`AtomicFile`)."""
    with AtomicFile(path, text=text) as f:
        yield f.file


def _fsync_file(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path):
    """Yield a path with the same file name as ``path`` inside a new
    temporary folder beside it, for a writer that takes a path (and may
    write files next to it, as ONNX external data).  When the block ends
    without an exception every file written there is fsync-ed and renamed
    into ``path``'s folder, ``path`` itself last; the temporary folder is
    removed in any case."""
    folder, base = _split(path)
    if os.path.isdir(path):
        raise IsADirectoryError(errno.EISDIR, "is a directory, expected a file path",
                                os.fspath(path))
    _remove_stale(folder, base)
    scratch = _make_temp_dir(folder, base)
    try:
        yield os.path.join(scratch, base)
        names = sorted(os.listdir(scratch), key=lambda n: (n == base, n))
        for name in names:
            if os.path.isfile(os.path.join(scratch, name)):
                _fsync_file(os.path.join(scratch, name))
        for name in names:
            if os.path.isfile(os.path.join(scratch, name)):
                os.replace(os.path.join(scratch, name), os.path.join(folder, name))
        fsync_dir(folder)
    finally:
        _remove(scratch)


def temp_dir_beside(path):
    """A new empty folder beside ``path``, named as its temporaries are (so
    the next write of ``path`` removes it if this process dies first); the
    caller removes it."""
    folder, base = _split(path)
    return _make_temp_dir(folder, base)


def _make_temp_dir(folder, base):
    while True:
        tmp = _temp_name(folder, base)
        try:
            os.mkdir(tmp, 0o777)
            return tmp
        except FileExistsError:
            continue


@contextlib.contextmanager
def atomic_dir(path):
    """Yield a new temporary folder beside the folder ``path``; when the
    block ends without an exception its files are fsync-ed and it is renamed
    to ``path`` (an existing ``path`` renamed aside first, then removed),
    else removed."""
    parent, base = _split(path)
    _remove_stale(parent, base)
    tmp = _make_temp_dir(parent, base)
    try:
        yield tmp
        for dirpath, _, files in os.walk(tmp):
            for f in files:
                _fsync_file(os.path.join(dirpath, f))
        aside = None
        if os.path.lexists(path):
            aside = _temp_name(parent, base)
            os.rename(path, aside)
        try:
            os.rename(tmp, path)
        except BaseException:
            if aside is not None:
                os.rename(aside, path)
            raise
        fsync_dir(parent)
        if aside is not None:
            _remove(aside)
    finally:
        if os.path.lexists(tmp):
            _remove(tmp)


def scratch_file(directory=None, prefix="quantcore_", suffix=".tmp"):
    """A binary read-write temporary file with no name (unlinked while
    open, so no exit, SIGKILL included, leaves it behind); ``directory``
    default: the system's temporary folder (TMPDIR)."""
    import tempfile
    return tempfile.TemporaryFile("w+b", prefix=prefix, suffix=suffix, dir=directory)


def pread_into(fd, view, offset, what="the file"):
    """Fill the bytes ``view`` from ``fd`` at ``offset`` (``os.preadv``: no
    shared file position, so threads may read one fd at once; one read
    returns at most about 2 GiB, so it loops); OSError when the file ends
    first."""
    view = memoryview(view).cast("B")
    at = 0
    while at < len(view):
        got = os.preadv(fd, [view[at:]], offset + at)
        if not got:
            raise OSError(f"{what} was cut short: {len(view) - at} of {len(view)} bytes "
                          f"missing at offset {offset + at}")
        at += got


#: copy_file_range's errors that mean "not here" (another file system on an
#: old kernel, no such call, a file system or sandbox that refuses it): the
#: copy goes through memory instead
_NO_COPY_RANGE = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EPERM}


def copy_range(src_fd, dst_fd, offset, nbytes, what="the file"):
    """Append ``nbytes`` of ``src_fd`` from ``offset`` to ``dst_fd`` at its
    file position: in the kernel (``os.copy_file_range``: no copy through
    this process's memory), else with :func:`pread_into` and ``os.write``
    where the system refuses it; OSError when the source ends first."""
    at = 0
    copy = getattr(os, "copy_file_range", None)
    while at < nbytes and copy is not None:
        try:
            got = copy(src_fd, dst_fd, nbytes - at, offset + at)
        except OSError as e:
            if e.errno not in _NO_COPY_RANGE:
                raise
            break
        if not got:
            raise OSError(f"{what} was cut short: {nbytes - at} of {nbytes} bytes missing at "
                          f"offset {offset + at}")
        at += got
    if at < nbytes:
        view = memoryview(bytearray(nbytes - at))
        pread_into(src_fd, view, offset + at, what)
        while len(view):
            view = view[os.write(dst_fd, view):]


#: sync_file_range(2)'s "start writing the dirty pages, do not wait" flag
_SYNC_FILE_RANGE_WRITE = 2
_sync_file_range = None  # (libc's, resolved at the first call; False: none here)


def start_writeback(fd):
    """Ask the kernel to start writing ``fd``'s dirty pages to the disk now,
    without waiting for them (Linux ``sync_file_range(fd, 0, 0,
    SYNC_FILE_RANGE_WRITE)``): the writes overlap the work that follows,
    and the fsync that makes the file durable later waits for little.  A
    hint only: it guarantees nothing (the fsync still does), returns whether
    the call was made and succeeded, and never raises."""
    global _sync_file_range
    if _sync_file_range is None:
        _sync_file_range = False
        if sys.platform.startswith("linux"):
            try:
                import ctypes
                fn = ctypes.CDLL(None, use_errno=True).sync_file_range
                fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
                fn.restype = ctypes.c_int
                _sync_file_range = fn
            except (OSError, AttributeError, ImportError):
                pass
    if not _sync_file_range:
        return False
    return _sync_file_range(fd, 0, 0, _SYNC_FILE_RANGE_WRITE) == 0


def same_file(a, b):
    """Whether the paths ``a`` and ``b`` name the same file (symlinks,
    symlinked folders and hard links included); False when either does not
    exist."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def refuse_same_file(output, inputs, option="-o"):
    """ValueError when ``output`` is one of the files ``inputs`` (whatever
    the path: :func:`same_file`)."""
    if isinstance(inputs, (str, bytes, os.PathLike)):
        inputs = [inputs]
    for inp in inputs:
        if inp is not None and same_file(output, inp):
            raise ValueError(f"{option} {os.fspath(output)}: is the input file "
                             f"{os.fspath(inp)} (the same file through a link or another "
                             "path); write to another file")
