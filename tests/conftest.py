import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

import quantcore

#: set by ``make gpu-emu-test``: cupy is the CUDA emulator of tests/cudaemu
#: (first on PYTHONPATH).  Its self-tests are collected only then: they
#: import the emulated cupy, which must never be seen by the CPU test run.
GPU_EMULATOR = os.environ.get("QC_GPU_EMULATOR") == "1"
collect_ignore = [] if GPU_EMULATOR else ["cudaemu"]


settings.register_profile(
    "quantcore", deadline=None, derandomize=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile("quantcore")


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False, help="run slow tests")


def pytest_collection_modifyitems(config, items):
    emulator_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cudaemu")
    for item in items:
        if str(item.path).startswith(emulator_dir):
            item.add_marker(pytest.mark.gpu)
    if config.getoption("--runslow"):
        return
    skip_slow = pytest.mark.skip(reason="slow: needs --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip_slow)


@pytest.fixture
def threads():
    """Run a test body with a given thread count, restoring the default."""
    def use(n):
        quantcore.set_num_threads(n)
    yield use
    quantcore.set_num_threads(None)


@pytest.fixture
def rng():
    return np.random.default_rng(12345)
