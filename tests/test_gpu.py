"""CPU vs GPU: every quantcore_gpu kernel gives the CPU kernel's bits.

Each GPU kernel of ``quantcore_gpu.kernels`` is called with the same
parameters as its twin in ``quantcore._cpu._kernels`` on the same input
(NaN, +-inf, -0.0 / +0.0, exact ties and their neighbours, values far out
of range, subnormals), per tensor and per channel on every axis (including
the inner == 1 "rowvec" layout), aligned and unaligned, odd sizes, 32- and
64-bit indexing, and the fused observer + fake-quant path against the CPU
FakeQuantize.  Outputs are compared as raw bits.

Needs cupy and a CUDA device, or the CUDA emulator (``make gpu-emu-test``,
which runs the real kernels on the CPU; there the largest sizes are cut to
~1e5 elements): skipped otherwise.  NaN lanes are compared as "both NaN"
(CUDA's float operations return the NaN 0x7fffffff, x86's 0x7fc00000 with
an operand-dependent sign); every other lane bit for bit.
"""
import warnings

import numpy as np
import pytest

from quantcore import FakeQuantize, ops
from quantcore import qparams as Q
from quantcore._cpu import _kernels as K
from quantcore.observers import MinMaxObserver, MovingAverageMinMaxObserver
from quantcore_gpu import kernels as G
from reference import assert_bits_equal, gpu_cupy

cp = gpu_cupy()

pytestmark = pytest.mark.gpu

#: the CUDA emulator runs ~15-19 ns per element and ~0.5 ms per block
EMULATED = cp.__version__.endswith("+cudaemu")
BIG = 100_003 if EMULATED else 1_000_003

DTYPES = [np.float32, np.float64]
SIZES = [1, 2, 3, 4, 5, 7, 17, 255, 1000, 65537, BIG]
# (shape, axis): per-channel layouts, incl. inner == 1 with C < and > 256
CHANNEL_CASES = [
    ((7, 5, 33), 0), ((7, 5, 33), 1), ((7, 5, 33), 2),
    ((64, 48), 0), ((64, 48), 1),
    ((50, 300), 1), ((3, 1001), 1), ((1001, 3), 1), ((2049, 2), 1),
    ((2, 3, 1, 257), 3), ((2, 3, 1, 257), 2), ((3, 1000, 7), 1),
    ((16, 32, 14, 14), 1), ((256, 4, 3, 3), 0), ((1, 1, 9), 1), ((5,), 0),
    ((4, 1, 100003), 1), ((100003, 4), 0),
]
RANGES = [(-128, 127), (0, 255), (-2 ** 31, 2 ** 31 - 1)]



# ------------------------------------------------------------------ helpers

assert G.FAMILIES == K.FAMILIES  # one list (qc_registry.h), the same ids


def fq_tensor(mod, family, x, y, mask, params, u0, u1, mode):
    """Per-tensor family `family` with scalar parameters, on either back end."""
    p = [float(v) for v in params] + [0.0] * (5 - len(params))
    mod.ew_tensor(K.FAMILIES[family], x, y, mask, *p, float(u0), float(u1), int(mode), 1)


def fq_channels(mod, family, x, y, mask, outer, C, inner, params, u0, u1, mode):
    """Per-channel family `family`: params are the NP per-channel arrays."""
    xp = cp if mod is G else np
    flat = np.concatenate([np.asarray(p, dtype=x.dtype).reshape(-1) for p in params])
    mod.ew(K.FAMILIES[family], x, y, mask, outer, C, inner, xp.asarray(flat), float(u0),
           float(u1), int(mode), 1)


def _uint(dtype):
    return {2: np.uint16, 4: np.uint32, 8: np.uint64}[np.dtype(dtype).itemsize]


def assert_bits(cpu, gpu, what=""):
    """cpu (numpy) and gpu (cupy or numpy) hold the same bits (NaN lanes:
    NaN in both)."""
    assert_bits_equal(gpu, cpu, what)


