"""Issue 38: the same bits on CPU and GPU for every accepted argument.

- no library call in the device sources that NVRTC compiles to an
  approximation (``ldexpf(1, e)`` became ``ex2.approx.ftz.f32``, SASS
  ``MUFU.EX2``): powers of two are built from their bits (``qc_exp2i``);
- no shift by a count outside the type's width (x86 masks the count, PTX
  clamps it): ``num_bits`` outside ``NUM_BITS_RANGE`` is refused by the
  schemes that shift, on CPU and GPU alike, with an error naming it;
- every reduction writer fences before the last-block counter.

``make gpu-toolchain-check`` reads the real PTX / SASS of every module.
"""
import re

import numpy as np
import pytest

from quantcore import qparams as Q
from quantcore_gpu import _runtime
from quantcore_gpu.toolchain_check import device_texts
from reference import gpu_cupy

#: libm calls that NVRTC may lower to an approximate instruction (ex2 / lg2 /
#: sin / cos .approx) or whose float32 form is not correctly rounded
APPROX_CALLS = re.compile(r"\b(ldexpf?|scalbnf?|exp2f?|expf?|exp10f?|expm1f?|logf?|log2f?|"
                          r"log10f?|log1pf?|powf?|sinf?|cosf?|tanf?|tanhf?|sinhf?|coshf?|"
                          r"__expf|__logf|__powf|__sinf|__cosf|__exp10f|__log2f|__log10f)\s*\(")

BAD_BITS = [0, -1, 63, 64, 65, 2.5, True]


def _device_files():
    """{file name: text without comments} of every .cu source and the
    headers it includes."""
    out = {}
    for source in _runtime.SOURCES:
        out.update(device_texts(source))
    return out


def test_device_sources_call_no_approximated_libm_function():
    found = {name: sorted(set(m.group(1) for m in APPROX_CALLS.finditer(text)))
             for name, text in _device_files().items()}
    assert {k: v for k, v in found.items() if v} == {}


def test_every_partial_writer_of_a_last_block_reduction_fences():
    """minmax.cu: a kernel that counts blocks (qc_mm_is_last) has every
    thread that writes a part_* value fence before the count (a fence
    orders only its own thread's writes; qc_mm_is_last fences thread 0)."""
    code = _runtime.read_source("minmax.cu")
    kernels = re.split(r"\ntemplate <typename T, typename I>\n__global__", code)[1:]
    assert len(kernels) == 3
    for body in kernels:
        name = re.search(r"(qc_minmax_\w+)\(", body).group(1)
        count = body.index("qc_mm_is_last(counter)")
        writes = [m.start() for m in re.finditer(r"part_fl\[[^\]]+\] = ", body[:count])]
        assert writes, name
        for w in writes:
            guard = body[:w][body[:w].rindex("if ("):]
            if guard.startswith("if (threadIdx.x == 0)"):
                continue   # thread 0: qc_mm_is_last's own fence covers it
            block = body[w:count]
            assert "__threadfence();" in block[:block.index("}")], name


def _exp2_cases(dtype):
    e = np.arange(-1100, 1101) if dtype == np.float64 else np.arange(-160, 140)
    return e.astype(np.float64)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cambricon_step_is_the_exact_power_of_two(dtype):
    """qc_exp2i: 2**e from its bits, subnormals, the tie at the smallest
    subnormal's half (0), overflow (+inf) as ldexp."""
    e = _exp2_cases(dtype)
    got = Q.cambricon_step(e, dtype)
    with np.errstate(over="ignore"):
        want = np.ldexp(dtype(1), e.astype(np.int32)).astype(dtype)
    assert np.array_equal(np.asarray(got).view(np.uint8), want.view(np.uint8))


def _shift_calls(xp):
    lo = xp.asarray(np.array([-1.5, -3.0], np.float32))
    hi = xp.asarray(np.array([2.5, 7.0], np.float32))
    calls = [lambda b, s=s, f=f: Q.oneflow_qparams(lo, hi, b, s, f)
             for s in ("symmetric", "affine") for f in ("google", "cambricon")]
    calls.append(lambda b: Q.amax_multiplier(hi, b, False))
    calls.append(lambda b: Q.amax_multiplier(hi, b, True))
    calls += [lambda b, dt=dt: Q.pq_affine_qparams(lo, hi, b, dt)
              for dt in (np.float32, np.float64)]
    return calls


@pytest.mark.parametrize("bits", BAD_BITS)
def test_out_of_range_num_bits_is_refused_on_the_cpu(bits):
    for call in _shift_calls(np):
        with pytest.raises(ValueError, match="num_bits must be an integer in 1..62"):
            call(bits)


def test_num_bits_range_ends_are_accepted():
    lo, hi = Q.NUM_BITS_RANGE
    for call in _shift_calls(np):
        for b in (lo, hi, np.int64(8)):
            call(b)


@pytest.fixture
def cp():
    """cupy on a usable device (a GPU, or the CUDA emulator)."""
    return gpu_cupy()


@pytest.mark.gpu
@pytest.mark.parametrize("bits", BAD_BITS)
def test_out_of_range_num_bits_is_refused_on_the_gpu(cp, bits):
    for call in _shift_calls(cp):
        with pytest.raises(ValueError, match="num_bits must be an integer in 1..62"):
            call(bits)


@pytest.mark.gpu
def test_shift_schemes_and_powers_of_two_equal_the_cpu_on_the_gpu(cp):
    lo, hi = Q.NUM_BITS_RANGE
    for dev, host in zip(_shift_calls(cp), _shift_calls(np)):
        for b in (lo, 2, hi):
            for g, w in zip(dev(b), host(b)):
                assert isinstance(g, cp.ndarray)
                assert np.array_equal(g.get().view(np.uint8), np.asarray(w).view(np.uint8))
    for dtype in (np.float32, np.float64):
        e = _exp2_cases(dtype)
        g = Q.cambricon_step(cp.asarray(e), dtype)
        assert np.array_equal(g.get().view(np.uint8),
                              np.asarray(Q.cambricon_step(e, dtype)).view(np.uint8))
