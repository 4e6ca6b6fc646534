"""quantcore objects in dask: a FakeQuantize shipped to worker processes
(LocalCluster, processes=True), calibrate's per-block batches and
nan_policy, what the per-channel reduction moves between tasks, and cupy
chunks (on the CUDA emulator: results bit-equal to numpy chunks, and only
each block's own statistics leave the device)."""
import copy
import warnings

import numpy as np
import pytest

da = pytest.importorskip("dask.array")
dask = pytest.importorskip("dask")

import quantcore as qc  # noqa: E402
import quantcore.dask as qdask  # noqa: E402

from reference import assert_bits_equal, bits_equal  # noqa: E402

F32 = np.float32


def data(shape=(40, 24), seed=7):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=shape).astype(F32)
    x[3, 4] = -0.0
    return x


# ------------------------------------------------- worker processes
@pytest.fixture(scope="module")
def client():
    distributed = pytest.importorskip("dask.distributed")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=None)
    client = distributed.Client(cluster)
    try:
        yield client
    finally:
        client.close()
        cluster.close()


def _train(fq, batches):
    """Forward every batch through ``fq``; (outputs, fq) -- runs on a worker."""
    return [fq(b) for b in batches], fq


@pytest.mark.parametrize("axis", [None, 1])
def test_fake_quantize_trains_on_a_worker_like_locally(client, axis):
    """A FakeQuantize (with history) shipped to a worker process, trained
    there and shipped back ends where a local copy ends, bit for bit."""
    xs = [data(seed=s) for s in range(4)]
    fq = qc.FakeQuantize(qc.MovingAverageMinMaxObserver(0.3, axis=axis), axis=axis,
                         quant_delay=1)
    fq(xs[0])
    local = copy.deepcopy(fq)
    outs_local, _ = _train(local, xs[1:])
    outs, remote = client.submit(_train, fq, xs[1:], pure=False).result()
    assert client.run(lambda: 1)  # (both workers alive)
    for a, b in zip(outs, outs_local):
        assert_bits_equal(a, b)
    for got, want in ((remote.scale, local.scale), (remote.observer.min_val,
                                                    local.observer.min_val),
                      (remote.observer.max_val, local.observer.max_val)):
        assert_bits_equal(got, want)
    assert (remote.step, remote.observer.num_batches) == (local.step, local.observer.num_batches)
    assert_bits_equal(remote.backward(np.ones_like(xs[3])), local.backward(np.ones_like(xs[3])))


def test_map_blocks_with_a_fake_quantize(client):
    """``map_blocks(fq)`` ships the module to the workers; in eval mode it is
    a pure function of its state, so every block equals the local call."""
    x = data((64, 24))
    fq = qc.FakeQuantize(qc.MinMaxObserver(axis=1), -8, 7, axis=1)
    fq(x)
    fq.eval()
    y = da.from_array(x, chunks=(16, 24)).map_blocks(fq, dtype=F32).compute()
    assert_bits_equal(y, fq(x))


def test_calibrate_on_workers_skips_only_the_bad_block(client):
    x = data((60, 24))
    x[17, 5] = np.nan  # in the second row block
    d = da.from_array(x, chunks=(15, 8))
    obs = qc.MinMaxObserver(axis=1)
    with pytest.warns(RuntimeWarning, match="a batch containing NaN or inf was skipped"):
        qdask.calibrate(d, obs)
    ref = qc.MinMaxObserver(axis=1)
    for start in (0, 30, 45):
        ref(x[start:start + 15])
    assert bits_equal(obs.min_val, ref.min_val) and bits_equal(obs.max_val, ref.max_val)
    assert (obs.num_batches, obs.nonfinite_batches) == (3, 1)


# ---------------------------------------------- batches and nan_policy
@pytest.mark.parametrize("axis", [None, 0, 1])
def test_calibrate_equals_observing_the_batches(axis):
    """Per tensor every block is a batch; per channel every slab of blocks
    across the channel axis.  +-inf is non-finite too."""
    x = data((30, 20))
    x[2, 3], x[21, 15] = np.inf, np.nan
    chunks = (10, 5)
    d = da.from_array(x, chunks=chunks)
    for policy in ("skip", "propagate"):
        obs = qc.MinMaxObserver(axis=axis, nan_policy=policy)
        ref = qc.MinMaxObserver(axis=axis, nan_policy=policy)
        with dask.config.set(scheduler="synchronous"), warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            qdask.calibrate(d, obs)
            for index in np.ndindex(*d.numblocks):
                if axis is not None:
                    if index[axis] != 0:
                        continue  # a slab: all blocks along the channel axis
                sl = tuple(slice(None) if a == axis else
                           slice(i * chunks[a], (i + 1) * chunks[a]) for a, i in enumerate(index))
                ref(x[sl])
        assert bits_equal(obs.min_val, ref.min_val), (axis, policy)
        assert bits_equal(obs.max_val, ref.max_val), (axis, policy)
        assert (obs.num_batches, obs.nonfinite_batches) == \
            (ref.num_batches, ref.nonfinite_batches), (axis, policy)