def make_x(n, dtype, seed, scale=0.0173, spread=200.0):
    """Random values with every special case mixed in."""
    rng = np.random.default_rng(seed)
    T = np.dtype(dtype).type
    x = (rng.standard_normal(n) * spread * scale).astype(dtype)
    if n == 0:
        return x
    k = rng.integers(-300, 300, size=n)
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e30, -1e30, 3e38, -3e38,
                         np.finfo(dtype).tiny / 4, -np.finfo(dtype).tiny / 4, 9.3e18, -9.3e18],
                        dtype=dtype)
    ties = ((k + 0.5) * 0.125).astype(dtype)               # exact ties for scale 2**-3
    ties_s = ((k + 0.5) * T(scale)).astype(dtype)           # ties of the real scale
    near = np.nextafter(ties_s, np.where(rng.random(n) < 0.5, -np.inf, np.inf).astype(dtype))
    which = rng.integers(0, 10, size=n)
    x = np.where(which == 0, specials[rng.integers(0, specials.size, size=n)], x)
    x = np.where(which == 1, ties, x)
    x = np.where(which == 2, ties_s, x)
    x = np.where(which == 3, near, x)
    return x.astype(dtype)


def place(x, offset):
    """x on the device, starting `offset` elements into a fresh buffer (so
    offset 1 defeats the 16-byte vector path)."""
    buf = cp.empty(x.size + offset, dtype=x.dtype)
    d = buf[offset:]
    d[...] = cp.asarray(x)
    return d


def empty_dev(n, dtype, offset):
    return cp.empty(n + offset, dtype=dtype)[offset:]


def layout(shape, axis):
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
    return outer, int(shape[axis]), inner


def all_affine_modes():
    modes = []
    for rnd in ops.ROUNDING.values():  # every mode of the extension's table
        for zpb in (0, ops.ZP_BEFORE):
            for div in (0, ops.DIVIDE):
                for nf in (ops.NF_PROPAGATE, ops.NF_NAN_TO_QMIN, ops.NF_INT64):
                    for wide in (0, ops.DEQUANT_WIDE):
                        for outq in (0, ops.OUTPUT_Q):
                            modes.append(rnd | zpb | div | nf | wide | outq)
    # later mode bits (e.g. NO_ZERO_POINT) ride along on a few base modes
    extra = [getattr(ops, name) for name in ("NO_ZERO_POINT",) if hasattr(ops, name)]
    for bit in extra:
        modes += [m | bit for m in modes if not m & ops.ZP_BEFORE]
    return modes


AFFINE_MODES = all_affine_modes()
SOME_MODES = [0, 1, 2, ops.ZP_BEFORE | ops.DIVIDE | 2, ops.NF_NAN_TO_QMIN,
              ops.NF_INT64 | ops.DEQUANT_WIDE, ops.OUTPUT_Q | ops.NF_NAN_TO_QMIN | 1]


def affine_scalar_params(dtype, mode, qrange):
    T = np.dtype(dtype).type
    qmin, qmax = qrange
    s = T(0.0173)
    inv = T(1) / s
    zp = 2.7 if mode & ops.ZP_BEFORE else float(max(qmin, min(qmax, 3)))
    return float(s), float(inv), zp, float(qmin), float(qmax)


def affine_channel_params(dtype, C, mode, qrange, seed):
    rng = np.random.default_rng(seed)
    qmin, qmax = qrange
    s = (rng.uniform(0.002, 0.05, C)).astype(dtype)
    s[::3] = dtype(0.125)
    with np.errstate(divide="ignore", over="ignore"):
        inv = (np.dtype(dtype).type(1) / s).astype(dtype)
    if mode & ops.ZP_BEFORE:
        zp = rng.uniform(-3, 3, C).astype(dtype)
    else:
        zp = np.clip(rng.integers(-5, 6, C), qmin, qmax).astype(dtype)
    return s, inv, zp


