"""quantcore_gpu's own compile and its on-disk kernel cache.

The cache tests need neither cupy nor NVRTC (a stand-in compile); the real
NVRTC (``nvidia-cuda-nvrtc-cu12``) compiles a cubin with the project's
options when it is there.  Tests marked ``gpu`` run the real kernels.py
path on a device or on the CUDA emulator (``make gpu-emu-test``), whose
fake ``cupy.cuda.compiler.compile_using_nvrtc`` / ``RawModule(path=)``
stand for NVRTC and the driver.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import threading
import warnings

import numpy as np
import pytest

from quantcore_gpu import _runtime, cache, kernels
from test_gpu_compile import _nvrtc as nvrtc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMES = ("k<float>", "k<double>")


def elf(payload=b"binary", sections_last=False):
    """A whole little-endian ELF64 image as NVRTC lays out a cubin: header,
    section contents, section-header table, program-header table last (its
    final byte the high byte of p_align: 0).  ``sections_last``: the
    contents after both tables (the extent is then a section's end)."""
    ehdr, shdr, phdr = struct.Struct("<16sHHIQQQIHHHHHH"), struct.Struct("<IIQQQQIIQQ"), \
        struct.Struct("<IIQQQQQQ")
    shoff = 64
    phoff = shoff + 2 * shdr.size
    data_off = phoff + phdr.size if sections_last else 64
    if not sections_last:
        shoff = -(-(64 + len(payload)) // 8) * 8
        phoff = shoff + 2 * shdr.size
    head = ehdr.pack(b"\x7fELF" + bytes([2, 1, 1, 0x33, 7]) + bytes(7), 2, 190, 1, 0, phoff,
                     shoff, 0, 64, phdr.size, 1, shdr.size, 2, 0)
    tables = shdr.pack(*[0] * 10) + shdr.pack(1, 1, 0, 0, data_off, len(payload), 0, 0, 1, 0)
    tables += phdr.pack(6, 4, phoff, 0, 0, phdr.size, phdr.size, 8)
    if sections_last:
        return head + tables + payload
    body = head + payload
    return body + bytes(shoff - len(body)) + tables


class Compiler:
    """A stand-in compile_fn that counts its calls."""

    def __init__(self, binary=elf()):
        self.binary, self.calls = binary, 0

    def __call__(self):
        self.calls += 1
        return self.binary, {n: f"_Z{i}k" for i, n in enumerate(NAMES)}


FIELDS = {"source": "k.cu", "group": "i32", "files": {"k.cu": "00"}, "options": ["-a"],
          "names": list(NAMES), "target": {"nvrtc": [12, 9], "cc": "90"}}


def entry_files(folder):
    key = cache.key_of(FIELDS)
    meta = os.path.join(folder, key + ".json")
    with open(meta) as fh:
        binary = os.path.join(folder, json.load(fh)["binary"])
    return meta, binary


def test_second_call_loads_and_first_compiles(tmp_path):
    comp = Compiler()
    first = cache.get_module(FIELDS, NAMES, comp, folder=str(tmp_path))
    second = cache.get_module(FIELDS, NAMES, comp, folder=str(tmp_path))
    assert (first.compiled, second.compiled, comp.calls) == (True, False, 1)
    assert second.lowered == first.lowered == {"k<float>": "_Z0k", "k<double>": "_Z1k"}
    with open(second.path, "rb") as fh:
        assert fh.read() == comp.binary
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p) for p in entry_files(
        str(tmp_path)))   # no temporary files left


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "delete"])
def test_corrupt_binary_is_recompiled(tmp_path, damage):
    comp = Compiler()
    cache.get_module(FIELDS, NAMES, comp, folder=str(tmp_path))
    _, binary = entry_files(str(tmp_path))
    data = open(binary, "rb").read()
    if damage == "delete":
        os.unlink(binary)
    else:
        with open(binary, "wb") as fh:
            fh.write({"flip": bytes([data[0] ^ 1]) + data[1:], "truncate": data[:-3],
                      "empty": b""}[damage])
    again = cache.get_module(FIELDS, NAMES, comp, folder=str(tmp_path))
    assert again.compiled and comp.calls == 2
    assert open(again.path, "rb").read() == comp.binary
    assert not cache.get_module(FIELDS, NAMES, comp, folder=str(tmp_path)).compiled


