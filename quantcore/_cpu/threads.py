"""Thread count, resolved in Python once per call and passed to every prange.

Order of precedence:

1. ``quantcore.set_num_threads(n)`` (``None`` clears it);
2. otherwise the OpenMP runtime's ``omp_get_max_threads()``, which honours
   ``OMP_NUM_THREADS`` and limits set through ``threadpoolctl``.

Arrays smaller than ``PARALLEL_THRESHOLD`` elements always run on one
thread: below it, starting the team costs more than it saves (measured in
``bench/threshold.py``; see the README's benchmark notes).  A one-thread
call runs on the calling thread and never enters an OpenMP parallel region.

Two limits come on top, each announced by one warning per process:

* **fork.**  GNU libgomp keeps the team of a thread that started a
  parallel region in that thread's pool; after ``os.fork`` the pool's
  threads are gone, and the child's next parallel region from that thread
  waits for them forever (libgomp has no fork handler, and no way to drop
  the pool).  So in a fork child (``os.fork``, ``multiprocessing``'s
  "fork" start method, ``ProcessPoolExecutor`` on Linux before Python
  3.14) the thread that forked runs every kernel on one thread, for the
  child's life, when it (or the thread of the parent it continues) may have
  started a team; ``set_num_threads`` cannot lift it (the pool cannot be
  rebuilt).  Threads the child starts have pools of their own and run in
  parallel.  Results do not depend on the thread count, so the child
  computes the parent's bits.  "spawn" / "forkserver" workers are
  unaffected.
* **thread creation.**  Before the first call of a process with ``n > 1``
  threads, ``n - 1`` threads with the stack libgomp gives its threads
  (``OMP_STACKSIZE``, else the default: RLIMIT_STACK) are started and
  joined once: if that fails (an address-space limit, a thread limit),
  libgomp would fail too and end the process ("Thread creation failed"),
  so the kernels run on one thread instead.
"""
import numbers
import os
import re
import threading

from .. import _warn
from . import _kernels

#: below this many elements a kernel uses one thread (measured, see module doc):
#: arrays up to 32 Ki elements are one work unit anyway; at 64 Ki two threads
#: ran 1.24x (fake_quant) and 1.39x (minmax) faster than one on the 2-core
#: machine kind (bench/threshold.py)
PARALLEL_THRESHOLD = 1 << 16

_lock = threading.Lock()
_user_threads = None
#: idents of the threads that resolved more than one thread (each may hold a
#: libgomp pool, lost in a fork child)
_team_threads = set()
#: in a fork child: the ident of the thread that forked, if its pool is lost
_serial_thread = None
#: the largest team size whose threads could be created (the probe); 0: none
#: probed yet; None: the probe failed, every call runs on one thread
_probed = 0
_warned = set()