# --------------------------------------------------------------- affine

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", AFFINE_MODES)
@pytest.mark.parametrize("with_mask", [False, True])
def test_fq_affine_every_mode(dtype, mode, with_mask):
    n = 65537
    for qrange in RANGES[:2]:
        x = make_x(n, dtype, seed=mode)
        args = affine_scalar_params(dtype, mode, qrange)
        y = np.empty_like(x)
        m = np.empty(n, np.uint8) if with_mask else None
        fq_tensor(K, "affine", x, y, m, args[:3], *args[3:], mode)
        xd = cp.asarray(x)
        yd = cp.empty_like(xd)
        md = cp.empty(n, cp.uint8) if with_mask else None
        fq_tensor(G, "affine", xd, yd, md, args[:3], *args[3:], mode)
        assert_bits(y, yd, f"y mode={mode} {qrange}")
        if with_mask:
            assert_bits(m, md, f"mask mode={mode}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("offset", [0, 1, 3])
def test_fq_affine_sizes_and_alignment(dtype, n, offset, index64):
    for mode in SOME_MODES:
        x = make_x(n, dtype, seed=n + mode)
        args = affine_scalar_params(dtype, mode, (-128, 127))
        y = np.empty_like(x)
        m = np.empty(n, np.uint8)
        fq_tensor(K, "affine", x, y, m, args[:3], *args[3:], mode)
        xd = place(x, offset)
        yd = empty_dev(n, dtype, offset)
        md = cp.empty(n + offset, cp.uint8)[offset:]
        fq_tensor(G, "affine", xd, yd, md, args[:3], *args[3:], mode)
        assert_bits(y, yd, f"y n={n} mode={mode}")
        assert_bits(m, md, "mask")


@pytest.mark.parametrize("dtype", DTYPES)
def test_fq_affine_in_place(dtype):
    x = make_x(BIG, dtype, seed=5)
    args = affine_scalar_params(dtype, 0, (0, 255))
    y = x.copy()
    fq_tensor(K, "affine", y, y, None, args[:3], *args[3:], 0)
    xd = cp.asarray(x)
    fq_tensor(G, "affine", xd, xd, None, args[:3], *args[3:], 0)
    assert_bits(y, xd, "in place")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,axis", CHANNEL_CASES)
def test_fq_affine_channels(dtype, shape, axis, index64):
    outer, C, inner = layout(shape, axis)
    n = outer * C * inner
    for i, mode in enumerate(SOME_MODES):
        x = make_x(n, dtype, seed=i + C)
        s, inv, zp = affine_channel_params(dtype, C, mode, (-128, 127), seed=i)
        y = np.empty_like(x)
        m = np.empty(n, np.uint8)
        fq_channels(K, "affine", x, y, m, outer, C, inner, (s, inv, zp), -128, 127, mode)
        for offset in (0, 1):
            xd = place(x, offset)
            yd = empty_dev(n, dtype, offset)
            md = cp.empty(n + offset, cp.uint8)[offset:]
            fq_channels(G, "affine", xd, yd, md, outer, C, inner, (s, inv, zp), -128, 127,
                        mode)
            assert_bits(y, yd, f"y {shape} axis={axis} mode={mode} offset={offset}")
            assert_bits(m, md, "mask")


# --------------------------------------------------------------- nudged

def _nudged_params(dtype, C, seed):
    rng = np.random.default_rng(seed)
    lo = -rng.uniform(0.1, 4.0, C).astype(np.float32)
    hi = rng.uniform(0.1, 4.0, C).astype(np.float32)
    nmin, nmax, s, inv, qz = Q.nudge_tensorflow(lo, hi, 0, 255)
    return [a.astype(dtype) for a in (nmin, nmax, s, inv, qz)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", [0, 1, 2, 3])
@pytest.mark.parametrize("n", [1, 7, 65537, BIG])
def test_fq_nudged(dtype, mode, n, index64):
    x = make_x(n, dtype, seed=mode, scale=0.01, spread=300)
    params = [float(p[0]) for p in _nudged_params(dtype, 1, seed=n)]
    y = np.empty_like(x)
    m = np.empty(n, np.uint8)
    fq_tensor(K, "nudged", x, y, m, params, 0, 0, mode)
    for offset in (0, 1):
        xd = place(x, offset)
        yd = empty_dev(n, dtype, offset)
        md = cp.empty(n + offset, cp.uint8)[offset:]
        fq_tensor(G, "nudged", xd, yd, md, params, 0, 0, mode)
        assert_bits(y, yd, f"y mode={mode}")
        assert_bits(m, md, "mask")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", [0, 3])
@pytest.mark.parametrize("shape,axis", CHANNEL_CASES)
def test_fq_nudged_channels(dtype, mode, shape, axis):
    outer, C, inner = layout(shape, axis)
    n = outer * C * inner
    x = make_x(n, dtype, seed=C, scale=0.01, spread=300)
    params = _nudged_params(dtype, C, seed=C)
    y = np.empty_like(x)
    m = np.empty(n, np.uint8)
    fq_channels(K, "nudged", x, y, m, outer, C, inner, params, 0, 0, mode)
    xd = cp.asarray(x)
    yd = cp.empty_like(xd)
    md = cp.empty(n, cp.uint8)
    fq_channels(G, "nudged", xd, yd, md, outer, C, inner, params, 0, 0, mode)
    assert_bits(y, yd, f"y {shape} axis={axis}")
    assert_bits(m, md, "mask")


# ----------------------------------------------------------------- amax

def _amax_params(dtype, C, seed, num_bits=8, unsigned=False, narrow=True):
    rng = np.random.default_rng(seed)
    amax = rng.uniform(0.5, 5.0, C).astype(dtype)
    amax[::4] = dtype(2.0 ** -25)       # tiny: mult 0, divisor 1
    amax[1::5] = dtype(0.0)
    mult, div = Q.amax_multiplier(amax, num_bits, unsigned)
    lo, hi = Q.amax_bounds(num_bits, unsigned, narrow)
    return mult, div, lo, hi, amax


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 5, 65537, BIG])
@pytest.mark.parametrize("bits,unsigned,narrow", [(8, False, True), (8, False, False),
                                                   (4, True, False), (16, False, True)])
