"""CPU back end: the Cython + OpenMP kernels and the thread-count helper."""
from . import _kernels  # noqa: F401
from .threads import effective_n_threads, get_num_threads, set_num_threads  # noqa: F401

try:
    from ._build_config import BUILD_CONFIG
except ImportError:  # pragma: no cover - only in a broken checkout
    BUILD_CONFIG = {}
