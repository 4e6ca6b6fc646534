"""llama.cpp's own quantizers as a test oracle (GGUF block types, issue 39).

The oracle is ggml's C reference, ``ggml/src/ggml-quants.c`` as vendored by
the ``llama-cpp-python`` sdist on PyPI (``SDIST_VERSION``), compiled alone
(no cmake, no rest of llama.cpp) with the flags of a non-native build without
FMA contraction (``CFLAGS``) into ``build/ggml-oracle/<version>-<flags hash>/
libggmlq.so`` and called with ctypes.  Nothing of the sdist's build backend
runs: the sdist's URL and sha256 come from the index's JSON simple page (the
index pip is configured for, PyPI by default), the archive is read and only
the few headers and sources below are extracted.

Used by tests/test_gguf.py and bench/test_bench_gguf.py; ``make install``
runs ``python tests/ggml_oracle.py`` so that a fresh clone has the library.
``get()`` returns the loaded oracle, or ``None`` where it cannot be built:
the tests skip then, except under ``QC_REQUIRE_ORACLES=1`` where the error
is raised (a check that skips in CI checks nothing).

Environment: ``QC_GGML_SDIST=/path/llama_cpp_python-<version>.tar.gz`` uses
that archive instead of downloading it (its sha256 is still checked when the
index can be reached).
"""
import ctypes
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import urllib.request

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SDIST_NAME = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
#: llama.cpp as vendored by that sdist (its vendor/llama.cpp submodule,
#: read from the archive's .git/modules/vendor/llama.cpp/HEAD at build time
#: and written to build/ggml-oracle/.../llama_cpp_commit)
CFLAGS = ["-O2", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math", "-DNDEBUG",
          "-std=gnu11"]
SOURCES = ("ggml/src/ggml-quants.c", "ggml/src/ggml-quants.h", "ggml/src/ggml-common.h",
           "ggml/src/ggml-impl.h", "ggml/src/ggml-cpu/ggml-cpu-impl.h",
           "ggml/include/ggml.h", "ggml/include/gguf.h", "ggml/include/ggml-cpu.h",
           "ggml/include/ggml-backend.h", "ggml/include/ggml-alloc.h")
PREFIX = f"llama_cpp_python-{SDIST_VERSION}/vendor/llama.cpp/"

# The few symbols ggml-quants.c takes from ggml.c, written here (ggml.c pulls
# in the whole library).  Row sizes: ggml's type traits for the types tested.
STUBS = r"""
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <stdint.h>
#include "ggml.h"
void ggml_abort(const char *file, int line, const char *fmt, ...) {
    va_list ap; va_start(ap, fmt);
    fprintf(stderr, "ggml_abort %s:%d: ", file, line); vfprintf(stderr, fmt, ap);
    va_end(ap); abort();
}
static void traits(enum ggml_type t, int64_t *blck, size_t *size) {
    switch (t) {
    case GGML_TYPE_Q4_0: *blck = 32; *size = 18; return;
    case GGML_TYPE_Q4_1: *blck = 32; *size = 20; return;
    case GGML_TYPE_Q5_0: *blck = 32; *size = 22; return;
    case GGML_TYPE_Q5_1: *blck = 32; *size = 24; return;
    case GGML_TYPE_Q8_0: *blck = 32; *size = 34; return;
    case GGML_TYPE_Q2_K: *blck = 256; *size = 84; return;
    case GGML_TYPE_Q3_K: *blck = 256; *size = 110; return;
    case GGML_TYPE_Q4_K: *blck = 256; *size = 144; return;
    case GGML_TYPE_Q5_K: *blck = 256; *size = 176; return;
    case GGML_TYPE_Q6_K: *blck = 256; *size = 210; return;
    case GGML_TYPE_IQ4_NL: *blck = 32; *size = 18; return;
    case GGML_TYPE_IQ4_XS: *blck = 256; *size = 136; return;
    case GGML_TYPE_MXFP4: *blck = 32; *size = 17; return;
    default: ggml_abort(__FILE__, __LINE__, "oracle stub: type %d", (int)t);
    }
}
size_t ggml_type_size(enum ggml_type t) { int64_t b; size_t s; traits(t, &b, &s); return s; }
size_t ggml_row_size(enum ggml_type t, int64_t ne) {
    int64_t b; size_t s; traits(t, &b, &s); return s * ne / b;
}
const char *ggml_type_name(enum ggml_type t) { (void)t; return "?"; }
"""

