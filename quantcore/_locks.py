"""Per-instance locks of the stateful objects, safe across ``os.fork``.

Every stateful object (observers, FakeQuantize, the calibrators, the
compat layers' calibrators) may be shared between threads: its methods
that read or change its statistics hold the instance's re-entrant lock
(``self._lock``), so concurrent calls run one at a time, each on a
consistent state.  For a statistic that does not depend on the order of
the batches (min / max, max |x|, histogram counts over a fixed range) the
result is then bit for bit the serial one, whatever the interleaving; for
an order-dependent one (a moving average, a histogram whose range grows)
it is the serial result of the order in which the calls took the lock.

A lock held by another thread when the process forks would stay held
forever in the child (only the forking thread survives ``fork``): every
lock made here is replaced by a new, free one in the child
(``os.register_at_fork``), so the child's copy of an object is usable.
"""
import functools
import os
import threading
import weakref

#: objects whose ``_lock`` this module made (their locks are replaced in a fork child)
_owners = weakref.WeakSet()
#: guards the lazy creation of an instance's lock (two threads must not each make one)
_create = threading.Lock()


def new_lock(owner):
    """A new ``threading.RLock`` for ``owner._lock``, replaced by a free one
    in a fork child (the caller stores it as ``owner._lock``)."""
    lock = threading.RLock()
    _owners.add(owner)
    return lock


def instance_lock(obj):
    """``obj._lock``, made on first use (thread-safe) where ``__init__`` or
    an unpickling did not make it."""
    lock = obj.__dict__.get("_lock")
    if lock is None:
        with _create:
            lock = obj.__dict__.get("_lock")
            if lock is None:
                lock = obj.__dict__["_lock"] = new_lock(obj)
    return lock


def locked(method):
    """Decorator: the method runs holding the instance's lock
    (:func:`instance_lock`)."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        with instance_lock(self):
            return method(self, *args, **kwargs)
    return wrapper


def locked_with_other(method):
    """Decorator of ``method(self, other, ...)`` (a merge): it runs holding
    both instances' locks, taken in one global order (by ``id``), so that
    ``a.merge(b)`` and ``b.merge(a)`` at once cannot deadlock."""
    @functools.wraps(method)
    def wrapper(self, other, *args, **kwargs):
        if other is self or not isinstance(other, Locked):
            with instance_lock(self):
                return method(self, other, *args, **kwargs)
        first, second = sorted((self, other), key=id)
        with instance_lock(first), instance_lock(second):
            return method(self, other, *args, **kwargs)
    return wrapper


class Locked:
    """Mixin of an object with a per-instance lock (:func:`locked` methods,
    or ``with self._lock``): pickling and copying leave the lock out, and
    the copy gets a new one."""

    def __getstate__(self):
        with instance_lock(self):
            state = self.__dict__.copy()
        state.pop("_lock", None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.__dict__["_lock"] = new_lock(self)


def _after_fork_in_child():
    """Free locks in the child: a lock another thread of the parent held
    at the fork would never be released."""
    global _create
    _create = threading.Lock()
    for obj in list(_owners):
        if "_lock" in obj.__dict__:
            obj.__dict__["_lock"] = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
