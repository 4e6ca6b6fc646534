"""Device sums in numpy's order (``quantcore_gpu.kernels.numpy_row_sums`` /
``numpy_column_sums``, reduce.cu) against ``numpy.sum`` on the host, bit for
bit: every pairwise-tree shape up to a few leaves, lengths around the
8-value and 128-value boundaries and the split points, many rows, and
both accumulators."""
import numpy as np
import pytest

import quantcore_gpu
from quantcore_gpu import kernels as K
from reference import assert_bits_equal

cp = pytest.importorskip("cupy")
_OK, _REASON = quantcore_gpu.can_use()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _OK, reason=str(_REASON))]

F32 = np.float32


def _values(rng, shape):
    """Values across 16 binades with both signs, some exact zeros and -0."""
    v = rng.standard_normal(shape) * np.exp2(rng.integers(-8, 8, shape))
    v[rng.random(shape) < 0.05] = 0.0
    v[rng.random(shape) < 0.02] = -0.0
    return v.astype(F32)


LENGTHS = [1, 2, 7, 8, 9, 15, 16, 17, 127, 128, 129, 136, 255, 256, 257, 383, 1000, 1031,
           4096, 8191, 8192, 8193, 30001]


@pytest.mark.parametrize("n", LENGTHS)
def test_one_row_float32_as_numpy(n):
    x = _values(np.random.default_rng(n), (1, n))
    got = K.numpy_row_sums(cp.asarray(x)).get()
    assert_bits_equal(got, np.array([np.sum(x, dtype=F32, initial=F32(0))]))


@pytest.mark.parametrize("rows, n", [(3, 5), (5, 129), (4, 1031), (300, 3), (2, 8193)])
@pytest.mark.parametrize("acc", [np.float32, np.float64])
def test_rows_as_numpy(rows, n, acc):
    x = _values(np.random.default_rng(rows * n), (rows, n))
    got = K.numpy_row_sums(cp.asarray(x), acc).get()
    assert got.dtype == acc
    assert_bits_equal(got, x.astype(acc).sum(axis=-1))


def test_row_sums_keep_nan_and_inf():
    x = _values(np.random.default_rng(3), (4, 300))
    x[0, 17], x[1, 250], x[2, 3], x[2, 299] = np.nan, np.inf, np.inf, -np.inf
    got = K.numpy_row_sums(cp.asarray(x)).get()
    with np.errstate(invalid="ignore"):  # (inf - inf on the host)
        want = x.sum(axis=-1)
    assert np.isnan(got[0]) and np.isnan(got[2]) and np.isnan(want[0]) and np.isnan(want[2])
    assert_bits_equal(got[[1, 3]], want[[1, 3]])


def test_row_sums_of_large_float32_differ_from_a_running_sum():
    """The test can fail: on these values a running (or another tree's) sum
    gives other bits than numpy's pairwise one."""
    x = _values(np.random.default_rng(11), (1, 5000))
    running = F32(0)
    for v in x[0]:
        running = F32(running + v)
    want = np.sum(x, dtype=F32, initial=F32(0))
    assert running != want
    assert_bits_equal(K.numpy_row_sums(cp.asarray(x)).get(), np.array([want]))


@pytest.mark.parametrize("rows, d", [(1, 2), (7, 3), (1000, 2), (3, 500)])
def test_column_sums_as_numpy(rows, d):
    x = _values(np.random.default_rng(rows + d), (rows, d))
    assert_bits_equal(K.numpy_column_sums(cp.asarray(x)).get(),
                      np.sum(x, axis=0, dtype=F32, initial=F32(0)))


def test_empty_and_bad_input():
    assert K.numpy_row_sums(cp.zeros((3, 0), F32)).get().tolist() == [0, 0, 0]
    assert K.numpy_row_sums(cp.zeros((0, 4), F32)).shape == (0,)
    assert K.numpy_column_sums(cp.zeros((0, 4), F32)).get().tolist() == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="C-contiguous 2-D float32"):
        K.numpy_row_sums(cp.zeros(5, F32))
    with pytest.raises(ValueError, match="C-contiguous 2-D float32"):
        K.numpy_row_sums(cp.zeros((2, 4), np.float64))
    with pytest.raises(ValueError, match="acc_dtype"):
        K.numpy_row_sums(cp.zeros((2, 4), F32), np.float16)
    with pytest.raises(ValueError, match="C-contiguous 2-D float32"):
        K.numpy_column_sums(cp.zeros((4, 2), F32).T)


@pytest.mark.parametrize("rows, n", [(3, 4095), (2, 4103), (3, 40000), (1, 70001)])
@pytest.mark.parametrize("acc", [np.float32, np.float64])
def test_deep_trees_as_numpy(rows, n, acc):
    """Trees deeper than one block's subtree (qc_pw_subtrees per node at
    the split depth, then qc_pw_top), several rows at once."""
    x = _values(np.random.default_rng(rows + n), (rows, n))
    assert_bits_equal(K.numpy_row_sums(cp.asarray(x), acc).get(), x.astype(acc).sum(axis=-1))


@pytest.mark.parametrize("n, launches", [(100, 1), (4000, 1), (30001, 2), (70001, 2)])
def test_row_sums_take_at_most_two_launches(n, launches):
    if not hasattr(cp, "LAUNCHES"):
        pytest.skip("counts launches on the emulator")
    x = cp.asarray(_values(np.random.default_rng(n), (2, n)))
    before = sum(cp.LAUNCHES.values())
    K.numpy_row_sums(x)
    assert sum(cp.LAUNCHES.values()) - before == launches
