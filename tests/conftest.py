import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

import quantcore

# the run's own temporary folder (TMPDIR) and its check for leftovers at the end
from run_tmpdir import TEST_TMPDIR, pytest_sessionfinish  # noqa: E402,F401

#: set by ``make gpu-emu-test``: cupy is the CUDA emulator of tests/cudaemu
#: (first on PYTHONPATH).  Its self-tests are collected only then: they
#: import the emulated cupy, which must never be seen by the CPU test run.
GPU_EMULATOR = os.environ.get("QC_GPU_EMULATOR") == "1"
collect_ignore = [] if GPU_EMULATOR else ["cudaemu"]


#: hypothesis draws the same examples on every run (CI is reproducible);
#: QC_HYPOTHESIS_RANDOM=1 explores new ones (with QC_HYPOTHESIS_EXAMPLES
#: for more of them)
settings.register_profile(
    "quantcore", deadline=None, derandomize=os.environ.get("QC_HYPOTHESIS_RANDOM") != "1",
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile("quantcore")


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False, help="run slow tests")
    parser.addoption("--mirror-cupy", action="store_true", default=False,
                     help="repeat every compat-layer call on cupy copies of its arrays and "
                          "compare the bits (tests/mirror.py; needs a GPU or the emulator)")


#: the test modules --mirror-cupy runs: every compat layer's and calibrator's own tests
MIRRORED_TESTS = ("test_compat_tensorflow", "test_compat_tensorflow_live", "test_compat_torch",
                  "test_compat_torch_core_gaps", "test_compat_torch_random",
                  "test_compat_nvidia", "test_compat_mindspore", "test_compat_oneflow",
                  "test_compat_horizon", "test_calib", "test_calib_search")


@pytest.fixture(autouse=True)
def _mirror_cupy(request):
    """With --mirror-cupy: the compat API of this test runs on numpy and on
    cupy, and must agree (tests/mirror.py)."""
    if not request.config.getoption("--mirror-cupy") or \
            request.module.__name__ not in MIRRORED_TESTS:
        yield
        return
    import importlib

    import cupy
    import mirror
    modules = [importlib.import_module(name) for name in mirror.MODULES]
    patches = mirror.install(modules, cupy, vars(request.module))
    try:
        yield
    finally:
        mirror.uninstall(patches)


def pytest_collection_modifyitems(config, items):
    emulator_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cudaemu")
    mirrored = config.getoption("--mirror-cupy")
    if mirrored:  # MIRRORED_TESTS is the one list: `make gpu-emu-mirror` passes all of tests/
        config.hook.pytest_deselected(
            items=[item for item in items if item.module.__name__ not in MIRRORED_TESTS])
        items[:] = [item for item in items if item.module.__name__ in MIRRORED_TESTS]
    for item in items:
        if str(item.path).startswith(emulator_dir) or mirrored:
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


@pytest.fixture(params=[False, True], ids=["idx32", "idx64"])
def index64(request, monkeypatch):
    """Run a GPU test with the 32-bit and (forced) 64-bit index
    instantiations of the kernels (``quantcore_gpu._runtime.FORCE_INDEX64``)."""
    from quantcore_gpu import _runtime
    monkeypatch.setattr(_runtime, "FORCE_INDEX64", request.param)
    return request.param
