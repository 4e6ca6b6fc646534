"""cudaemu: CuPy's compile-to-binary path and binary loading.

Real CuPy (13.x): ``cupy.cuda.compiler.compile_using_nvrtc(source, options,
arch=None, filename=..., name_expressions=...)`` compiles with NVRTC,
adding only ``-arch=sm_<cc>`` (or ``compute_<cc>`` for PTX) and, from NVRTC
12 on, ``--device-as-default-execution-space``, and returns ``(cubin,
{name expression: lowered name})``; ``cupy.RawModule(path=...)`` loads a
cubin / PTX file (``cuModuleLoad``, memoized per path and device) and its
``get_function`` takes the lowered name.  ``cupy.cuda.nvrtc.getVersion()``
is the NVRTC's (major, minor).

Here the "binary" is an ELF64 image shaped as NVRTC's cubin is (the ELF
header, the sections' contents, the section-header table, and the
program-header table last, so that its final byte is the high byte of the
last program header's ``p_align``, a zero), whose ``.nv.cudaemu`` section
holds the source, the options, the name expressions and the headers of
every ``-I`` folder (a cubin is
self-contained: it must load after the tree it was compiled from is gone,
e.g. from a disk cache written by another clone); loading it writes the
headers to a folder named by their digest and builds the same shared library as
``RawModule(code=...)`` does (g++ and the cudaemu prelude, the options
mapped as ``_emu.build`` maps them), so that quantcore's own compile and
disk cache run unchanged on the emulator.  A file that is not such an
image is refused as the driver refuses a bad image
(``CUDA_ERROR_INVALID_IMAGE``), and so is one shorter than its ELF extent
(the end of its header, section-header and program-header tables and of
every section), as NVIDIA's ``nvdisasm`` and ``cuobjdump`` refuse it.

``compile_using_nvrtc`` returns the image **one byte short**, as real
CuPy does: ``cupy_backends/cuda/libs/nvrtc.pyx`` ``getCUBIN`` (CuPy 13.x,
14.x and main) ends with ``# Strip the trailing NULL.`` / ``return
cubin_ptr[:cubinSizeRet-1]``, a rule for text that a cubin does not
follow.  Written to a file as it is, such an image is refused here.
"""
import hashlib
import json
import os
import shutil
import struct
import tempfile
import threading

from . import _emu

#: not a real NVRTC version: entries written on the emulator and on a real
#: GPU never share a cache key
NVRTC_VERSION = (0, 1)
_MAGIC = b"CUDAEMU-MODULE 3\n"
_HEADER_SUFFIXES = (".h", ".cuh", ".hpp")
#: (filename, number of name expressions) of every compile_using_nvrtc call
NVRTC_COMPILES = []


def get_version():
    return NVRTC_VERSION


def _lowered(expr):
    """A stand-in for NVRTC's mangled name of a name expression."""
    return "_Z7cudaemu" + hashlib.sha1(expr.encode()).hexdigest()[:16]


def compile_using_nvrtc(source, options=(), arch=None, filename="kern.cu", name_expressions=None,
                        log_stream=None, cache_in_memory=False, jitify=False):
    """(blob, mapping), as CuPy's: the options the caller gave plus the
    architecture and ``--device-as-default-execution-space``; compile
    errors raise CompileException at this point, as with NVRTC."""
    from . import cuda
    if jitify:
        raise _emu.CompileException("cudaemu: jitify is not emulated")
    if not name_expressions:
        raise _emu.CompileException("cudaemu: name_expressions are required (extern \"C\" "
                                    "kernels are not emulated)")
    arch = arch or cuda.Device().compute_capability
    options = tuple(options) + (f"-arch=sm_{arch}", "--device-as-default-execution-space")
    names = [str(n) for n in name_expressions]
    name = filename.rsplit("/", 1)[-1].replace(".cu", "") or "module"
    _emu.build(source, options, names, name)   # g++ now: the errors NVRTC would report
    NVRTC_COMPILES.append((filename, len(names)))
    mapping = {n: _lowered(n) for n in names}
    payload = _MAGIC + json.dumps({"source": source, "options": list(options), "names": names,
                                   "name": name, "lowered": mapping,
                                   "headers": _headers_of(options)}).encode()
    image = elf_image(payload)
    return image[:len(image) - 1], mapping   # CuPy's getCUBIN (see the module docstring)


_SECTION = b".nv.cudaemu"
_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")     # Elf64_Ehdr
_SHDR = struct.Struct("<IIQQQQIIQQ")           # Elf64_Shdr
_PHDR = struct.Struct("<IIQQQQQQ")             # Elf64_Phdr