@pytest.mark.parametrize("edit", [
    lambda m: m.update(format=0),                               # another layout
    lambda m: m["fields"]["target"].update(nvrtc=[11, 8]),      # another NVRTC's entry
    lambda m: m.update(key="0" * 64),
    lambda m: m["lowered"].pop("k<float>"),
    lambda m: m["lowered"].update({"k<float>": 7}),
    lambda m: m.update(binary="../elsewhere.bin"),
    lambda m: m.update(size="12"),
    lambda m: m.clear(),
    "garbage", "truncated json"],
    ids=["format", "foreign_nvrtc", "key", "lowered_missing", "lowered_type", "path_escape",
         "size_type", "empty", "garbage", "truncated"])
def test_foreign_or_corrupt_metadata_is_recompiled(tmp_path, edit):
    comp = Compiler()
    cache.get_module(FIELDS, NAMES, comp, folder=str(tmp_path))
    meta, _ = entry_files(str(tmp_path))
    text = open(meta).read()
    if edit == "garbage":
        text = "\x00\xff not json"
    elif edit == "truncated json":
        text = text[:len(text) // 2]
    else:
        m = json.loads(text)
        edit(m)
        text = json.dumps(m)
    with open(meta, "w", encoding="latin-1") as fh:
        fh.write(text)
    n = len(cache.REJECTED)
    again = cache.get_module(FIELDS, NAMES, comp, folder=str(tmp_path))
    assert again.compiled and comp.calls == 2
    assert len(cache.REJECTED) == n + 1
    assert not cache.get_module(FIELDS, NAMES, comp, folder=str(tmp_path)).compiled


def test_every_field_is_in_the_key(tmp_path):
    comp = Compiler()
    cache.get_module(FIELDS, NAMES, comp, folder=str(tmp_path))
    for name, value in (("options", ["-a", "-ftz=true"]), ("files", {"k.cu": "01"}),
                        ("target", {"nvrtc": [12, 8], "cc": "90"}),
                        ("target", {"nvrtc": [12, 9], "cc": "80"}), ("group", "i64")):
        other = dict(FIELDS, **{name: value})
        assert cache.key_of(other) != cache.key_of(FIELDS)
        assert cache.get_module(other, NAMES, comp, folder=str(tmp_path)).compiled


# ------------------------------------------- whole cubins (issue 38)

def test_elf_extent_is_the_end_of_the_furthest_table_or_section():
    img = elf(b"x" * 37)
    assert cache.elf_extent(img) == len(img) and img[-1] == 0
    last = elf(b"y" * 37, sections_last=True)
    assert cache.elf_extent(last) == len(last) and last[-1:] == b"y"
    assert cache.elf_extent(img[:-1]) == len(img)     # (header fields, not the data's length)
    assert cache.elf_extent(last[:-5]) == len(last)
    assert cache.elf_extent(b"//\n.version 8.8\n.target sm_90\n") is None   # PTX
    with pytest.raises(ValueError, match="cut short"):
        cache.elf_extent(b"\x7fELF\x02\x01\x01" + bytes(20))


def test_whole_image_completes_the_byte_cupys_getcubin_strips():
    """CuPy's nvrtc.getCUBIN returns NVRTC's cubin minus its last byte
    (cupy_backends/cuda/libs/nvrtc.pyx: cubin_ptr[:cubinSizeRet-1]): the
    image handed to the driver is completed to NVRTC's bytes; a cubin short
    by more is truncated and refused; PTX and whole images are unchanged."""
    img = elf(b"kernel bytes")
    assert cache.whole_image(img[:-1]) == img
    assert cache.whole_image(img) == img
    assert cache.whole_image(bytearray(img[:-1])) == img
    with pytest.raises(ValueError, match="truncated"):
        cache.whole_image(img[:-2])
    ptx = b".version 8.8\n.target sm_90\n"
    assert cache.whole_image(ptx) == ptx


def test_a_short_cubin_is_never_stored_nor_trusted(tmp_path):
    """An entry whose binary is shorter than its ELF image (a format-1
    entry of CuPy's bytes, its size and hash recorded as they are) is a
    miss; store refuses to write one."""
    img = elf(b"k" * 100)
    with pytest.raises(ValueError, match="shorter than its ELF image"):
        cache.DiskCache(str(tmp_path)).store(cache.key_of(FIELDS), FIELDS, img[:-1],
                                             {n: "_Z" for n in NAMES})
    assert os.listdir(tmp_path) == []
    comp = Compiler(img)
    cache.get_module(FIELDS, NAMES, comp, folder=str(tmp_path))
    meta, binary = entry_files(str(tmp_path))
    with open(binary, "wb") as fh:
        fh.write(img[:-1])
    import hashlib
    m = json.loads(open(meta).read())
    m.update(size=len(img) - 1, sha256=hashlib.sha256(img[:-1]).hexdigest())
    with open(meta, "w") as fh:
        json.dump(m, fh)
    n = len(cache.REJECTED)
    again = cache.get_module(FIELDS, NAMES, comp, folder=str(tmp_path))
    assert again.compiled and comp.calls == 2 and open(again.path, "rb").read() == img
    assert "shorter than its ELF image" in cache.REJECTED[n][1]
    assert cache.FORMAT >= 2   # format-1 entries (short cubins) are other-format misses


def test_write_atomic_fsyncs_before_the_rename(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append("replace"),
                                                     real_replace(a, b))[1])
    cache._write_atomic(str(tmp_path / "f"), b"data")
    assert events == ["fsync", "replace"] and (tmp_path / "f").read_bytes() == b"data"


