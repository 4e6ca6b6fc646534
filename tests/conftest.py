
import numpy as np
import pytest
from hypothesis import HealthCheck, settings

import quantcore


settings.register_profile(
    "quantcore", deadline=None, derandomize=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile("quantcore")


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False, help="run slow tests")


def pytest_collection_modifyitems(config, items):
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
