"""Every CUDA source of quantcore_gpu compiles, without a GPU.

NVRTC (``pip install nvidia-cuda-nvrtc-cu12``) compiles each ``.cu`` file
to PTX with every template instantiation the runtime launches and the
runtime's options; no driver or device is needed.  Skips when libnvrtc
cannot be loaded.  The other tests here need neither NVRTC nor cupy.
"""
import os
import subprocess
import sys

import pytest

from quantcore_gpu import kernels


def _nvrtc():
    from quantcore_gpu import compile_check as cc
    try:
        lib, _ = cc.load_nvrtc()
    except cc.NvrtcUnavailable as exc:
        pytest.skip(str(exc))
    return cc, lib


def test_every_source_compiles_with_every_name_expression():
    cc, lib = _nvrtc()
    results = cc.check_all(lib=lib, werror=True)
    failed = [r for r in results if not r.ok]
    assert not failed, "\n\n".join(f"{r.source} [{r.arch}]:\n{r.log}" for r in failed)
    assert {r.source for r in results} == set(kernels.SOURCES)
    for r in results:
        assert set(r.lowered) == set(kernels.SOURCES[r.source])
        # no flush-to-zero arithmetic (ldexpf, 0 ulp in CUDA's math API, takes
        # ex2.approx.ftz of an integer |e| < 126 only: a normal result)
        ftz = [line.strip() for line in r.ptx.splitlines()
               if ".ftz" in line and not line.strip().startswith("ex2.approx.ftz.f32")]
        assert not ftz, (r.source, r.arch, ftz[:5])


def test_compile_check_cli_reports_success(capsys):
    cc, _ = _nvrtc()
    assert cc.main(["--arch", "compute_90", "--werror"]) == 0
    out = capsys.readouterr().out
    n = len(kernels.SOURCES)
    assert f"{n} of {n} compiled" in out


def test_compile_error_is_reported_with_the_nvrtc_log():
    cc, lib = _nvrtc()
    bad = ('#include "qc_elementwise.h"\n'
           'template <typename T> __global__ void k(T *x) { x[0] = undefined_name; }\n')
    r = cc.compile_source(lib, "bad.cu", bad, kernels.compile_options(),
                          ["k<float>"], "compute_90")
    assert not r.ok
    assert "undefined_name" in r.log


def test_every_cu_file_is_compiled():
    on_disk = {f for f in os.listdir(kernels.cuda_dir()) if f.endswith(".cu")}
    assert on_disk == set(kernels.SOURCES)


def test_options_keep_the_numerical_contract():
    opts = kernels.compile_options()
    assert "--fmad=false" in opts
    assert not any("fast_math" in o or "fast-math" in o for o in opts)
    assert not any(o.startswith(("-ftz=true", "--ftz=true", "-prec-div=false",
                                 "--prec-div=false")) for o in opts)
    inc = [o[2:] for o in opts if o.startswith("-I")]
    assert inc and os.path.isfile(os.path.join(inc[0], "qc_elementwise.h"))


def test_import_needs_no_cupy():
    code = ("import sys; sys.modules['cupy'] = None\n"
            "import quantcore_gpu, quantcore_gpu.kernels, quantcore_gpu.compile_check\n"
            "ok, reason = quantcore_gpu.can_use()\n"
            "assert not ok and 'cupy' in reason, reason\n")
    subprocess.run([sys.executable, "-c", code], check=True)
