"""quantcore.dask on a LocalCluster with 2 worker processes: results equal a
single-machine pass exactly."""
import warnings

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("dask.distributed")

import quantcore as qc  # noqa: E402
import quantcore.dask as qdask  # noqa: E402

from reference import bits_equal  # noqa: E402


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=None)
    with distributed.Client(cluster) as c:
        yield c
    cluster.close()


def test_the_cluster_has_two_worker_processes(client):
    import os
    pids = client.run(os.getpid)
    assert len(pids) == 2 and len(set(pids.values())) == 2 and os.getpid() not in pids.values()
    # the reduction runs on the workers (the client is the default scheduler)
    ran_on = client.compute(qdask.minmax(da.ones((8, 8), chunks=4), compute=False)).result()
    assert float(ran_on[0]) == 1.0


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(60, 12, 50)).astype(np.float32)
    x[7, 3, 2] = -0.0
    x[0, 0, 0] = 9.5
    return x


@pytest.mark.parametrize("axis", [None, 0, 1, 2])
@pytest.mark.parametrize("chunks", [(7, 5, 11), (60, 12, 50), (13, 12, 9)])
def test_distributed_minmax_is_exact(client, data, axis, chunks):
    d = da.from_array(data, chunks=chunks)
    lo, hi = qdask.minmax(d, axis=axis, split_every=3)
    elo, ehi = qc.minmax(data, axis=axis)
    assert bits_equal(lo, elo) and bits_equal(hi, ehi)


def test_nan_and_calibrate(client, data):
    x = data.copy()
    x[5, 5, 5] = np.nan
    d = da.from_array(x, chunks=(16, 6, 25))
    lo, hi = qdask.minmax(d, axis=1)
    elo, ehi = qc.minmax(x, axis=1)
    assert bits_equal(lo, elo) and bits_equal(hi, ehi)
    obs = qdask.calibrate(da.from_array(data, chunks=(16, 6, 25)), qc.MinMaxObserver(axis=1))
    ref = qc.MinMaxObserver(axis=1)
    ref(data)
    assert bits_equal(obs.min_val, ref.min_val) and bits_equal(obs.max_val, ref.max_val)
    with pytest.raises(ValueError, match="tree reduction"):
        qdask.calibrate(d, qc.MovingAverageMinMaxObserver())


@pytest.mark.parametrize("axis", [None, 1])
def test_distributed_fake_quant_is_exact(client, data, axis):
    d = da.from_array(data, chunks=(16, 5, 25))
    scale = 0.02 if axis is None else np.linspace(0.01, 0.05, data.shape[1])
    y = qdask.fake_quant(d, scale, 0, -128, 127, axis=axis, rounding="half_up").compute()
    assert bits_equal(y, qc.fake_quant(data, scale, 0, -128, 127, axis=axis, rounding="half_up"))
    with pytest.raises(ValueError, match="12 values"):
        qdask.fake_quant(d, [0.1, 0.2], 0, -128, 127, axis=1)


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_other_dtypes_are_exact(client, dtype):
    rng = np.random.default_rng(4)
    x = rng.normal(size=(21, 10)).astype(dtype)
    x[2, 3], x[5, 5] = -0.0, 0.0
    d = da.from_array(x, chunks=(4, 3))
    for axis in (None, -1):
        lo, hi = qdask.minmax(d, axis=axis)
        elo, ehi = qc.minmax(x, axis=axis)
        assert bits_equal(lo, elo) and bits_equal(hi, ehi)
    y = qdask.fake_quant(d, np.linspace(0.01, 0.1, 10), np.arange(10) - 5, -8, 7,
                         axis=-1).compute()
    assert bits_equal(y, qc.fake_quant(x, np.linspace(0.01, 0.1, 10), np.arange(10) - 5, -8, 7,
                                       axis=-1))


