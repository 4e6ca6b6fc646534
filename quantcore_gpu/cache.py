"""The on-disk cache of compiled kernel modules (no cupy needed).

A module is one ``cuda/*.cu`` source compiled for one group of its name
expressions (32-bit or 64-bit index instantiations) by one compiler for
one device architecture.  Its entry is two files in the cache folder:

- ``<key>.json``: the format version, the key and the fields it was made
  from, the lowered (mangled) name of every name expression, and the name,
  size and SHA-256 of the binary file;
- ``<key>-<sha256 prefix>.bin``: the binary (cubin, or PTX where the
  compiler made PTX): for a cubin, the whole ELF image NVRTC produced
  (:func:`whole_image`: CuPy's ``nvrtc.getCUBIN`` returns it one byte
  short), never less than its ELF extent (:func:`elf_extent`).

``key`` is the SHA-256 of the canonical JSON of the fields: the source's
name, the SHA-256 of the source and of every header it includes (quoted
``#include``, transitively), the compile options (the include folder
replaced by a placeholder: moving the installation does not invalidate),
the name expressions, the compiler's identity (NVRTC version, the
library's file, the CuPy version and the options CuPy adds) and the
target CuPy chose (the ``-arch`` option and the binary kind).  An entry
is trusted only when all of that matches, the binary's size and hash
are those recorded and a cubin covers its whole ELF extent; anything
else (missing, truncated, corrupt, foreign, another format, a format-1
entry written before cubins were made whole) is a miss and the module is
compiled again and the entry rewritten.  Writes go to a temporary file
in the same folder, flushed and ``os.fsync``-ed, then ``os.replace``: a
reader sees the old file or the new one, never half of one; the binary
is written before the JSON that names it, and its name carries its hash,
so concurrent writers of one key never mix two builds.
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
import struct
import tempfile
import threading
import warnings

__all__ = ["FORMAT", "REJECTED", "cache_dir", "closure", "key_of", "DiskCache", "Entry",
           "get_module", "elf_extent", "whole_image", "CUPY_STRIPPED"]

#: version of the entry layout; entries of another format are misses.  2:
#: cubins whole (format 1 stored CuPy's one-byte-short cubins, never trusted)
FORMAT = 2
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


#: bytes that CuPy's ``nvrtc.getCUBIN`` cuts off the end of NVRTC's cubin
#: (``cupy_backends/cuda/libs/nvrtc.pyx``, CuPy 13.x, 14.x and main:
#: ``return cubin_ptr[:cubinSizeRet-1]`` under "Strip the trailing NULL",
#: a rule for text that a cubin does not follow: its last byte is the end
#: of the program-header table).  Loaded from a Python ``bytes`` object the
#: hidden terminator supplies it; loaded from a file it is missing.
CUPY_STRIPPED = 1

_ELF_MAGIC = b"\x7fELF"
_SHT_NOBITS = 8


def elf_extent(data):
    """The number of bytes an ELF image claims: the furthest end of its
    header (``e_ehsize``), its section-header table (``e_shoff + e_shnum *
    e_shentsize``), its program-header table (``e_phoff + e_phnum *
    e_phentsize``), every section's contents (``sh_offset + sh_size``,
    except SHT_NOBITS) and every segment's (``p_offset + p_filesz``); None
    when ``data`` is not an ELF image (PTX text).  Tables that lie past the
    end of ``data`` are counted from their header fields alone.  Raises
    ValueError for an ELF header that is cut short or malformed."""
    data = bytes(data)
    if not data.startswith(_ELF_MAGIC):
        return None
    if len(data) < 16 or data[4] not in (1, 2) or data[5] not in (1, 2):
        raise ValueError("elf_extent: a malformed ELF identification")
    wide, end = data[4] == 2, "<" if data[5] == 1 else ">"
    head = end + ("HHIQQQIHHHHHH" if wide else "HHIIIIIHHHHHH")
    if len(data) < 16 + struct.calcsize(head):
        raise ValueError(f"elf_extent: the ELF header is cut short ({len(data)} bytes)")
    (_, _, _, _, phoff, shoff, _, ehsize, phentsize, phnum, shentsize, shnum,
     _) = struct.unpack_from(head, data, 16)
    extent = max(ehsize, 16 + struct.calcsize(head))
    if shnum:
        extent = max(extent, shoff + shnum * shentsize)
        for i in range(shnum):   # (sh_type, sh_offset, sh_size) of each whole entry
            at = shoff + i * shentsize
            fmt = end + ("4xI16xQQ" if wide else "4xI8xII")
            if at + struct.calcsize(fmt) > len(data):
                break
            typ, off, size = struct.unpack_from(fmt, data, at)
            if typ != _SHT_NOBITS:
                extent = max(extent, off + size)
    if phnum:
        extent = max(extent, phoff + phnum * phentsize)
        for i in range(phnum):   # (p_offset, p_filesz) of each whole entry
            at = phoff + i * phentsize
            fmt = end + ("8xQ16xQ" if wide else "4xI8xI")
            if at + struct.calcsize(fmt) > len(data):
                break
            off, size = struct.unpack_from(fmt, data, at)
            extent = max(extent, off + size)
    return extent


def whole_image(binary):
    """The image to hand to the driver for a compiler result ``binary``:
    PTX (not ELF) unchanged; a cubin completed to its ELF extent with the
    zero byte CuPy's ``getCUBIN`` cut off (:data:`CUPY_STRIPPED`: the last
    byte of the program-header table, the high byte of the last entry's
    ``p_align``, which NVRTC writes as 0; the toolchain check compares the
    result with NVRTC's own ``nvrtcGetCUBIN`` bytes).  Raises ValueError for
    a cubin short by more than that (truncated, not stripped)."""
    binary = bytes(binary)
    extent = elf_extent(binary)
    if extent is None or len(binary) >= extent:
        return binary
    if extent - len(binary) > CUPY_STRIPPED:
        raise ValueError(f"quantcore_gpu: a cubin of {len(binary)} bytes whose ELF image ends at "
                         f"{extent}: truncated (CuPy cuts off {CUPY_STRIPPED} byte only)")
    return binary + bytes(extent - len(binary))


def _short_image(data):
    """Why ``data`` is not a whole image for the driver, or None."""
    try:
        extent = elf_extent(data)
    except ValueError as exc:
        return str(exc)
    if extent is not None and len(data) < extent:
        return f"binary shorter than its ELF image ({len(data)} < {extent} bytes)"
    return None


def key_of(fields):
    """The entry key (SHA-256 hex) of a JSON-serialisable dict of fields."""
    blob = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


class Entry:
    """A usable module binary: ``path`` (a file the loader reads),
    ``lowered`` {name expression: lowered name}, ``compiled`` (False when
    it came from the disk cache), ``seconds`` (compile or load time) and
    ``key`` (its cache key)."""

    def __init__(self, path, lowered, compiled, seconds=0.0, key=None):
        self.path, self.lowered, self.compiled, self.seconds = path, lowered, compiled, seconds
        self.key = key


def _write_atomic(path, data):
    """Write bytes to ``path`` through a temporary file in its folder
    (flushed and ``os.fsync``-ed: after a crash the new name never points
    at data that did not reach the disk) and ``os.replace`` (atomic on POSIX
    and Windows)."""
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
                else:
                    reason = _short_image(data)
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
        cannot be written, ValueError for a cubin shorter than its ELF
        image: :func:`whole_image` first)."""
        short = _short_image(binary)
        if short is not None:
            raise ValueError(f"quantcore_gpu: not stored, {short}")
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
            return Entry(found[0], found[1], False, clock() - t0, key)
    binary, lowered = compile_fn()
    lowered = {n: lowered[n] for n in names}
    seconds = clock() - t0
    if disk is not None:
        try:
            return Entry(disk.store(key, fields, binary, lowered), lowered, True, seconds, key)
        except OSError as exc:
            if not _warned:
                _warned.append(True)
                warnings.warn(f"quantcore_gpu: the kernel cache folder {folder!r} cannot be "
                              f"written ({exc}); compiled kernels are kept for this process "
                              "only (set QUANTCORE_KERNEL_CACHE to a writable folder)",
                              RuntimeWarning, stacklevel=3)
    return Entry(_private_cache().store(key, fields, binary, lowered), lowered, True, seconds,
                 key)