def test_fq_amax(dtype, n, bits, unsigned, narrow, index64):
    x = make_x(n, dtype, seed=n, scale=0.02)
    if unsigned:
        x = np.abs(x)
    for c in range(3):   # normal, tiny, zero amax
        mult, div, lo, hi, amax = _amax_params(dtype, 6, seed=bits, num_bits=bits,
                                               unsigned=unsigned, narrow=narrow)
        k = [2, 4, 1][c]
        args = (float(mult[k]), float(div[k]), lo, hi, float(amax[k]))
        y = np.empty_like(x)
        m = np.empty(n, np.uint8)
        fq_tensor(K, "amax", x, y, m, (args[0], args[1], args[4]), args[2], args[3], 0)
        for offset in (0, 1):
            xd = place(x, offset)
            yd = empty_dev(n, dtype, offset)
            md = cp.empty(n + offset, cp.uint8)[offset:]
            fq_tensor(G, "amax", xd, yd, md, (args[0], args[1], args[4]), args[2], args[3], 0)
            assert_bits(y, yd, f"y amax={args[-1]}")
            assert_bits(m, md, "mask")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,axis", CHANNEL_CASES)
def test_fq_amax_channels(dtype, shape, axis):
    outer, C, inner = layout(shape, axis)
    n = outer * C * inner
    x = make_x(n, dtype, seed=C, scale=0.02)
    mult, div, lo, hi, amax = _amax_params(dtype, C, seed=C)
    y = np.empty_like(x)
    m = np.empty(n, np.uint8)
    fq_channels(K, "amax", x, y, m, outer, C, inner, (mult, div, amax), lo, hi, 0)
    xd = cp.asarray(x)
    yd = cp.empty_like(xd)
    md = cp.empty(n, cp.uint8)
    fq_channels(G, "amax", xd, yd, md, outer, C, inner, (mult, div, amax), lo, hi, 0)
    assert_bits(y, yd, f"y {shape} axis={axis}")
    assert_bits(m, md, "mask")