#: quantcore type name -> (ggml's function suffix)
FUNCS = {"Q8_0": "q8_0", "Q4_0": "q4_0", "Q4_1": "q4_1", "Q5_0": "q5_0", "Q5_1": "q5_1",
         "Q2_K": "q2_K", "Q3_K": "q3_K", "Q4_K": "q4_K", "Q5_K": "q5_K", "Q6_K": "q6_K",
         "IQ4_NL": "iq4_nl", "IQ4_XS": "iq4_xs", "MXFP4": "mxfp4"}


#: a default native build of ggml (contraction on: GCC's -ffp-contract=fast
#: for GNU C, FMA from -march=native), to count the blocks that differ
NATIVE_CFLAGS = ["-O2", "-fPIC", "-shared", "-march=native", "-DNDEBUG", "-std=gnu11"]


def build_dir(cflags=None):
    cflags = CFLAGS if cflags is None else cflags
    key = hashlib.sha256(json.dumps([SDIST_VERSION, cflags, STUBS]).encode()).hexdigest()[:12]
    return os.path.join(ROOT, "build", "ggml-oracle", f"{SDIST_VERSION}-{key}")


def _index_url():
    """The index pip is configured for (PIP_INDEX_URL, pip config), else PyPI."""
    url = os.environ.get("PIP_INDEX_URL")
    if not url:
        try:
            out = subprocess.run([sys.executable, "-m", "pip", "config", "get",
                                  "global.index-url"], capture_output=True, text=True,
                                 timeout=60)
            url = out.stdout.strip() if out.returncode == 0 else ""
        except (OSError, subprocess.TimeoutExpired):
            url = ""
    return (url or "https://pypi.org/simple").rstrip("/")


