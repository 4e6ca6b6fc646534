import os
import sys

import pytest

import quantcore as qc

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(1, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import track  # noqa: E402  (bench/ on the path first)
# the run's own temporary folder (TMPDIR) and its check for leftovers at the
# end, as in tests/ (a run of bench/ alone loads only this conftest)
from run_tmpdir import TEST_TMPDIR, pytest_sessionfinish  # noqa: E402,F401


@pytest.fixture
def threads():
    """Set quantcore's thread count for one benchmark."""
    def use(n):
        qc.set_num_threads(n)
    yield use
    qc.set_num_threads(None)


def pytest_benchmark_update_machine_info(config, machine_info):
    """Every saved run says what its numbers depend on: CPU kind, model and
    SIMD flags, thread counts, the extension's build variant in use, the
    commit and the load average (``machine_info["quantcore"]``)."""
    from pytest_benchmark.utils import get_commit_info
    machine_info["quantcore"] = track.quantcore_info(machine_info, get_commit_info())