def test_minmax_nan_policy():
    x = data((20, 12))
    x[4, 2] = x[13, 7] = np.nan
    x[:, 9] = np.nan  # an all-NaN channel
    with dask.config.set(scheduler="synchronous"):
        d = da.from_array(x, chunks=(6, 5))
        for axis in (None, 1, 0):
            for policy in ("propagate", "omit"):
                lo, hi = qdask.minmax(d, axis=axis, nan_policy=policy)
                elo, ehi = qc.minmax(x, axis=axis, nan_policy=policy)
                assert bits_equal(lo, elo) and bits_equal(hi, ehi), (axis, policy)
        with pytest.raises(ValueError, match="nan_policy must be 'propagate' or 'omit'"):
            qdask.minmax(d, nan_policy="skip")


# ------------------------------------------------- traffic between tasks
class _ResultBytes(dask.callbacks.Callback):
    """Bytes of the arrays that quantcore's reduction tasks return."""

    def __init__(self):
        super().__init__()
        self.nbytes = 0
        self.tasks = 0

    def _posttask(self, key, result, dsk, state, worker_id):
        name = key[0] if isinstance(key, tuple) else key
        if any(str(name).startswith(f) for f in ("_block_stats", "_fold", "getitem")):
            self.tasks += 1
            self.nbytes += _nbytes(result)


def _nbytes(value):
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, (tuple, list)):
        return sum(_nbytes(v) for v in value)
    return 0


def test_per_channel_reduction_moves_each_blocks_own_channels():
    """64 blocks of 32 of 256 channels: every task of the reduction returns
    the statistics of its own channels (4 + 4 + 1 bytes a channel), so the
    total is about blocks x 32 channels, not blocks x 256 (the old
    full-length vectors: 8x more)."""
    x = data((64, 256))
    d = da.from_array(x, chunks=(8, 32))
    blocks, per_block = d.npartitions, 32
    with dask.config.set(scheduler="synchronous"), _ResultBytes() as counted:
        lo, hi = qdask.minmax(d, axis=1, split_every=4)
    elo, ehi = qc.minmax(x, axis=1)
    assert bits_equal(lo, elo) and bits_equal(hi, ehi)
    own = blocks * per_block * 9            # every block's slice, once
    assert counted.tasks >= 2 * blocks      # (the callback saw the reduction's tasks)
    assert counted.nbytes <= 3 * own        # + its getitem + the folds (1 + 1 + 1/3)
    assert counted.nbytes < blocks * 256 * 9 / 2


# ------------------------------------------------------ cupy chunks
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_cupy_chunks_equal_numpy_chunks(dtype):
    cp = pytest.importorskip("cupy")
    x = data((24, 20)).astype(dtype)
    x[5, 7] = np.nan
    host = da.from_array(x, chunks=(8, 5))
    dev = host.map_blocks(cp.asarray, dtype=dtype)
    assert type(dev._meta).__module__.split(".")[0] == "cupy"
    with dask.config.set(scheduler="synchronous"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # skipped batches (asserted above)
        for axis in (None, 1):
            for policy in ("propagate", "omit"):
                got = qdask.minmax(dev, axis=axis, nan_policy=policy)
                want = qdask.minmax(host, axis=axis, nan_policy=policy)
                assert all(isinstance(v, np.ndarray) and bits_equal(g, w)
                           for v, g, w in zip(got, got, want))
            a, b = qc.MinMaxObserver(axis=axis), qc.MinMaxObserver(axis=axis)
            qdask.calibrate(dev, a)
            qdask.calibrate(host, b)
            assert bits_equal(a.min_val, b.min_val) and bits_equal(a.max_val, b.max_val)
            assert (a.num_batches, a.nonfinite_batches) == (b.num_batches, b.nonfinite_batches)
        scale = np.linspace(0.01, 0.2, 20)
        y = qdask.fake_quant(dev, scale, 0, -8, 7, axis=1)
        assert type(y._meta).__module__.split(".")[0] == "cupy"
        want = qdask.fake_quant(host, scale, 0, -8, 7, axis=1)
        # block by block: joining cupy blocks needs CuPy API the emulator lacks
        for got_block, want_block in zip(dask.compute(*y.to_delayed().ravel()),
                                         dask.compute(*want.to_delayed().ravel())):
            assert bits_equal(cp.asnumpy(got_block), want_block)


@pytest.mark.gpu
def test_cupy_chunks_send_only_their_statistics_to_the_host():
    """Device -> host traffic of a per-channel minmax over cupy chunks: each
    block's own (min, max, flags) of its channels, nothing tensor-sized."""
    cp = pytest.importorskip("cupy")
    x = data((64, 96))
    chunks = (16, 24)
    dev = da.from_array(x, chunks=chunks).map_blocks(cp.asarray, dtype=F32)
    dev = dev.persist(scheduler="synchronous")  # the data is on the device first
    blocks = dev.npartitions
    with dask.config.set(scheduler="synchronous"):
        before = dict(cp.TRANSFERS)
        lo, hi = qdask.minmax(dev, axis=1)
        moved = cp.TRANSFERS["to_host"] - before["to_host"]
        calls = cp.TRANSFERS["to_host_calls"] - before["to_host_calls"]
    elo, ehi = qc.minmax(x, axis=1)
    assert bits_equal(lo, elo) and bits_equal(hi, ehi)
    assert calls == 3 * blocks                      # lo, hi, flags of each block
    assert moved == blocks * chunks[1] * (4 + 4 + 1)  # its own 24 channels
    assert moved < x.nbytes / 4
