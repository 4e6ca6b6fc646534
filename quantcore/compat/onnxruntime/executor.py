"""Threading helpers: the kernels' thread count per calling thread
(:func:`kernel_threads`) and the calibrators' tensor executor."""
import concurrent.futures
import contextlib
import os
import threading

from ..._cpu.threads import PARALLEL_THRESHOLD, effective_n_threads


_local = threading.local()


def _threads(n_elements):
    """Kernel threads for ``n_elements`` values: 1 inside :func:`kernel_threads`
    (1) -- e.g. in the worker threads of a calibrator's ``executor`` -- else
    quantcore's setting (``quantcore.set_num_threads`` / OpenMP)."""
    if n_elements < PARALLEL_THRESHOLD:     # (one thread whatever the setting: per call, fast)
        return 1
    limit = getattr(_local, "threads", None)
    n = effective_n_threads(n_elements)
    return n if limit is None else min(n, limit)


@contextlib.contextmanager
def kernel_threads(n):
    """Limit this thread's histogram / min-max kernels to ``n`` OpenMP threads.

    Used where the cores are already busy (ONNX Runtime's inference, or
    tensors processed in parallel by a calibrator's ``executor``): an
    OpenMP team per tensor then mostly waits for its threads to be
    scheduled (measured: a 64 Ki-value min / max 23 ms on two threads
    instead of 11 us on one, on a loaded 2-core machine)."""
    old = getattr(_local, "threads", None)
    _local.threads = int(n)
    try:
        yield
    finally:
        _local.threads = old


def _one_kernel_thread():
    _local.threads = 1


def tensor_executor(max_workers=None):
    """A ``ThreadPoolExecutor`` for a calibrator's ``executor``: tensors of a
    batch are reduced in parallel, each by a one-thread kernel (the kernels
    release the GIL).  ``max_workers`` defaults to the usable cores."""
    from concurrent.futures import ThreadPoolExecutor
    if max_workers is None:
        max_workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
            (os.cpu_count() or 1)
    return ThreadPoolExecutor(max_workers=max(1, int(max_workers)),
                              thread_name_prefix="quantcore-calib",
                              initializer=_one_kernel_thread)


#: items covering fewer values than this in all are reduced in the calling
#: thread: a future costs tens of microseconds, a one-thread min / max of
#: 64 Ki values about ten
INLINE_VALUES = 1 << 16


def _map_tensors(executor, fn, items, values=None):
    """``[fn(item) for item in items]``, on ``executor`` when there is one
    (the per-tensor work of a batch touches only that tensor's state) and
    the items cover ``values`` (when given) of at least INLINE_VALUES.  The
    first item's error (in order) is raised once no item runs any more:
    the ones not begun are cancelled, the others finish (nothing the caller
    then releases -- a spill file, a batch -- is still in use)."""
    if executor is None or len(items) < 2 or (values is not None and values < INLINE_VALUES):
        return [fn(item) for item in items]
    futures = [executor.submit(fn, item) for item in items]
    try:
        return [f.result() for f in futures]
    except BaseException:
        for f in futures:
            f.cancel()
        concurrent.futures.wait(futures)
        raise