def set_num_threads(n):
    """Set the number of threads quantcore's CPU kernels use.

    Parameters
    ----------
    n : int or None
        A positive thread count, or None to go back to the OpenMP default
        (``OMP_NUM_THREADS`` / threadpoolctl / all cores).

    Notes
    -----
    In a fork child, the thread that forked stays on one thread whatever
    ``n`` (see the module's notes: its OpenMP pool cannot be rebuilt).
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
    if n is not None and n > 1 and _serial_thread == threading.get_ident():
        _warn_once("fork-set", f"set_num_threads({n}) in a fork child: this thread keeps "
                   "running quantcore's kernels on one thread (GNU libgomp cannot rebuild "
                   "the OpenMP thread pool the parent's thread left behind); threads this "
                   "process starts run on the threads asked for")


def _requested():
    """The thread count asked for (set_num_threads, else OpenMP's), >= 1."""
    if _user_threads is not None:
        return _user_threads
    return max(1, _kernels.omp_max_threads())


def get_num_threads():
    """The number of threads the next large kernel call of this thread will
    use (1 in a fork child's forking thread, or where threads cannot be
    created; see the module's notes)."""
    n = _requested()
    if n > 1 and (_serial_thread == threading.get_ident() or _probed is None):
        return 1
    return n


def effective_n_threads(n_elements):
    """Threads for a kernel over ``n_elements``: 1 below the threshold."""
    if n_elements < PARALLEL_THRESHOLD:
        return 1
    n = _requested()
    if n == 1:
        return 1
    ident = threading.get_ident()
    if ident == _serial_thread:
        _warn_once("fork", "quantcore: this process was forked from one that ran OpenMP "
                   "kernels; its kernels run on one thread from the forking thread (GNU "
                   "libgomp's thread pool does not survive fork): same results, less "
                   "speed.  Use the 'spawn' or 'forkserver' start method, or call from a "
                   "thread the child starts, for parallel kernels")
        return 1
    if _probed is None or (n > _probed and not _probe(n)):
        return 1
    if ident not in _team_threads:
        _team_threads.add(ident)
    return n


def _warn_once(key, message):
    if key not in _warned:
        _warned.add(key)
        _warn.warn(message, RuntimeWarning)


def omp_stack_size():
    """The stack size libgomp gives its threads, in bytes: ``OMP_STACKSIZE``
    (a number with an optional B / K / M / G suffix, K when none; as
    libgomp parses it), else 0 (the system default, from RLIMIT_STACK, as
    ``threading`` uses too)."""
    value = os.environ.get("OMP_STACKSIZE", "").strip()
    m = re.fullmatch(r"(\d+)\s*([bBkKmMgG]?)", value)
    if not m:
        return 0
    return int(m.group(1)) << {"b": 0, "k": 10, "": 10, "m": 20, "g": 30}[m.group(2).lower()]


def _probe(n):
    """Whether ``n - 1`` threads with libgomp's stack size can exist at once
    (started, then released and joined); on failure, one thread from now on
    and a warning."""
    global _probed
    with _lock:
        if _probed is None or n <= _probed:
            return _probed is not None
        release = threading.Event()
        threads, error = [], None
        size = omp_stack_size()
        old = threading.stack_size()
        try:
            if size:
                threading.stack_size(max(size, 32768))
            for _ in range(n - 1):
                t = threading.Thread(target=release.wait, name="quantcore-thread-probe",
                                     daemon=True)
                t.start()
                threads.append(t)
        except (RuntimeError, MemoryError, ValueError) as e:
            error = e
        finally:
            if size:
                threading.stack_size(old)
            release.set()
            for t in threads:
                t.join()
        if error is None:
            _probed = n
            return True
        _probed = None
    _warn_once("probe", f"quantcore: could not create {n - 1} threads for the OpenMP kernels "
               f"({error}; an address-space or thread limit?): the kernels run on one "
               f"thread (same results, less speed)")
    return False


def _after_fork_in_child():
    """The child of a fork: fresh locks; the forking thread serial when it
    (or the thread it continues) may have started an OpenMP team."""
    global _lock, _serial_thread, _team_threads
    _lock = threading.Lock()
    ident = threading.get_ident()
    if _pool_lost_on_fork() and (ident in _team_threads or ident == _serial_thread):
        _serial_thread = ident
    _team_threads = set()


def _pool_lost_on_fork():
    """True unless the OpenMP runtime loaded is known to handle fork (LLVM
    libomp and Intel's libiomp re-initialise in the child; GNU libgomp does
    not), or there is no OpenMP at all."""
    return _kernels.openmp_enabled() and not _FORK_SAFE_RUNTIME


def _fork_safe_runtime():
    """Whether the process maps an OpenMP runtime with a fork handler and no
    libgomp (from /proc/self/maps; False when it cannot be read)."""
    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
    except OSError:
        return False
    return "libgomp" not in maps and ("libomp" in maps or "libiomp" in maps)


_FORK_SAFE_RUNTIME = _fork_safe_runtime()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