# ------------------------------------------------------------------ STE

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("offset", [0, 1])
def test_ste(dtype, n, offset, index64):
    rng = np.random.default_rng(n)
    g = make_x(n, dtype, seed=n + 1)
    mask = (rng.random(n) < 0.7).astype(np.uint8)
    y = np.empty_like(g)
    K.ste(g, mask, y, 1)
    gd = place(g, offset)
    md = cp.empty(n + offset, cp.uint8)[offset:]
    md[...] = cp.asarray(mask)
    yd = empty_dev(n, dtype, offset)
    G.ste(gd, md, yd, 1)
    assert_bits(y, yd, "ste")
    G.ste(gd, md, gd, 1)      # in place
    assert_bits(y, gd, "ste in place")


# -------------------------------------------------------------- min/max

def _cpu_finished(lo, hi, fl, dtype, omit=False):
    """The CPU's finished (lo, hi) as 1-D arrays of dtype (K.minmax returns
    Python scalars per tensor)."""
    lo = np.array(lo, dtype=dtype, ndmin=1)
    hi = np.array(hi, dtype=dtype, ndmin=1)
    fl = np.array(fl, dtype=np.uint8, ndmin=1)
    if omit:
        fl = fl & np.uint8(~ops.MM_NAN & 0xFF)
    K.minmax_finish(lo, hi, fl)
    return lo, hi


def _minmax_inputs(dtype):
    T = np.dtype(dtype).type
    cases = {
        "random": make_x(BIG, dtype, seed=1),
        "no_nan": np.nan_to_num(make_x(65537, dtype, seed=2), nan=1.0),
        "all_nan": np.full(1001, np.nan, dtype),
        "zeros_neg_pos": np.array([-0.0, 0.0] * 5000, dtype),
        "zeros_pos_neg": np.array([0.0, -0.0] * 5001, dtype),
        "only_neg_zero": np.full(77777, -0.0, dtype),
        "only_pos_zero": np.zeros(77777, dtype),
        "pos_with_zero": np.concatenate([np.arange(1, 70001, dtype=dtype),
                                         np.array([-0.0], dtype)]),
        "neg_with_zero": np.concatenate([-np.arange(1, 70001, dtype=dtype),
                                         np.array([0.0], dtype)]),
        "inf": np.array([np.inf, -np.inf, 1.0] * 3333, dtype),
        "one": np.array([T(-2.5)]),
        "nan_last": np.concatenate([np.ones(BIG - 2, dtype), np.array([np.nan], dtype)]),
    }
    assert all(v.dtype == dtype for v in cases.values())
    return cases


@pytest.mark.parametrize("dtype", DTYPES)
def test_minmax_per_tensor(dtype, index64):
    for name, x in _minmax_inputs(dtype).items():
        lo, hi, fl = K.minmax(x, 1)
        for offset in (0, 1):
            xd = place(x, offset)
            glo, ghi, gfl = G.minmax(xd)
            assert int(gfl) == int(fl), (name, int(gfl), int(fl))
            clo, chi = _cpu_finished(lo, hi, fl, dtype)
            flo, fhi = glo.reshape(1).copy(), ghi.reshape(1).copy()
            G.minmax_finish(flo, fhi, gfl.reshape(1))
            assert_bits(clo, flo, f"{name} lo")
            assert_bits(chi, fhi, f"{name} hi")
            for finish, omit in ((1, False), (2, True)):
                olo = cp.empty(1, dtype)
                ohi = cp.empty(1, dtype)
                G.minmax_device(xd, 1, 1, x.size, olo, ohi, None, finish=finish)
                clo, chi = _cpu_finished(lo, hi, fl, dtype, omit)
                assert_bits(clo, olo, f"{name} lo finish={finish}")
                assert_bits(chi, ohi, f"{name} hi finish={finish}")


@pytest.mark.parametrize("dtype", DTYPES)
def test_minmax_empty(dtype):
    lo, hi, fl = G.minmax(cp.empty(0, dtype))
    assert float(lo) == np.inf and float(hi) == -np.inf and int(fl) == 0
    lo, hi, fl = G.minmax_channels(cp.empty(0, dtype), 0, 3, 4)
    assert (lo == np.inf).all() and (hi == -np.inf).all() and (fl == 0).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,axis", CHANNEL_CASES + [((3, 1), 0), ((1, 3), 1)])