@pytest.mark.parametrize("policy", ["skip", "propagate", "raise"])
def test_calibrate_follows_the_observers_nan_policy(policy):
    """Every slab of blocks (here a row of blocks: chunks (5, 4) on channel
    axis 1) is a batch: the observer ends as it would after observing those
    batches in memory, one NaN discarding only its own batch (synchronous
    scheduler)."""
    import dask
    rng = np.random.default_rng(5)
    x = rng.normal(size=(20, 6)).astype(np.float32)
    used = rng.normal(size=(3, 6)).astype(np.float32)
    x[4, 2] = np.nan
    with dask.config.set(scheduler="synchronous"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        obs, ref = (qc.MinMaxObserver(axis=1, nan_policy=policy) for _ in range(2))
        obs(used)
        ref(used)
        if policy == "raise":
            with pytest.raises(ValueError, match="contain NaN"):
                qdask.calibrate(da.from_array(x, chunks=(5, 4)), obs)
            with pytest.raises(ValueError, match="contains NaN"):
                ref(x)
        else:
            qdask.calibrate(da.from_array(x, chunks=(5, 4)), obs)
            for start in range(0, 20, 5):
                ref(x[start:start + 5])
    assert bits_equal(obs.min_val, ref.min_val) and bits_equal(obs.max_val, ref.max_val)
    if policy == "skip":  # only the first batch (rows 0-4) is left out
        assert obs.num_batches == 1 + 3 and np.isfinite(obs.min_val).all()
    assert (obs.num_batches, obs.nonfinite_batches) == (ref.num_batches, ref.nonfinite_batches)


def test_empty_and_zero_d_arrays():
    import dask
    with dask.config.set(scheduler="synchronous"):
        e = np.zeros((0, 4), np.float32)
        for axis in (None, 1):
            lo, hi = qdask.minmax(da.from_array(e, chunks=(1, 2)), axis=axis)
            elo, ehi = qc.minmax(e, axis=axis)
            assert bits_equal(lo, elo) and bits_equal(hi, ehi)
        lo, hi = qdask.minmax(da.from_array(np.float32(3.0)))
        assert float(lo) == float(hi) == 3.0


BAD = [
    (lambda d: qdask.minmax(np.zeros(3)), TypeError, "expected a dask.array.Array"),
    (lambda d: qdask.calibrate(np.zeros(3)), TypeError, "expected a dask.array.Array"),
    (lambda d: qdask.fake_quant(np.zeros(3), 0.1, 0, 0, 255), TypeError, "dask.array.Array"),
    (lambda d: qdask.minmax(d.astype(np.int32)), TypeError, "floating dtype"),
    (lambda d: qdask.fake_quant(d.astype(bool), 0.1, 0, 0, 255), TypeError, "floating dtype"),
    (lambda d: qdask.minmax(d.astype(np.complex64)), TypeError, "floating dtype"),
    (lambda d: qdask.minmax(d, axis=3), ValueError, "axis 3 is out of range"),
    (lambda d: qdask.minmax(d, axis=1.0), TypeError, "axis must be an int"),
    (lambda d: qdask.minmax(d, split_every=1), ValueError, "split_every must be an integer >= 2"),
    (lambda d: qdask.minmax(d, split_every=2.5), ValueError, "split_every"),
    (lambda d: qdask.calibrate(d, qc.MovingAverageMinMaxObserver()), ValueError,
     "tree reduction"),
    (lambda d: qdask.calibrate(d, "minmax"), TypeError, "must be a quantcore observer"),
    (lambda d: qdask.calibrate(d, qc.MinMaxObserver(axis=4)), ValueError, "out of range"),
    (lambda d: qdask.fake_quant(d, 0.1, 0, 0, 255, out=np.empty(d.shape)), TypeError,
     "out= is not supported"),
    (lambda d: qdask.fake_quant(d, 0.0, 0, 0, 255), ValueError, "scale must be finite and > 0"),
    (lambda d: qdask.fake_quant(d, np.nan, 0, 0, 255), ValueError, "scale must be finite"),
    (lambda d: qdask.fake_quant(d, 0.1, 0, 5, 5), ValueError, "quant_min must be < quant_max"),
    (lambda d: qdask.fake_quant(d, [0.1] * 3, 0, 0, 255, axis=1), ValueError, "4 values"),
    (lambda d: qdask.fake_quant(d, 0.1, 0, 0, 255, axis=2), ValueError, "out of range"),
]


@pytest.mark.parametrize("case", range(len(BAD)))
def test_bad_input(case):
    call, exc, fragment = BAD[case]
    d = da.from_array(np.zeros((6, 4), np.float32), chunks=(2, 2))
    with pytest.raises(exc, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        call(d)
