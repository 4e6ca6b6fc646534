"""The on-disk cache of compiled kernel modules (no cupy needed).

A module is one ``cuda/*.cu`` source compiled for one group of its name
expressions (32-bit or 64-bit index instantiations) by one compiler for
one device architecture.  Its entry is two files in the cache folder:

- ``<key>.json``: the format version, the key and the fields it was made
  from, the lowered (mangled) name of every name expression, and the name,
  size and SHA-256 of the binary file;
- ``<key>-<sha256 prefix>.bin``: the binary (cubin, or PTX where the
  compiler made PTX) exactly as the compiler returned it.

``key`` is the SHA-256 of the canonical JSON of the fields: the source's
name, the SHA-256 of the source and of every header it includes (quoted
``#include``, transitively), the compile options (the include folder
replaced by a placeholder: moving the installation does not invalidate),
the name expressions, the compiler's identity (NVRTC version) and the
target (the device's compute capability and the binary kind).  An entry
is trusted only when all of that matches and the binary's size and hash
are those recorded; anything else (missing, truncated, corrupt, foreign,
another format) is a miss and the module is compiled again and the entry
rewritten.  Writes go to a temporary file in the same folder, then
``os.replace``: a reader sees the old file or the new one, never half of
one; the binary is written before the JSON that names it, and its name
carries its hash, so concurrent writers of one key never mix two builds.
No pickle: JSON and the compiler's bytes only.

The folder is ``$QUANTCORE_KERNEL_CACHE`` when set (``off`` disables the
disk cache: modules then live in a per-process temporary folder), else
``$XDG_CACHE_HOME/quantcore/kernels`` or ``~/.cache/quantcore/kernels``.
A folder that cannot be written falls back to the per-process one (with
one warning).  Entries are never pruned (each source and NVRTC version
adds one per group): deleting the folder is always safe.
"""
import atexit
import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
import warnings

__all__ = ["FORMAT", "REJECTED", "cache_dir", "closure", "key_of", "DiskCache", "Entry",
           "get_module"]

#: version of the entry layout; entries of another format are misses
FORMAT = 1
#: (key, reason) of every entry found unusable in this process (diagnostics)
REJECTED = []

_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.M)


def cache_dir():
    """The cache folder (see the module docstring), or None when disabled."""
    env = os.environ.get("QUANTCORE_KERNEL_CACHE")
    if env is not None and env.strip():
        if env.strip().lower() == "off":
            return None
        return os.path.abspath(os.path.expanduser(env.strip()))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "quantcore", "kernels")


def closure(name, code, dirs):
    """{file name: SHA-256 hex} of the source ``name`` (its text ``code``)
    and every file it includes with a quoted ``#include``, transitively,
    searched in ``dirs`` in order (an include that is not found is left to
    the compiler, which then fails).  Includes inside ``#if`` blocks count
    too: the set is a superset, never a subset."""
    data = code.encode() if isinstance(code, str) else code
    out = {name: hashlib.sha256(data).hexdigest()}
    todo = [data]
    while todo:
        for inc in _INCLUDE.findall(todo.pop()):
            inc = inc.decode()
            if inc in out:
                continue
            for d in dirs:
                path = os.path.join(d, inc)
                if os.path.isfile(path):
                    with open(path, "rb") as fh:
                        text = fh.read()
                    out[inc] = hashlib.sha256(text).hexdigest()
                    todo.append(text)
                    break
    return out


def key_of(fields):
    """The entry key (SHA-256 hex) of a JSON-serialisable dict of fields."""
    blob = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


class Entry:
    """A usable module binary: ``path`` (a file the loader reads),
    ``lowered`` {name expression: lowered name}, ``compiled`` (False when
    it came from the disk cache) and ``seconds`` (compile or load time)."""

    def __init__(self, path, lowered, compiled, seconds=0.0):
        self.path, self.lowered, self.compiled, self.seconds = path, lowered, compiled, seconds


