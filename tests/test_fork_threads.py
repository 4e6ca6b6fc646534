"""Processes and threads: fork safety of the OpenMP kernels and of the
objects' locks, the fallback when threads cannot be created, stateful
objects shared between threads, and the per-channel min / max's scratch.

Every child runs in a subprocess with a timeout, so that a hang (libgomp's
thread pool lost in a fork child) fails the test instead of hanging CI.
"""
import multiprocessing
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import quantcore as qc
from quantcore._cpu import _kernels as K
from quantcore.calib import HistogramCalibrator, MaxCalibrator, TorchHistogram
from quantcore.compat.onnxruntime import MinMaxCalibrater

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT = 90

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")

#: the work of a child: large enough for two threads (above PARALLEL_THRESHOLD)
_WORK = '''
import os, sys, threading
import multiprocessing as mp
import concurrent.futures as cf
import numpy as np
import quantcore as qc


def flat(r):
    if isinstance(r, (tuple, list)):
        return [a for v in r for a in flat(v)]
    return [np.asarray(r)]


def work(seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((64, 4096), dtype=np.float32)
    fq = qc.FakeQuantize(axis=0)
    out = [qc.fake_quant(x, 0.05, 3, 0, 255), qc.minmax(x, axis=1), qc.minmax(x), fq(x),
           fq(x * 2), qc.group_quantize(x, 4, 128)]
    return flat(out)


def same(a, b):
    return len(a) == len(b) and all(u.dtype == v.dtype and np.array_equal(u, v, equal_nan=True)
                                    for u, v in zip(a, b))
'''