def copy_sources(tmp_path):
    cuda, inc = tmp_path / "cuda", tmp_path / "include"
    shutil.copytree(kernels.cuda_dir(), cuda)
    shutil.copytree(kernels.include_dir(), inc, ignore=shutil.ignore_patterns("*.so"))
    return str(cuda), str(inc)


def test_key_changes_when_an_included_header_changes(tmp_path):
    cuda, inc = copy_sources(tmp_path)

    def files():
        with open(os.path.join(cuda, "qparams.cu")) as fh:
            return cache.closure("qparams.cu", fh.read(), (cuda, inc))
    before = files()
    # qparams.cu -> qc_qparams.h -> qc_elementwise.h -> qc_core.h
    assert {"qparams.cu", "qc_qparams.h", "qc_elementwise.h", "qc_core.h"} <= set(before)
    assert "qc_omp.h" not in before
    with open(os.path.join(inc, "qc_omp.h"), "a") as fh:   # not included: same key
        fh.write("\n// edited\n")
    assert files() == before
    with open(os.path.join(inc, "qc_core.h"), "a") as fh:  # included indirectly
        fh.write("\n// edited\n")
    after = files()
    assert after["qc_core.h"] != before["qc_core.h"]
    fields = dict(FIELDS, files=before)
    assert cache.key_of(dict(fields, files=after)) != cache.key_of(fields)


def test_every_quoted_include_of_the_sources_is_hashed():
    import re
    for source in kernels.SOURCES:
        code = kernels.read_source(source)
        files = cache.closure(source, code, (kernels.cuda_dir(), kernels.include_dir()))
        assert set(re.findall(r'#include "([^"]+)"', code)) <= set(files), source
        assert all(len(v) == 64 for v in files.values())
    assert "qc_core.h" in cache.closure("minmax.cu", kernels.read_source("minmax.cu"),
                                        (kernels.cuda_dir(), kernels.include_dir()))


def test_a_failed_write_leaves_no_entry_and_no_temporary(tmp_path, monkeypatch):
    """A write that dies half way (disk full, killed) leaves the old state:
    the entry is absent, not half written, and its temporary is removed;
    the call still gives a usable module (kept for the process)."""
    comp = Compiler(b"x" * 10000)
    real_replace = os.replace

    def failing_replace(src, dst):
        if str(dst).startswith(str(tmp_path)):
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)
    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.warns(RuntimeWarning, match="cannot be written"):
        cache._warned.clear()
        e = cache.get_module(FIELDS, NAMES, comp, folder=str(tmp_path))
    assert e.compiled and os.path.dirname(e.path) != str(tmp_path)
    assert open(e.path, "rb").read() == comp.binary
    assert os.listdir(tmp_path) == []
    monkeypatch.setattr(os, "replace", real_replace)
    assert cache.get_module(FIELDS, NAMES, comp, folder=str(tmp_path)).compiled
    assert not cache.get_module(FIELDS, NAMES, comp, folder=str(tmp_path)).compiled