def _sdist_entry():
    """(url, sha256) of the sdist, from the index's JSON simple page (PEP 691)."""
    req = urllib.request.Request(f"{_index_url()}/{SDIST_NAME}/",
                                 headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        page = json.load(resp)
    want = f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
    for f in page["files"]:
        if f["filename"] == want:
            return f["url"], f["hashes"]["sha256"]
    raise RuntimeError(f"ggml oracle: {want} is not on {_index_url()}")


def _sdist_bytes():
    local = os.environ.get("QC_GGML_SDIST")
    if local:
        with open(local, "rb") as fh:
            return fh.read()
    url, sha = _sdist_entry()
    with urllib.request.urlopen(url, timeout=300) as resp:
        data = resp.read()
    if hashlib.sha256(data).hexdigest() != sha:
        raise RuntimeError(f"ggml oracle: sha256 of {url} does not match the index's")
    return data


def sdist_path():
    """The sdist itself (its sha256 checked) under build/ggml-oracle, written
    once: what ``make llama-cpp-check`` builds llama-cpp-python from."""
    path = os.path.join(ROOT, "build", "ggml-oracle", f"llama_cpp_python-{SDIST_VERSION}.tar.gz")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as fh:
            fh.write(_sdist_bytes())
        os.replace(tmp, path)
    return path


def extract(root, keep):
    """Write under ``root`` the sdist's llama.cpp files whose path relative to
    ``vendor/llama.cpp/`` ``keep(path)`` accepts, in one pass over the
    stream: (the set of those paths, llama.cpp's commit or "unknown")."""
    written, commit = set(), "unknown"
    head = f"llama_cpp_python-{SDIST_VERSION}/.git/modules/vendor/llama.cpp/HEAD"
    with tarfile.open(fileobj=io.BytesIO(_sdist_bytes()), mode="r:gz") as tar:
        for member in tar:
            if member.name == head:
                commit = tar.extractfile(member).read().decode().strip()
                continue
            rel = member.name[len(PREFIX):] if member.name.startswith(PREFIX) else None
            if rel and member.isfile() and keep(rel):
                dest = os.path.join(root, rel)
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                with open(dest, "wb") as fh:
                    fh.write(tar.extractfile(member).read())
                written.add(rel)
    return written, commit


def build(cflags=None):
    """Download, extract and compile the oracle if missing; its .so path
    (``cflags``: another build's flags, e.g. NATIVE_CFLAGS)."""
    cflags = CFLAGS if cflags is None else cflags
    out = build_dir(cflags)
    lib = os.path.join(out, "libggmlq.so")
    if os.path.exists(lib):
        return lib
    tmp = out + f".tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        _build_in(tmp, cflags)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    try:
        os.replace(tmp, out)
    except OSError:  # another process built it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
        if not os.path.exists(lib):
            raise
    return lib


def _build_in(tmp, cflags):
    """Extract the sources into ``tmp`` and compile libggmlq.so there."""
    written, commit = extract(tmp, set(SOURCES).__contains__)
    if written != set(SOURCES):
        raise RuntimeError(f"ggml oracle: the sdist lacks {sorted(set(SOURCES) - written)}")
    with open(os.path.join(tmp, "stubs.c"), "w") as fh:
        fh.write(STUBS)
    with open(os.path.join(tmp, "llama_cpp_commit"), "w") as fh:
        fh.write(commit + "\n")
    cc = os.environ.get("CC", "cc")
    cmd = [cc] + cflags + ["-Iggml/include", "-Iggml/src", "ggml/src/ggml-quants.c",
                           "stubs.c", "-o", "libggmlq.so", "-lm"]
    res = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"ggml oracle: compile failed: {' '.join(cmd)}\n{res.stderr}")


class Oracle:
    """ggml's quantize / dequantize entry points through ctypes."""

    def __init__(self, path):
        self.path = path
        self.lib = ctypes.CDLL(path)
        with open(os.path.join(os.path.dirname(path), "llama_cpp_commit")) as fh:
            self.commit = fh.read().strip()
        for name in FUNCS.values():
            q = getattr(self.lib, f"quantize_{name}")
            q.restype = ctypes.c_size_t
            q.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                          ctypes.c_void_p]
            d = getattr(self.lib, f"dequantize_row_{name}")
            d.restype = None
            d.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]

    def quantize(self, type_name, rows, imatrix=None, row_bytes=None):
        """``quantize_<type>(src, dst, nrow, n_per_row, imatrix)``: what
        ``ggml_quantize_chunk`` (llama-quantize) calls, as bytes."""
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        n = rows.shape[-1]
        nrow = rows.size // n if n else 0
        dst = np.zeros(nrow * row_bytes, np.uint8)
        qw = None
        if imatrix is not None:
            imatrix = np.ascontiguousarray(imatrix, dtype=np.float32)
            qw = imatrix.ctypes.data
        fn = getattr(self.lib, f"quantize_{FUNCS[type_name]}")
        size = fn(rows.ctypes.data, dst.ctypes.data, nrow, n, qw)
        assert size == dst.size, (size, dst.size)
        return dst.tobytes()

    def dequantize(self, type_name, data, n):
        """``dequantize_row_<type>(blocks, out, n)``: n float32 values."""
        src = np.frombuffer(bytes(data), np.uint8).copy()
        out = np.empty(n, np.float32)
        getattr(self.lib, f"dequantize_row_{FUNCS[type_name]}")(src.ctypes.data,
                                                                 out.ctypes.data, n)
        return out


_ORACLE = []


