"""Thread count, resolved in Python once per call and passed to every prange.

Order of precedence:

1. ``quantcore.set_num_threads(n)`` (``None`` clears it);
2. otherwise the OpenMP runtime's ``omp_get_max_threads()``, which honours
   ``OMP_NUM_THREADS`` and limits set through ``threadpoolctl``.

Arrays smaller than ``PARALLEL_THRESHOLD`` elements always run on one
thread: below it, starting the team costs more than it saves (measured in
``bench/threshold.py``; see the README's benchmark notes).
"""
import numbers
import threading

from . import _kernels

#: below this many elements a kernel uses one thread (measured, see module doc):
#: arrays up to 32 Ki elements are one work unit anyway; at 64 Ki two threads
#: ran 1.24x (fake_quant) and 1.39x (minmax) faster than one on the 2-core
#: machine kind (bench/threshold.py)
PARALLEL_THRESHOLD = 1 << 16

_lock = threading.Lock()
_user_threads = None


def set_num_threads(n):
    """Set the number of threads quantcore's CPU kernels use.

    Parameters
    ----------
    n : int or None
        A positive thread count, or None to go back to the OpenMP default
        (``OMP_NUM_THREADS`` / threadpoolctl / all cores).
    """
    global _user_threads
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, numbers.Integral):
            raise TypeError(f"set_num_threads: n must be a positive int or None, got {n!r}")
        if n < 1:
            raise ValueError(f"set_num_threads: n must be >= 1, got {n}")
        n = int(n)
    with _lock:
        _user_threads = n


def get_num_threads():
    """The number of threads the next large kernel call will use."""
    if _user_threads is not None:
        return _user_threads
    return max(1, _kernels.omp_max_threads())


def effective_n_threads(n_elements):
    """Threads for a kernel over ``n_elements``: 1 below the threshold."""
    if n_elements < PARALLEL_THRESHOLD:
        return 1
    return get_num_threads()