def test_concurrent_writers_and_readers_never_see_half_an_entry(tmp_path):
    """Writers of one key race readers: a reader finds no entry or a whole
    one, never a partial file (it would be 'rejected')."""
    n = len(cache.REJECTED)
    comp = Compiler(os.urandom(1 << 20))
    errors = []

    def writer():
        for _ in range(5):
            cache.DiskCache(str(tmp_path)).store(cache.key_of(FIELDS), FIELDS, comp.binary,
                                                 comp()[1])

    def reader():
        for _ in range(40):
            found = cache.DiskCache(str(tmp_path)).load(cache.key_of(FIELDS), FIELDS, NAMES)
            if found is not None and open(found[0], "rb").read() != comp.binary:
                errors.append("wrong bytes")
    threads = [threading.Thread(target=f) for f in (writer, writer, reader, reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(cache.REJECTED) == n


def test_cache_folder_setting(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANTCORE_KERNEL_CACHE", str(tmp_path / "k"))
    assert cache.cache_dir() == str(tmp_path / "k")
    monkeypatch.setenv("QUANTCORE_KERNEL_CACHE", "off")
    assert cache.cache_dir() is None
    comp = Compiler()
    first = cache.get_module(FIELDS, NAMES, comp)   # disabled: kept for this process only
    assert first.compiled and os.path.isfile(first.path)
    assert cache.get_module(FIELDS, NAMES, comp).compiled
    monkeypatch.delenv("QUANTCORE_KERNEL_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.cache_dir() == str(tmp_path / "xdg" / "quantcore" / "kernels")


def test_module_groups_split_the_64_bit_index_kernels():
    for source, names in kernels.SOURCES.items():
        groups = kernels.module_groups(source)
        assert sorted(groups["i32"] + groups.get("i64", ())) == sorted(names)
        assert all("unsigned long long" not in n for n in groups["i32"])
        assert all("unsigned long long" in n for n in groups.get("i64", ()))
    assert "i64" in kernels.module_groups("fake_quant.cu")


def test_options_state_the_numerical_contract():
    opts = kernels.compile_options()
    for o in ("--ftz=false", "--prec-div=true", "--prec-sqrt=true", "--fmad=false",
              "-std=c++17"):
        assert o in opts
    assert not any("fast_math" in o or "fast-math" in o for o in opts)


# ------------------------------------------------------ the real NVRTC, no GPU

def test_real_nvrtc_cubin_is_cached_with_the_projects_options(tmp_path):
    """exact.cu's 32-bit group compiled by NVRTC to an sm_90 cubin with
    exactly compile_options(): no flush-to-zero instruction in its PTX (with
    CuPy's ``-ftz=true`` appended there are dozens); cached, then loaded."""
    cc, lib = nvrtc()
    names = kernels.module_groups("exact.cu")["i32"]
    code = kernels.read_source("exact.cu")
    results = []

    def compile_fn():
        r = cc.compile_source(lib, "exact.cu", code, kernels.compile_options(), names, "sm_90")
        assert r.ok, r.log
        results.append(r)
        return r.cubin, r.lowered
    fields = dict(kernels.module_fields("exact.cu", "i32", {"nvrtc": list(cc.nvrtc_version(lib)),
                                                            "cc": "90"}))
    e = cache.get_module(fields, names, compile_fn, folder=str(tmp_path))
    assert e.compiled and open(e.path, "rb").read()[:4] == b"\x7fELF"
    assert results[0].ptx.count(".ftz") == 0
    assert set(e.lowered) == set(names) and all(v.startswith("_Z") for v in e.lowered.values())
    flushed = cc.compile_source(lib, "exact.cu", code, kernels.compile_options() + ("-ftz=true",),
                                names, "sm_90")
    assert flushed.ptx.count(".ftz") > 10
    again = cache.get_module(fields, names, compile_fn, folder=str(tmp_path))
    assert not again.compiled and again.lowered == e.lowered and len(results) == 1


# ------------------------------------------------ kernels.py on a device / emulator

@pytest.fixture
def cp(tmp_path, monkeypatch):
    """cupy (a GPU or the emulator) with kernels.py's in-process tables
    empty and the disk cache in tmp_path."""
    cp = pytest.importorskip("cupy")
    import quantcore_gpu
    ok, reason = quantcore_gpu.can_use()
    if not ok:
        pytest.skip(reason)
    monkeypatch.setenv("QUANTCORE_KERNEL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(_runtime, "_modules", {})
    monkeypatch.setattr(_runtime, "_functions", {})
    return cp


def last_log(n=1):
    return [(s, g, how) for _, s, g, how, _ in kernels.MODULE_LOG[-n:]]


def minmax_lo(cp):
    x = cp.asarray(np.array([2.0 ** -140, 1, 3], np.float32))
    lo, hi, _ = kernels.minmax(x)
    return lo.get(), hi.get()


@pytest.mark.gpu
def test_kernels_never_compile_through_rawmodule_code(cp, monkeypatch):
    """RawModule(code=...) appends -ftz=true (CuPy): kernels.py must not use it."""
    real = cp.RawModule

    def guarded(*args, **kwargs):
        if "code" in kwargs or args:
            raise AssertionError("RawModule(code=...) used")
        return real(*args, **kwargs)
    monkeypatch.setattr(cp, "RawModule", guarded)
    lo, hi = minmax_lo(cp)
    assert lo == np.float32(2.0 ** -140) and hi == 3
    assert last_log() == [("minmax.cu", "i32", "compiled")]


@pytest.mark.gpu
def test_64_bit_index_kernels_compile_on_first_need(cp, monkeypatch):
    minmax_lo(cp)
    assert ("minmax.cu", "i64") not in {(s, g) for _, s, g, _, _ in kernels.MODULE_LOG[-1:]}
    assert {g for (_, s, g) in _runtime._modules if s == "minmax.cu"} == {"i32"}
    monkeypatch.setattr(_runtime, "FORCE_INDEX64", True)
    assert minmax_lo(cp)[1] == 3
    assert last_log() == [("minmax.cu", "i64", "compiled")]


@pytest.mark.gpu
def test_corrupt_and_foreign_entries_are_recompiled_in_process(cp, monkeypatch, tmp_path):
    minmax_lo(cp)
    folder = tmp_path / "cache"
    (meta,) = [p for p in os.listdir(folder) if p.endswith(".json")]
    binary = folder / json.loads((folder / meta).read_text())["binary"]
    data = binary.read_bytes()
    binary.write_bytes(data[: len(data) // 2])            # truncated
    monkeypatch.setattr(_runtime, "_modules", {})
    monkeypatch.setattr(_runtime, "_functions", {})
    assert minmax_lo(cp)[1] == 3
    assert last_log() == [("minmax.cu", "i32", "compiled")]
    # a foreign binary with a matching hash (e.g. from another driver): the
    # loader refuses it, the module is compiled again
    m = json.loads((folder / meta).read_text())
    bogus = elf(b"not this device's image")   # whole, but no module the driver knows
    (folder / m["binary"]).write_bytes(bogus)
    import hashlib
    m.update(size=len(bogus), sha256=hashlib.sha256(bogus).hexdigest())
    (folder / meta).write_text(json.dumps(m))
    monkeypatch.setattr(_runtime, "_modules", {})
    monkeypatch.setattr(_runtime, "_functions", {})
    n = len(cache.REJECTED)
    if hasattr(cp, "NVRTC_COMPILES"):   # (the emulator's loader memoizes paths, as CuPy's)
        from cupy import _binary
        monkeypatch.setattr(_binary, "_loaded", {})
    assert minmax_lo(cp)[1] == 3
    assert last_log() == [("minmax.cu", "i32", "compiled")]
    assert cache.REJECTED[n:] and "refused" in cache.REJECTED[-1][1]


@pytest.mark.gpu
def test_the_driver_gets_the_whole_cubin_and_the_key_names_cupys_choices(cp, tmp_path):
    """CuPy's compile_using_nvrtc returns the cubin one byte short of its
    ELF image (the emulator strips it as CuPy's getCUBIN does): the cached
    file the driver loads covers the whole extent, and the entry's key
    records CuPy's version, the options it adds, NVRTC's library and the
    target CuPy chose."""
    from cupy.cuda import compiler
    names = kernels.module_groups("lsq.cu")["i32"]
    raw, _ = compiler.compile_using_nvrtc(kernels.read_source("lsq.cu"),
                                          kernels.compile_options(), filename="lsq.cu",
                                          name_expressions=names)
    assert raw[:4] == b"\x7fELF" and cache.elf_extent(raw) == len(raw) + 1
    minmax_lo(cp)
    folder = tmp_path / "cache"
    (meta,) = [json.loads((folder / p).read_text()) for p in os.listdir(folder)
               if p.endswith(".json")]
    data = (folder / meta["binary"]).read_bytes()
    assert cache.elf_extent(data) == len(data) == meta["size"]
    target = meta["fields"]["target"]
    cc = str(cp.cuda.Device().compute_capability)
    assert target["cupy"] == cp.__version__ and target["cc"] == cc
    assert target["cupy_adds"][:2] == [f"-arch=sm_{cc}", "--device-as-default-execution-space"]
    assert target["kind"] == "cubin" and "nvrtc_library" in target


SECOND_PROCESS = """
import json, numpy as np, cupy as cp
from quantcore_gpu import kernels as K
x = cp.asarray(np.array([2.0 ** -140, 1, 3], np.float32))
lo, hi, _ = K.minmax(x)
g = cp.asarray(np.linspace(-1, 1, 1000).astype(np.float32))
y = cp.empty_like(g)
K.ste(g, cp.asarray((np.arange(1000) % 2).astype(np.uint8)), y)
assert float(y[1].get()) == float(g[1].get()) and float(y[0].get()) == 0.0
print(json.dumps({"log": [(s, g, how) for _, s, g, how, _ in K.MODULE_LOG],
                  "nvrtc": len(getattr(cp, "NVRTC_COMPILES", [])), "lo": float(lo.get())}))
"""


@pytest.mark.gpu
def test_a_second_process_loads_and_does_not_compile(cp, tmp_path):
    env = dict(os.environ, QUANTCORE_KERNEL_CACHE=str(tmp_path / "cache"))
    env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [ROOT])

    def run():
        out = subprocess.run([sys.executable, "-c", SECOND_PROCESS], env=env, check=True,
                             capture_output=True, text=True).stdout
        return json.loads(out.strip().splitlines()[-1])
    first, second = run(), run()
    assert first["lo"] == second["lo"] == float(np.float32(2.0 ** -140))
    assert sorted(first["log"]) == [["fake_quant.cu", "i32", "compiled"],
                                    ["minmax.cu", "i32", "compiled"]]
    assert sorted(second["log"]) == [["fake_quant.cu", "i32", "loaded"],
                                     ["minmax.cu", "i32", "loaded"]]
    if hasattr(cp, "NVRTC_COMPILES"):
        assert (first["nvrtc"], second["nvrtc"]) == (2, 0)


@pytest.mark.gpu
def test_reduction_counter_is_per_thread_under_per_thread_default_streams(cp, monkeypatch):
    """CUPY_CUDA_PER_THREAD_DEFAULT_STREAM=1: every thread's current stream
    has one ``ptr``, but two threads' reductions run concurrently: they
    must not share the last-block counter."""
    monkeypatch.setenv("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM", "1")
    got = {}

    def work(i):
        got[i] = (cp.cuda.get_current_stream().ptr, kernels._counter(), kernels._counter())
    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (p0, a0, b0), (p1, a1, b1) = got[0], got[1]
    assert p0 == p1            # (the situation: one pointer for both threads)
    assert a0 is b0 and a1 is b1
    assert a0 is not a1


@pytest.mark.gpu
def test_concurrent_reductions_in_threads_give_the_right_results(cp, monkeypatch):
    """Reductions from 4 threads at once (per-thread default streams)."""
    monkeypatch.setenv("CUPY_CUDA_PER_THREAD_DEFAULT_STREAM", "1")
    rng = np.random.default_rng(3)
    data = [rng.normal(size=20000).astype(np.float32) for _ in range(4)]
    kernels.minmax(cp.asarray(data[0]))  # (compile first)
    bad = []

    def work(i):
        x = cp.asarray(data[i])
        for _ in range(3):
            lo, hi, _ = kernels.minmax(x)
            if (lo.get(), hi.get()) != (data[i].min(), data[i].max()):
                bad.append(i)
    with warnings.catch_warnings():
        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not bad


@pytest.mark.gpu
def test_a_binary_loads_after_its_source_tree_is_gone(cp, tmp_path):
    """A cached binary is self-contained (a cubin is): one compiled from a
    clone that was deleted since (a cache shared by two clones) still
    loads and runs.  On the emulator the blob carries its headers."""
    if not hasattr(cp, "NVRTC_COMPILES"):
        pytest.skip("the emulator's blob format (a real cubin holds no paths)")
    from cupy.cuda import compiler
    include = tmp_path / "include"
    include.mkdir()
    (include / "twice.h").write_text("__device__ inline float twice(float v) { return v + v; }\n")
    source = ('#include "twice.h"\n'
              'template <typename T> __global__ void k(T *y) { y[0] = twice(y[0]); }\n')
    options = ("-I" + str(include), "--fmad=false", "-std=c++17")
    blob, lowered = compiler.compile_using_nvrtc(source, options, name_expressions=["k<float>"])
    path = tmp_path / "k.bin"
    path.write_bytes(cache.whole_image(blob))   # (CuPy's bytes are one short: refused)
    import shutil
    shutil.rmtree(include)
    mod = cp.RawModule(path=str(path))
    y = cp.asarray(np.array([1.5], np.float32))
    mod.get_function(lowered["k<float>"])((1,), (1,), (y,))
    assert float(y.get()[0]) == 3.0
