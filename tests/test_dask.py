"""quantcore.dask on a LocalCluster with 2 worker processes: results equal a
single-machine pass exactly."""
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
