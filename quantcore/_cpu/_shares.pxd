# The thread-share schedule of the CPU extensions' histogram kernels
# (_hist.pyx: numpy.histogram; _kernels.pyx: torch.histc), declared once.
#
# Each thread counts one contiguous share of the data into its own partial
# histogram, and the caller adds the partials: integer counts, so the result
# does not depend on the thread count.  (The elementwise kernels and the
# reductions use the work-unit scheduler of _kernels.pyx instead: one
# partial per unit would be one histogram per 32 Ki values.)
from cython.parallel cimport prange
from libc.stdint cimport int64_t

cdef enum:
    #: below this many values one thread counts everything (no team)
    SHARE_SERIAL_BELOW = 32768

#: a kernel over one share: fn(x + start, count, t, ctx) counts the `count`
#: values of thread t's share into thread t's partial histogram (ctx: the
#: kernel's arguments)
ctypedef void (*ShareFn)(const float* x, int64_t count, int t, void* ctx) noexcept nogil


cdef inline int share_threads(int64_t size, int nthreads) noexcept nogil:
    """The threads that count ``size`` values: 1 below SHARE_SERIAL_BELOW
    (or for nthreads < 1), else nthreads."""
    return 1 if nthreads < 1 or size < SHARE_SERIAL_BELOW else nthreads


cdef inline void run_shares(ShareFn fn, const float* x, int64_t size, int nt,
                            void* ctx) noexcept nogil:
    """fn on each of nt contiguous shares of ceil(size / nt) values of x
    (the last may be shorter; empty shares are skipped), thread t on share
    t; nt == 1 runs on the calling thread without starting a team."""
    cdef int64_t share = (size + nt - 1) // nt
    cdef int64_t t, start, count
    if nt == 1:
        if size > 0:
            fn(x, size, 0, ctx)
        return
    for t in prange(nt, schedule='static', num_threads=nt):
        start = t * share
        count = size - start
        if count > share:
            count = share
        if count > 0:
            fn(x + start, count, <int>t, ctx)