def _write_atomic(path, data):
    """Write bytes to ``path`` through a temporary file in its folder and
    ``os.replace`` (atomic on POSIX and Windows)."""
    folder = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class DiskCache:
    """Entries in one folder (see the module docstring); an unusable entry
    is recorded in ``REJECTED``."""

    def __init__(self, folder):
        self.folder = folder
        self.rejected = REJECTED

    def _meta_path(self, key):
        return os.path.join(self.folder, key + ".json")

    def load(self, key, fields, names):
        """(binary path, lowered names) of a valid entry, else None."""
        try:
            with open(self._meta_path(key), "rb") as fh:
                meta = json.loads(fh.read().decode("utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            self.rejected.append((key, f"unreadable metadata ({type(exc).__name__})"))
            return None
        reason = self._invalid(meta, key, fields, names)
        if reason is None:
            path = os.path.join(self.folder, meta["binary"])
            try:
                with open(path, "rb") as fh:
                    data = fh.read()
            except OSError as exc:
                reason = f"binary unreadable ({type(exc).__name__})"
            else:
                if len(data) != meta["size"] or hashlib.sha256(data).hexdigest() != meta["sha256"]:
                    reason = "binary size or hash differs (truncated or corrupt)"
        if reason is not None:
            self.rejected.append((key, reason))
            return None
        return path, dict(meta["lowered"])

    @staticmethod
    def _invalid(meta, key, fields, names):
        """Why ``meta`` is not an entry for (key, fields, names), or None."""
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            return "another format"
        if meta.get("key") != key or meta.get("fields") != fields:
            return "foreign entry (key or fields differ)"
        lowered, binary = meta.get("lowered"), meta.get("binary")
        if not isinstance(lowered, dict) or set(lowered) != set(names) or \
                not all(isinstance(v, str) and v for v in lowered.values()):
            return "lowered names missing"
        if not isinstance(binary, str) or os.path.basename(binary) != binary or \
                not binary.startswith(key + "-"):
            return "bad binary name"
        if not isinstance(meta.get("size"), int) or not isinstance(meta.get("sha256"), str):
            return "bad binary size or hash"
        return None

    def store(self, key, fields, binary, lowered):
        """Write an entry; its binary's path (raises OSError when the folder
        cannot be written)."""
        os.makedirs(self.folder, exist_ok=True)
        digest = hashlib.sha256(binary).hexdigest()
        name = f"{key}-{digest[:16]}.bin"
        path = os.path.join(self.folder, name)
        _write_atomic(path, binary)
        meta = {"format": FORMAT, "key": key, "fields": fields, "lowered": dict(lowered),
                "binary": name, "size": len(binary), "sha256": digest}
        _write_atomic(self._meta_path(key), json.dumps(meta, indent=1, sort_keys=True).encode())
        return path


_lock = threading.Lock()
_private = []     # the per-process folder, made on first need
_warned = []


def _private_cache():
    with _lock:
        if not _private:
            folder = tempfile.mkdtemp(prefix="quantcore-kernels-")
            atexit.register(shutil.rmtree, folder, True)
            _private.append(DiskCache(folder))
    return _private[0]


def get_module(fields, names, compile_fn, folder=None, clock=None, force=False):
    """The Entry of the module described by ``fields`` (a dict, see
    :func:`key_of`) with name expressions ``names``: loaded from the disk
    cache in ``folder`` (default :func:`cache_dir`) when a valid entry is
    there, else ``compile_fn()`` -> (binary bytes, {name: lowered}) and
    stored; ``force``: compile even when an entry is there (the loader
    refused it).  ``clock``: a function giving seconds (time.perf_counter)."""
    import time
    clock = clock or time.perf_counter
    folder = cache_dir() if folder is None else folder
    fields = json.loads(json.dumps(fields))     # (what a reader of the JSON sees)
    key = key_of(fields)
    disk = DiskCache(folder) if folder else None
    t0 = clock()
    if disk is not None and not force:
        found = disk.load(key, fields, names)
        if found is not None:
            return Entry(found[0], found[1], False, clock() - t0)
    binary, lowered = compile_fn()
    lowered = {n: lowered[n] for n in names}
    seconds = clock() - t0
    if disk is not None:
        try:
            return Entry(disk.store(key, fields, binary, lowered), lowered, True, seconds)
        except OSError as exc:
            if not _warned:
                _warned.append(True)
                warnings.warn(f"quantcore_gpu: the kernel cache folder {folder!r} cannot be "
                              f"written ({exc}); compiled kernels are kept for this process "
                              "only (set QUANTCORE_KERNEL_CACHE to a writable folder)",
                              RuntimeWarning, stacklevel=3)
    return Entry(_private_cache().store(key, fields, binary, lowered), lowered, True, seconds)
