import os
import sys

import pytest

import quantcore as qc

sys.path.insert(0, os.path.dirname(__file__))

import track  # noqa: E402  (bench/ on the path first)


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