def elf_image(payload):
    """An ELF64 little-endian image laid out as NVRTC's cubins are (header,
    section contents, section-header table, program-header table last):
    a null section, ``.shstrtab`` and ``.nv.cudaemu`` holding ``payload``;
    one PT_PHDR segment (``p_align`` 8: the image's last byte is 0)."""
    names = b"\0.shstrtab\0" + _SECTION + b"\0"
    strtab_off = _EHDR.size
    data_off = strtab_off + len(names)
    shoff = -(-(data_off + len(payload)) // 8) * 8
    phoff = shoff + 3 * _SHDR.size
    ident = b"\x7fELF" + bytes([2, 1, 1, 0x33, 7]) + bytes(7)   # ELFOSABI_CUDA, as NVRTC's
    head = _EHDR.pack(ident, 2, 190, 1, 0, phoff, shoff, 0x5a055a, _EHDR.size, _PHDR.size, 1,
                      _SHDR.size, 3, 1)                          # EM_CUDA
    shdrs = (_SHDR.pack(0, 0, 0, 0, 0, 0, 0, 0, 0, 0) +
             _SHDR.pack(1, 3, 0, 0, strtab_off, len(names), 0, 0, 1, 0) +
             _SHDR.pack(11, 1, 0, 0, data_off, len(payload), 0, 0, 1, 0))
    body = head + names + payload
    body += bytes(shoff - len(body))
    return body + shdrs + _PHDR.pack(6, 4, phoff, 0, 0, _PHDR.size, _PHDR.size, 8)


def read_image(data):
    """The ``.nv.cudaemu`` payload of an image, as the driver reads one:
    ValueError for anything but a whole ELF64 image of that layout (one
    byte short of its extent included)."""
    if len(data) < _EHDR.size or not data.startswith(b"\x7fELF") or data[4] != 2:
        raise ValueError("not an ELF64 image")
    (_, _, _, _, _, phoff, shoff, _, _, phentsize, phnum, shentsize, shnum,
     shstrndx) = _EHDR.unpack_from(data)
    extent = max(_EHDR.size, shoff + shnum * shentsize, phoff + phnum * phentsize)
    if len(data) < extent:
        raise ValueError(f"{len(data)} bytes, shorter than the ELF image's {extent} "
                         "(its header tables end there)")
    sections = [_SHDR.unpack_from(data, shoff + i * shentsize) for i in range(shnum)]
    for sec in sections:
        if sec[1] != 8 and sec[4] + sec[5] > len(data):
            raise ValueError("a section runs past the end of the image")
    strtab = sections[shstrndx]
    for sec in sections:
        start = strtab[4] + sec[0]
        if data[start:data.index(b"\0", start)] == _SECTION:
            return data[sec[4]:sec[4] + sec[5]]
    raise ValueError(f"no {_SECTION.decode()} section")


def _headers_of(options):
    """{option index: {file name: text}} of the headers in each ``-I`` folder."""
    out = {}
    for i, opt in enumerate(options):
        folder = opt[2:] if opt.startswith("-I") else None
        if folder and os.path.isdir(folder):
            out[str(i)] = {}
            for name in sorted(os.listdir(folder)):
                path = os.path.join(folder, name)
                if name.endswith(_HEADER_SUFFIXES) and os.path.isfile(path):
                    with open(path, encoding="utf-8") as fh:
                        out[str(i)][name] = fh.read()
    return out


def _with_embedded_headers(options, headers):
    """The options with each embedded ``-I`` folder replaced by a folder
    holding the blob's copy of its headers (named by their digest)."""
    options = list(options)
    for index, files in headers.items():
        i = int(index)
        digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:24]
        root = os.path.join(tempfile.gettempdir(), "cudaemu-headers")
        folder = os.path.join(root, digest)
        if not os.path.isdir(folder):
            os.makedirs(root, exist_ok=True)
            staging = tempfile.mkdtemp(prefix=".staging-", dir=root)
            for name, text in files.items():
                with open(os.path.join(staging, os.path.basename(name)), "w",
                          encoding="utf-8") as fh:
                    fh.write(text)
            try:
                os.rename(staging, folder)   # atomic: a folder is whole or absent
            except OSError:   # another process made it first, with the same contents
                shutil.rmtree(staging, ignore_errors=True)
        options[i] = "-I" + folder
    return tuple(options)


_loaded = {}     # path -> _BinaryModule (CuPy memoizes modules loaded from a path)
_loaded_lock = threading.Lock()


class _BinaryModule:
    """A module loaded from a blob file."""

    def __init__(self, path):
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError as exc:
            raise _emu.CUDADriverError(f"CUDA_ERROR_FILE_NOT_FOUND: {path} ({exc})") from None
        try:
            payload = read_image(data)
            if not payload.startswith(_MAGIC):
                raise ValueError("no cudaemu module header")
            meta = json.loads(payload[len(_MAGIC):].decode())
            options = _with_embedded_headers(meta["options"], meta["headers"])
            self.mod = _emu.Module(meta["source"], options, meta["names"], meta["name"])
            self.by_lowered = {v: k for k, v in meta["lowered"].items()}
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise _emu.CUDADriverError(f"CUDA_ERROR_INVALID_IMAGE: {path} is not a module "
                                       f"image ({type(exc).__name__}: {exc})") from None

    def stats(self):
        """The emulator's launch statistics of this module's library."""
        return self.mod.stats()


class PathModule:
    """``cupy.RawModule(path=...)``: loaded on first ``get_function`` (or
    ``compile``), memoized per path."""

    def __init__(self, path):
        self.file_path = path
        self.code = None
        self.options = ()
        self.name_expressions = None

    @property
    def module(self):
        with _loaded_lock:
            mod = _loaded.get(self.file_path)
            if mod is None:
                mod = _loaded[self.file_path] = _BinaryModule(self.file_path)
        return mod

    def compile(self, log_stream=None):
        self.module

    def get_function(self, name):
        mod = self.module
        expr = mod.by_lowered.get(name)
        if expr is None:
            raise _emu.CUDADriverError(f"CUDA_ERROR_NOT_FOUND: named symbol not found ({name!r})")
        return _emu.Kernel(mod.mod, mod.mod.names.index(expr), expr)


class RawModule(_emu.RawModule):
    """``cupy.RawModule``: ``path=`` loads a binary (here a PathModule),
    ``code=`` compiles as ``_emu.RawModule`` does."""

    def __new__(cls, *, code=None, path=None, **kwargs):
        if (code is None) == (path is None):
            raise TypeError("Exactly one of `code` and `path` keyword arguments must be given.")
        if path is not None:
            if kwargs.get("name_expressions") is not None:
                raise ValueError("need CUDA C++ code for the requested kernels")
            return PathModule(path)
        return super().__new__(cls)