def get():
    """The oracle, built on first use; None where it cannot be (the error
    raised instead under QC_REQUIRE_ORACLES=1)."""
    if not _ORACLE:
        try:
            _ORACLE.append(Oracle(build()))
        except Exception:
            if os.environ.get("QC_REQUIRE_ORACLES") == "1":
                raise
            _ORACLE.append(None)
    return _ORACLE[0]


# -- llama.cpp's converter (convert_hf_to_gguf.py) as the oracle of GGUF files --
#: what of the sdist the converter needs (its vendored gguf-py first on sys.path)
CONVERTER_PARTS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/gguf/")
#: run in a subprocess: two patches, each what the converter does where the
#: test's tiny model differs from a released one: a tokenizer.model missing is
#: FileNotFoundError before sentencepiece is imported (with sentencepiece
#: installed the converter raises the same), and the tiny BPE tokenizer's
#: probe hash, which no released model has, is named (QC_TOKENIZER_PRE)
_CONVERTER_MAIN = r"""
import os, runpy, sys
root = sys.argv.pop(1)
sys.path[:0] = [os.path.join(root, "gguf-py"), root]
import conversion.base as B
pre = os.environ.get("QC_TOKENIZER_PRE")
if pre:
    B.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
_spm = B.TextModel._create_vocab_sentencepiece
def _create_vocab_sentencepiece(self):
    if not (self.dir_model / "tokenizer.model").is_file():
        raise FileNotFoundError(f"File not found: {self.dir_model / 'tokenizer.model'}")
    return _spm(self)
B.TextModel._create_vocab_sentencepiece = _create_vocab_sentencepiece
jobs = sys.argv[1:]
for model, outtype, outfile in zip(jobs[::3], jobs[1::3], jobs[2::3]):  # torch imported once
    sys.argv = [os.path.join(root, "convert_hf_to_gguf.py"), model, "--outtype", outtype,
                "--outfile", outfile]
    runpy.run_path(sys.argv[0], run_name="__main__")
"""


def converter_dir():
    """The sdist's converter, extracted once into build/ggml-oracle/converter-<version>/."""
    out = os.path.join(ROOT, "build", "ggml-oracle", f"converter-{SDIST_VERSION}")
    if os.path.exists(os.path.join(out, "convert_hf_to_gguf.py")):
        main = os.path.join(out, "qc_main.py")
        with open(main) as fh:
            if fh.read() != _CONVERTER_MAIN:  # the wrapper of an older checkout
                with open(main + f".tmp{os.getpid()}", "w") as fo:
                    fo.write(_CONVERTER_MAIN)
                os.replace(main + f".tmp{os.getpid()}", main)
        return out
    tmp = out + f".tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        extract(tmp, lambda rel: rel.startswith(CONVERTER_PARTS))
        with open(os.path.join(tmp, "qc_main.py"), "w") as fh:
            fh.write(_CONVERTER_MAIN)
        if not os.path.exists(os.path.join(tmp, "convert_hf_to_gguf.py")):
            raise RuntimeError("ggml oracle: the sdist lacks convert_hf_to_gguf.py")
        try:
            os.replace(tmp, out)
        except OSError:  # another process extracted it meanwhile
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def convert_hf(jobs, tokenizer_pre=None):
    """Run the sdist's ``convert_hf_to_gguf.py MODEL_DIR --outtype T --outfile
    F`` for each ``(MODEL_DIR, T, F)`` of ``jobs`` (one subprocess of this
    Python); raise with its output on failure."""
    root = converter_dir()
    env = dict(os.environ)
    if tokenizer_pre:
        env["QC_TOKENIZER_PRE"] = tokenizer_pre
    args = [os.fspath(a) for job in jobs for a in job]
    res = subprocess.run([sys.executable, os.path.join(root, "qc_main.py"), root] + args,
                         capture_output=True, text=True, env=env)
    if res.returncode:
        raise RuntimeError(f"convert_hf_to_gguf.py failed:\n{res.stdout[-2000:]}"
                           f"{res.stderr[-4000:]}")
    return [f for _, _, f in jobs]


if __name__ == "__main__":
    print(build())
