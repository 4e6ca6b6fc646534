"""The qparams schemes of qc_qparams.h (quantcore.qparams) against the numpy
formulas they replaced (tests/reference.py), bit for bit, on random and
edge statistics (NaN, +-inf, +-0, equal, tiny, huge, one-signed), and the
same schemes on the GPU (cupy statistics in, cupy qparams out, no host
copy) against the CPU."""
import warnings

import numpy as np
import pytest

from quantcore import qparams as Q
import reference as R
from reference import assert_bits_equal

EDGES = np.array([0.0, -0.0, 1.0, -1.0, np.nan, np.inf, -np.inf, 1e-30, -1e-30, 3e38, -3e38,
                  2.0 ** -24, 2.0 ** -25, 6.1e-5, 0.5, 127.5, -128.0, 1e-45], np.float32)


def _stats(seed, n=400):
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal(n) * 10.0 ** rng.integers(-6, 6, n)).astype(np.float32)
    b = (rng.standard_normal(n) * 10.0 ** rng.integers(-6, 6, n)).astype(np.float32)
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    # every pair of edge values, and one-signed / equal ranges
    e1, e2 = np.meshgrid(EDGES, EDGES)
    lo = np.concatenate([lo, e1.ravel(), -np.abs(a[:50]), np.abs(a[:50]), a[:50]])
    hi = np.concatenate([hi, e2.ravel(), -np.abs(b[:50]) / 2, np.abs(b[:50]) * 2, a[:50]])
    return lo.astype(np.float32), hi.astype(np.float32)


RANGES = [(0, 255), (-128, 127), (-127, 127), (0, 15), (-8, 7), (0, 1),
          (-2 ** 31, 2 ** 31 - 1), (0, 65535)]

# name -> (quantcore function, reference, the calls' extra arguments)
CASES = {
    "float_qparams": [(Q.float_qparams, R.ref_float_qparams, (qmin, qmax))
                      for qmin, qmax in RANGES],
    "oneflow_qparams": [(Q.oneflow_qparams, R.ref_oneflow_qparams, (b, scheme, formula, rnd))
                        for b in (2, 4, 8, 16) for scheme in ("symmetric", "affine")
                        for formula in ("google", "cambricon")
                        for rnd in ("half_even", "half_away")],
    "nudge_tensorflow": [(Q.nudge_tensorflow, R.ref_nudge_tensorflow, r) for r in RANGES],
    "nudge_mindspore": [(Q.nudge_mindspore, R.ref_nudge_mindspore, r) for r in RANGES],
    "symmetric_range": [(Q.symmetric_range, R.ref_symmetric_range, ())],
    "choose_qparams_fused": [(Q.choose_qparams_fused, R.ref_choose_qparams_fused, r + (p,))
                             for r in RANGES for p in (False, True)],
    "pq_affine_qparams": [(Q.pq_affine_qparams, R.ref_pq_affine_qparams, (b, dt))
                          for b in (2, 4, 8, 16) for dt in (np.float32, np.float64)],
}


def _same(got, want, what):
    got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple)
                                                              else (want,))
    assert len(got) == len(want), what
    for i, (g, w) in enumerate(zip(got, want)):
        assert_bits_equal(g, np.asarray(w), f"{what} output {i}")


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("seed", [0, 1])
def test_two_input_schemes_match_the_numpy_formulas(name, seed):
    lo, hi = _stats(seed)
    for fn, ref, extra in CASES[name]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            _same(fn(lo, hi, *extra), ref(lo, hi, *extra), f"{name}{extra}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bits,unsigned", [(8, False), (8, True), (4, False), (16, False)])
def test_amax_multiplier_matches(dtype, bits, unsigned):
    lo, hi = _stats(3)
    amax = np.abs(np.concatenate([lo, hi])).astype(dtype)
    _same(Q.amax_multiplier(amax, bits, unsigned), R.ref_amax_multiplier(amax, bits, unsigned),
          "amax")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cambricon_step_matches(dtype):
    shifts = np.concatenate([np.arange(-200, 200), [np.nan, np.inf, -np.inf, 2.0 ** 31,
                                                    -2.0 ** 31 - 2, 3.7, -3.7, 1e300]])
    _same(Q.cambricon_step(shifts, dtype), R.ref_cambricon_step(shifts, dtype), "step")


@pytest.mark.gpu
def test_schemes_on_the_gpu_equal_the_cpu():
    cp = pytest.importorskip("cupy")
    import quantcore_gpu
    ok, reason = quantcore_gpu.can_use()
    if not ok:
        pytest.skip(reason)
    lo, hi = _stats(5)
    dlo, dhi = cp.asarray(lo), cp.asarray(hi)
    before = dict(cp.TRANSFERS) if hasattr(cp, "TRANSFERS") else None
    calls = [(fn, extra) for cases in CASES.values() for fn, _, extra in cases]
    results = []
    for fn, extra in calls:
        out = fn(dlo, dhi, *extra)
        results.append(out)
    results.append(Q.affine_qparams(dlo, dhi, -128, 127))
    results.append(Q.symmetric_qparams(dlo, dhi, 0, 255))
    results.append(Q.amax_multiplier(cp.abs(dhi), 8, False))
    if before is not None:   # the emulator counts what crosses: nothing did
        assert cp.TRANSFERS["to_host"] == before["to_host"]
    expected = [fn(lo, hi, *extra) for fn, extra in calls]
    expected += [Q.affine_qparams(lo, hi, -128, 127), Q.symmetric_qparams(lo, hi, 0, 255),
                 Q.amax_multiplier(np.abs(hi), 8, False)]
    for i, (g, w) in enumerate(zip(results, expected)):
        for j, (gg, ww) in enumerate(zip(g, w)):
            assert isinstance(gg, cp.ndarray), (i, j)
            assert_bits_equal(gg, ww, f"call {i} output {j}")


def test_every_registered_scheme_is_tested(monkeypatch):
    """CASES and this file's other tests reach every scheme of the header's
    QC_QP_SCHEMES (the extension's QP_SCHEMES): the schemes each public
    function runs are recorded, not listed by hand, so a new scheme without
    its case here fails."""
    from quantcore._cpu import _kernels
    reached, run = set(), Q._scheme

    def spy(name, *args, **kwargs):
        reached.add(name)
        return run(name, *args, **kwargs)

    monkeypatch.setattr(Q, "_scheme", spy)
    lo, hi = _stats(0, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for cases in CASES.values():
            fn, _, extra = cases[0]
            fn(lo, hi, *extra)
        # test_amax_multiplier_matches, test_cambricon_step_matches and the
        # GPU test's affine / symmetric qparams
        Q.amax_multiplier(np.abs(hi), 8, False)
        Q.cambricon_step(np.arange(-3.0, 3.0), np.float32)
        Q.affine_qparams(lo, hi, -128, 127)
        Q.symmetric_qparams(lo, hi, 0, 255)
    assert reached == set(_kernels.QP_SCHEMES)