def _run(tmp_path, body, env=None, timeout=TIMEOUT):
    """Run ``_WORK + body`` as a script in a subprocess (cwd: the repository)."""
    script = tmp_path / "child.py"
    script.write_text(_WORK + textwrap.dedent(body))
    e = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    e.update(env or {})
    try:
        return subprocess.run([sys.executable, str(script)], cwd=str(tmp_path), env=e,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the child hung (no answer in {timeout} s): {exc.stderr}")


# ------------------------------------------------------------------ fork
_POOL = '''
if __name__ == "__main__":
    qc.set_num_threads(2)             # the parent's kernels start an OpenMP team
    seeds = list(range(4))
    ref = [work(s) for s in seeds]
    how = sys.argv[1] if len(sys.argv) > 1 else "{how}"
    if how == "os.fork":
        pid = os.fork()
        if pid == 0:
            os._exit(0 if all(same(work(s), r) for s, r in zip(seeds, ref)) else 3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        got = ref
    elif how == "executor":
        with cf.ProcessPoolExecutor(2, mp_context=mp.get_context("fork")) as ex:
            got = list(ex.map(work, seeds))
    else:
        with mp.get_context(how).Pool(2) as pool:
            got = pool.map(work, seeds)
    assert all(same(g, r) for g, r in zip(got, ref)), "a child computed other bits"
    print("OK")
'''


@pytest.mark.parametrize("how", [
    pytest.param("os.fork", marks=needs_fork), pytest.param("fork", marks=needs_fork),
    pytest.param("executor", marks=needs_fork), "forkserver", "spawn"])
def test_children_compute_the_parents_bits_and_do_not_hang(tmp_path, how):
    """After the parent ran two-thread kernels, a fork child's kernels run
    (serially) and give the parent's bits; spawn / forkserver workers too."""
    if how in ("fork", "forkserver") and how not in multiprocessing.get_all_start_methods():
        pytest.skip(f"no {how} start method here")
    r = _run(tmp_path, _POOL.replace("{how}", how))
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr


@needs_fork
def test_fork_child_warns_once_and_its_new_threads_run_in_parallel(tmp_path):
    """The forking thread goes serial (one warning, whatever set_num_threads
    says); a thread the child starts has a pool of its own."""
    r = _run(tmp_path, '''
        import warnings
        from quantcore._cpu import threads as T
        qc.set_num_threads(2)
        ref = work(0)
        n = 1 << 18
        pid = os.fork()
        if pid == 0:
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                ok = same(work(0), ref) and same(work(0), ref)
                qc.set_num_threads(2)
                ok = ok and T.effective_n_threads(n) == 1 and qc.get_num_threads() == 1
            fork_warnings = [x for x in w if "forked" in str(x.message)]
            box = {}
            t = threading.Thread(target=lambda: box.update(n=T.effective_n_threads(n),
                                                           r=work(0)))
            t.start()
            t.join()
            ok = ok and box["n"] == 2 and same(box["r"], ref) and len(fork_warnings) == 1
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        print("OK" if os.waitstatus_to_exitcode(status) == 0 else "FAIL")
    ''')
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr


@needs_fork
def test_fork_while_another_thread_holds_the_locks(tmp_path):
    """A fork while another thread holds an observer's, a FakeQuantize's
    and a calibrator's lock: the child's copies are usable."""
    r = _run(tmp_path, '''
        from quantcore.calib import HistogramCalibrator
        qc.set_num_threads(2)
        x = np.random.default_rng(1).standard_normal((64, 4096), dtype=np.float32)
        fq, cal = qc.FakeQuantize(), HistogramCalibrator()
        obs = fq.observer
        fq(x)
        cal.collect(x)
        held, release = threading.Event(), threading.Event()

        def hold():
            with fq._lock, obs._lock, cal._lock:
                held.set()
                release.wait()

        t = threading.Thread(target=hold)
        t.start()
        held.wait()
        pid = os.fork()
        if pid == 0:
            fq(x)
            obs(x)
            cal.collect(x)
            os._exit(0 if cal.hist.sum() == 2 * x.size else 3)
        _, status = os.waitpid(pid, 0)
        release.set()
        t.join()
        print("OK" if os.waitstatus_to_exitcode(status) == 0 else "FAIL")
    ''')
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr


# ------------------------------------------------------- thread creation
@pytest.mark.skipif(not sys.platform.startswith("linux") or not K.openmp_enabled(),
                    reason="needs Linux's RLIMIT_AS and OpenMP")
def test_thread_creation_failure_falls_back_to_one_thread(tmp_path):
    """Under an address-space limit that leaves no room for a 16 MiB thread
    stack (OMP_STACKSIZE), the kernels run on one thread with a warning;
    libgomp would end the process ("Thread creation failed")."""
    r = _run(tmp_path, '''
        import resource, warnings
        qc.set_num_threads(1)
        ref = work(0)                  # one thread: no OpenMP team, no thread yet
        qc.set_num_threads(2)
        vm = next(int(l.split()[1]) for l in open("/proc/self/status")
                  if l.startswith("VmSize")) * 1024
        limit = vm + (10 << 20)        # room for the results, not for a 16 MiB stack
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            got = work(0)
        assert same(got, ref)
        assert any("could not create 1 threads" in str(x.message) for x in w), \\
            [str(x.message) for x in w]
        print("OK")
    ''', env={"OMP_STACKSIZE": "16M"})
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr


def test_omp_stack_size_parses_as_libgomp():
    from quantcore._cpu.threads import omp_stack_size
    env = os.environ.get("OMP_STACKSIZE")
    try:
        for value, expected in (("16M", 16 << 20), ("512", 512 << 10), ("64k", 64 << 10),
                                ("1G", 1 << 30), ("100B", 100), ("", 0), ("bad", 0)):
            os.environ["OMP_STACKSIZE"] = value
            assert omp_stack_size() == expected, value
    finally:
        if env is None:
            os.environ.pop("OMP_STACKSIZE", None)
        else:
            os.environ["OMP_STACKSIZE"] = env


# ------------------------------------------------ objects shared by threads
@pytest.fixture
def fast_switches():
    """Switch threads every microsecond (not 5 ms): every interleaving of
    the objects' read-modify-write steps gets its chance."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def _batches(seed, n_threads, per_thread, size=1 << 12):
    rng = np.random.default_rng(seed)
    return [[rng.uniform(-3, 3, size).astype(np.float32) for _ in range(per_thread)]
            for _ in range(n_threads)]


def _in_threads(step, batches):
    """Each thread feeds its batches to ``step`` after a common barrier."""
    barrier = threading.Barrier(len(batches))
    errors = []

    def run(mine):
        try:
            barrier.wait()
            for b in mine:
                step(b)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(mine,)) for mine in batches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


#: the first batch fixes the range: later batches inside it add counts, so
#: the result does not depend on their order
_FIRST = np.linspace(-4, 4, 1 << 12, dtype=np.float32)


@pytest.mark.parametrize("make, state", [
    (lambda: HistogramCalibrator(), lambda c: c.hist),
    (lambda: HistogramCalibrator(torch_hist=False), lambda c: c.hist),
    (lambda: MaxCalibrator(), lambda c: c.compute_amax()),
    (lambda: TorchHistogram(), lambda c: c.state_dict()["histogram"]),
    (lambda: qc.MinMaxObserver(), lambda o: np.array([o.min_val, o.max_val])),
], ids=["hist-torch", "hist-np", "max", "torch-histogram", "minmax-observer"])
def test_shared_between_threads_is_the_serial_result(make, state, fast_switches):
    """8 threads feeding one object, repeated rounds: the statistic equals
    the serial one bit for bit (counts are not lost: before the locks, the
    histograms lost counts in about half of the rounds)."""
    for rnd in range(16):
        batches = _batches(rnd, 8, 16)
        serial, shared = make(), make()
        for obj in (serial, shared):
            (obj.update if hasattr(obj, "update") else obj.collect)(_FIRST)
        step = serial.update if hasattr(serial, "update") else serial.collect
        for mine in batches:
            for b in mine:
                step(b)
        _in_threads(shared.update if hasattr(shared, "update") else shared.collect, batches)
        assert np.array_equal(state(shared), state(serial)), f"round {rnd}"


def test_ort_calibrater_shared_between_threads(fast_switches):
    serial, shared = MinMaxCalibrater(), MinMaxCalibrater()
    batches = _batches(7, 8, 16)
    for mine in batches:
        for b in mine:
            serial.collect({"t": b})
    _in_threads(lambda b: shared.collect({"t": b}), batches)
    a, b = serial.compute_data()["t"], shared.compute_data()["t"]
    assert np.array_equal(a.range_value, b.range_value)


def test_locked_objects_pickle_and_copy():
    import copy
    import pickle
    cal = HistogramCalibrator(num_bins=64)
    cal.collect(np.arange(100, dtype=np.float32))
    for clone in (pickle.loads(pickle.dumps(cal)), copy.deepcopy(cal)):
        assert clone._lock is not cal._lock
        clone.collect(np.arange(10, dtype=np.float32))
        assert clone.hist.sum() == 110 and cal.hist.sum() == 100


# ------------------------------------------------ per-channel min/max memory
@pytest.mark.parametrize("shape, axis", [((64, 1 << 16), 1), ((4, 1 << 16, 3), 1),
                                         ((1 << 12, 1 << 8), 1), ((1 << 16, 64), 0)])
def test_minmax_scratch_is_bounded_by_the_output(shape, axis):
    """The scratch of a per-channel min / max does not grow with the input:
    at most threads * C partials of (2 values + 1 flag), none on one
    thread."""
    outer = int(np.prod(shape[:axis]))
    C, inner = shape[axis], int(np.prod(shape[axis + 1:]))
    for nthreads in (1, 2, 8):
        bound = 0 if nthreads == 1 else nthreads * C * 9
        sizes = [K.minmax_scratch_bytes(outer * k, C, inner, nthreads, 4)
                 for k in (1, 1 << 12, 1 << 16)]
        assert sizes[1] == sizes[2] <= bound, (sizes, bound)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs RLIMIT_AS")
def test_minmax_per_channel_under_a_memory_limit(tmp_path):
    """128 MiB of float32 with 2**15 channels per row (the layout whose
    partials were one per value: 2.25x the input) under an address-space
    limit 48 MiB above the input: the result.  A scratch above the limit
    (2**18 channels on 128 threads: 288 MiB for an output of 2.25 MiB)
    gives a MemoryError that says what it allocates."""
    r = _run(tmp_path, '''
        import re, resource
        from quantcore._cpu import _kernels as K
        qc.set_num_threads(2)
        x = np.random.default_rng(0).standard_normal((1 << 10, 1 << 15), dtype=np.float32)
        qc.minmax(x[:64], axis=1)      # the OpenMP team exists before the limit
        vm = next(int(l.split()[1]) for l in open("/proc/self/status")
                  if l.startswith("VmSize")) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (vm + (48 << 20), vm + (48 << 20)))
        lo, hi = qc.minmax(x, axis=1)
        assert np.array_equal(lo, x.min(axis=0)) and np.array_equal(hi, x.max(axis=0))
        try:
            K.minmax_channels(x.reshape(-1), 128, 1 << 18, 1, 128)
        except MemoryError as e:
            assert re.match(r"minmax_channels: cannot allocate 301989888 bytes \\(288.0 MiB\\) "
                            r"of scratch", str(e)), str(e)
        else:
            raise AssertionError("no MemoryError")
        print("OK")
    ''')
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), outer=st.integers(1, 40), C=st.sampled_from(
    [1, 3, 100, 5000, 40000]), inner=st.sampled_from([1, 2, 7, 40000]),
    dtype=st.sampled_from([np.float32, np.float64]))
def test_minmax_raw_bits_do_not_depend_on_the_thread_count(seed, outer, C, inner, dtype):
    """The unfinished (lo, hi, flags) of every layout -- signed zeros, NaN,
    infinities in the data -- are bit for bit the same on 1, 2, 3 and 8
    threads (the per-thread shares regroup the fold of the units)."""
    inner = min(inner, max(1, (1 << 19) // C))     # at most 2**19 values
    outer = min(outer, max(1, (1 << 19) // (C * inner)))
    n = outer * C * inner
    assert n <= 1 << 19
    rng = np.random.default_rng(seed)
    pool = np.array([-0.0, 0.0, np.nan, np.inf, -np.inf, 1.5, -2.5, 3.0], dtype)
    x = np.where(rng.random(n) < 0.5, rng.choice(pool, n), rng.standard_normal(n)).astype(dtype)
    runs = [K.minmax_channels(x, outer, C, inner, t) for t in (1, 2, 3, 8)]
    u = np.uint32 if dtype == np.float32 else np.uint64
    for r in runs[1:]:
        for a, b in zip(runs[0], r):
            assert np.array_equal(a.view(u) if a.dtype != np.uint8 else a,
                                  b.view(u) if b.dtype != np.uint8 else b)