def test_minmax_channels(dtype, shape, axis, index64):
    outer, C, inner = layout(shape, axis)
    n = outer * C * inner
    rng = np.random.default_rng(C)
    xs = [make_x(n, dtype, seed=C)]
    z = np.where(rng.random(n) < 0.5, -0.0, 0.0).astype(dtype)
    xs.append(z)                                      # zeros of both signs
    xs.append(np.abs(np.nan_to_num(xs[0], nan=0.0)))  # no NaN, zeros
    for x in xs:
        lo, hi, fl = K.minmax_channels(x, outer, C, inner, 1)
        glo, ghi, gfl = G.minmax_channels(cp.asarray(x), outer, C, inner)
        assert_bits(fl, gfl, f"flags {shape} axis={axis}")
        clo, chi = _cpu_finished(lo, hi, fl, dtype)
        G.minmax_finish(glo, ghi, gfl)
        assert_bits(clo, glo, f"lo {shape} axis={axis}")
        assert_bits(chi, ghi, f"hi {shape} axis={axis}")


@pytest.mark.skipif(not EMULATED, reason="counts launched blocks through the emulator")
@pytest.mark.parametrize("shape,axis", [((100003, 4), 0), ((4, 100003), 1), ((50, 2000, 3), 1),
                                        ((3, 64, 3000), 1), ((1, 400012), 0)])
def test_minmax_launch_shape_follows_the_layout(shape, axis):
    """Many channels of little work each get a thread group per channel, not
    a block per channel: no launch has more than max(32 blocks per SM, one
    block per 1024 values)."""
    mod = G._module("minmax.cu", "i32")[0].module   # (the emulator's loaded library)
    outer, C, inner = layout(shape, axis)
    x = cp.asarray(np.arange(outer * C * inner, dtype=np.float32))
    before = mod.stats()["blocks"]
    lo, hi, fl = G.minmax_channels(x, outer, C, inner)
    blocks = mod.stats()["blocks"] - before
    assert blocks <= max(32 * G._sm_count(), -(-x.size // 1024)), blocks
    ref = K.minmax_channels(cp.asnumpy(x), outer, C, inner, 1)
    assert_bits(ref[0], lo)
    assert_bits(ref[1], hi)


@pytest.mark.parametrize("dtype", DTYPES)
def test_minmax_is_deterministic(dtype):
    x = make_x(3 * BIG, dtype, seed=9)
    x[::7] = -0.0
    x[::11] = 0.0
    xd = cp.asarray(x)
    shape = (1, 3, x.size // 3)
    ref = G.minmax_channels(xd, *shape)
    G.minmax_finish(*ref)
    ref = [cp.asnumpy(a) for a in ref]
    for _ in range(5):
        got = G.minmax_channels(xd, *shape)
        G.minmax_finish(*got)
        for r, g, what in zip(ref, got, ("lo", "hi", "flags")):
            assert_bits(r, g, "repeat " + what)


# ------------------------------------------- fused observer + fake quant

def _fq_batches(shape, dtype, nan_batch):
    rng = np.random.default_rng(sum(shape))
    out = []
    for i in range(5):
        x = (rng.standard_normal(shape) * (1.0 + i) + 0.3 * i).astype(dtype)
        x.reshape(-1)[::97] = ((rng.integers(-50, 50, x.size) + 0.5) * 0.03125)[::97]
        if i == nan_batch:
            x.reshape(-1)[x.size // 2] = np.nan
        out.append(x)
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("observer", ["minmax", "moving_average"])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("shape,axis", [((4099,), None), ((8, 3, 5, 7), None),
                                        ((16, 3, 5, 5), 0), ((8, 6, 5, 7), 1),
                                        ((33, 300), 1), ((300, 33), 0)])
@pytest.mark.parametrize("qrange", [(0, 255), (-128, 127)])
def test_fused_observer_fake_quant_matches_cpu(dtype, observer, symmetric, shape, axis, qrange):
    qmin, qmax = qrange
    if observer == "minmax":
        obs = MinMaxObserver(axis=axis)
    else:
        obs = MovingAverageMinMaxObserver(averaging_constant=0.25, axis=axis)
    fq = FakeQuantize(obs, qmin, qmax, symmetric=symmetric, axis=axis)
    if axis is None:
        outer, C, inner = 1, 1, int(np.prod(shape))
    else:
        outer, C, inner = layout(shape, axis)
    state = G.ObserverState(C, dtype)
    for i, x in enumerate(_fq_batches(shape, dtype, nan_batch=2)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            y = fq.forward(x)
        mask = fq.mask
        xd = cp.asarray(x).reshape(-1)
        yd = cp.empty_like(xd)
        md = cp.empty(xd.size, cp.uint8)
        G.observe(xd, outer, C, inner, state, observer=observer, averaging_constant=0.25,
                  nan_policy="skip", qscheme="symmetric" if symmetric else "affine",
                  quant_min=qmin, quant_max=qmax, eps=fq.eps)
        G.ew(G.FAMILIES["affine"], xd, yd, md, outer, C, inner, state.qp, qmin, qmax, fq._mode)
        what = f"batch {i}"
        assert_bits(np.asarray(obs.min_val, np.float32).reshape(-1), state.min_val, what + " min")
        assert_bits(np.asarray(obs.max_val, np.float32).reshape(-1), state.max_val, what + " max")
        assert cp.asnumpy(state.counts).tolist() == [obs.num_batches, obs.nonfinite_batches], what
        scale = np.broadcast_to(fq.scale, (C,)).astype(np.float32)
        zp = np.broadcast_to(fq.zero_point, (C,)).astype(np.int64)
        assert_bits(scale, state.scale, what + " scale")
        assert_bits(zp, state.zero_point, what + " zero point")
        assert_bits(y.reshape(-1), yd, what + " y")
        assert_bits(np.asarray(mask).reshape(-1), md, what + " mask")


@pytest.mark.parametrize("nan_policy", ["skip", "propagate"])
def test_fused_qparams_edge_cases(nan_policy):
    """affine_qparams corner cases (inf / equal / zero statistics) computed
    by the last block, against quantcore.qparams.  Under the default
    nan_policy="skip" a batch holding +-inf is skipped: the state and the
    qparams stay as they were, and the batch is counted."""
    cases = [[0.0, 0.0], [-0.0, -0.0], [1.0, 1.0], [-np.inf, 1.0], [-1.0, np.inf],
             [-3e38, 3e38], [-1e-30, 1e-30], [2.0, 5.0], [-7.0, -2.0]]
    for qmin, qmax in [(0, 255), (-128, 127), (-2 ** 31, 2 ** 31 - 1), (0, 1)]:
        for sym in (False, True):
            for vals in cases:
                x = np.array(vals * 3, np.float32)
                state = G.ObserverState(1, np.float32)
                G.observe(cp.asarray(x), 1, 1, x.size, state, observer="minmax",
                          nan_policy=nan_policy, qscheme="symmetric" if sym else "affine",
                          quant_min=qmin, quant_max=qmax)
                what = f"{vals} {qmin} {sym} {nan_policy}"
                if nan_policy == "skip" and not np.isfinite(x).all():
                    assert cp.asnumpy(state.counts).tolist() == [0, 1], what
                    s, z = np.ones(1, np.float32), np.zeros(1, np.int64)
                else:
                    assert cp.asnumpy(state.counts).tolist() == [1, 0], what
                    fn = Q.symmetric_qparams if sym else Q.affine_qparams
                    with np.errstate(all="ignore"):
                        s, z = fn(np.float32(np.min(x)), np.float32(np.max(x)), qmin, qmax)
                assert_bits(s.astype(np.float32), state.scale, what)
                assert_bits(z.astype(np.int64), state.zero_point, what)


def test_fused_path_needs_no_host_sync():
    """observe + ew (reading the state's qparams) only enqueue work: on a GPU they run inside a
    stream capture (which fails on any synchronising call); on the emulator
    (no stream capture) no byte crosses between host and device."""
    x = cp.asarray(np.nan_to_num(make_x(BIG, np.float32, seed=3), nan=0.5, posinf=1.0,
                                 neginf=-1.0))   # finite: no batch is skipped
    y = cp.empty_like(x)
    m = cp.empty(x.size, cp.uint8)
    state = G.ObserverState(1, np.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        # compile, and fill this stream's memory pool, before the capture
        G.observe(x, 1, 1, x.size, state, observer="moving_average")
        G.ew(G.FAMILIES["affine"], x, y, m, 1, 1, x.size, state.qp, 0, 255, 0)
        stream.synchronize()
        if EMULATED:
            before = dict(cp.TRANSFERS)
            G.observe(x, 1, 1, x.size, state, observer="moving_average")
            G.ew(G.FAMILIES["affine"], x, y, m, 1, 1, x.size, state.qp, 0, 255, 0)
            assert cp.TRANSFERS == before
        else:
            stream.begin_capture()
            G.observe(x, 1, 1, x.size, state, observer="moving_average")
            G.ew(G.FAMILIES["affine"], x, y, m, 1, 1, x.size, state.qp, 0, 255, 0)
            graph = stream.end_capture()
            graph.launch(stream)
        stream.synchronize()
    assert int(state.counts[0]) == 2   # the warm-up and the captured step


# --------------------------------------------------------- 2**31 elements

@pytest.mark.slow
def test_fq_affine_and_minmax_past_2_31_elements():
    """64-bit indexing on a real 2**31 + 5 element array (8 GiB + 8 GiB +
    2 GiB of device memory): the tail is compared with the CPU."""
    n = 2 ** 31 + 5
    free, _ = cp.cuda.runtime.memGetInfo()
    if free < 20 * 2 ** 30:
        pytest.skip("needs 20 GiB of free device memory")
    xd = cp.zeros(n, cp.float32)
    tail = make_x(2 ** 20 + 5, np.float32, seed=31)
    tail = np.nan_to_num(tail, nan=0.5)
    tail[-1] = -1234.5
    xd[-tail.size:] = cp.asarray(tail)
    args = affine_scalar_params(np.float32, 0, (-128, 127))
    yd = cp.empty_like(xd)
    md = cp.empty(n, cp.uint8)
    fq_tensor(G, "affine", xd, yd, md, args[:3], *args[3:], 0)
    y = np.empty_like(tail)
    m = np.empty(tail.size, np.uint8)
    fq_tensor(K, "affine", tail, y, m, args[:3], *args[3:], 0)
    assert_bits(y, yd[-tail.size:], "tail y")
    assert_bits(m, md[-tail.size:], "tail mask")
    del yd, md
    lo, hi, fl = G.minmax(xd)
    assert float(lo) == min(float(np.min(tail)), 0.0)
    assert float(hi) == max(float(np.max(tail)), 0.0)
    assert int(fl) == int(K.minmax(tail, 1)[2]) | ops.MM_POSZERO


# ------------------------------------------------------------ histograms

@pytest.mark.parametrize("bins", [1, 7, 2048, 4096, 5000])
@pytest.mark.parametrize("absolute,skip_zeros", [(False, False), (True, False), (True, True)])
def test_histc_matches_cpu(bins, absolute, skip_zeros, index64):
    """torch.histc counts on the device equal the CPU kernel's, with the
    out-of-range, NaN, edge and overflow cases (shared-memory bins and, past
    4096 bins, global ones)."""
    x = make_x(BIG, np.float32, seed=bins)
    x[::101] = 0.0
    x[5::103] = -0.0
    xd = cp.asarray(x)
    for lo, hi in ((-3.0, 3.0), (0.0, 1.0), (-3e38, 3e38), (0.5, 0.5000001), (-1e-30, 2.0)):
        cpu = K.histc_f32(x, bins, lo, hi, absolute, skip_zeros, 1)
        gpu = G.histc_f32(xd, bins, lo, hi, absolute, skip_zeros)
        assert gpu.dtype == np.int64 and np.array_equal(cpu, cp.asnumpy(gpu)), (lo, hi)
