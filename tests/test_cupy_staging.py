"""``stage_cupy``: how framework layers take cupy arrays through host memory.
Runs on a GPU or on the CUDA emulator (``make gpu-emu-test``), whose cupy
refuses implicit conversion to numpy like CuPy.  The per-layer identity
tests are in test_cupy_compat.py."""
import numpy as np
import pytest

from quantcore import _arrays as A
import quantcore_gpu

pytestmark = pytest.mark.gpu


@pytest.fixture
def cp():
    cupy = pytest.importorskip("cupy")
    ok, reason = quantcore_gpu.can_use()
    if not ok:
        pytest.skip(reason)
    return cupy


def test_numpy_calls_pass_straight_through(cp):
    seen = []

    @A.stage_cupy
    def f(x, *, scale):
        seen.append(x)
        return x * scale

    x = np.arange(4.0)
    assert np.array_equal(f(x, scale=2.0), x * 2)
    assert seen[0] is x


def test_cupy_arguments_are_staged_and_results_come_back(cp):
    @A.stage_cupy
    def f(x, params, *, extra):
        assert type(x) is np.ndarray and type(params[1]) is np.ndarray
        assert type(extra["w"]) is np.ndarray
        return x + params[1], (np.float32(3), x.sum(keepdims=True)), 7

    x = cp.asarray(np.arange(6, dtype=np.float32))
    y, (scalar, total), seven = f(x, (1.0, cp.asarray(np.ones(6, np.float32))),
                                  extra={"w": cp.asarray(np.zeros(2))})
    assert isinstance(y, cp.ndarray) and isinstance(total, cp.ndarray)
    assert np.array_equal(y.get(), np.arange(6, dtype=np.float32) + 1)
    assert scalar == 3 and seven == 7


def test_in_place_updates_reach_the_callers_device_arrays(cp):
    @A.stage_cupy
    def update(state, x):
        state[0] = min(state[0], x.min())
        return x

    state = cp.asarray(np.array([5.0, 9.0], np.float32))
    x = cp.asarray(np.array([1.0, 2.0], np.float32))
    assert update(state, x) is x  # an unmodified input comes back as itself
    assert np.array_equal(state.get(), [1.0, 9.0])


def test_nan_state_is_compared_by_bits(cp, monkeypatch):
    writes = []
    original_copyto = cp.copyto
    monkeypatch.setattr(cp, "copyto", lambda dst, src, *args, **kwargs: (
        writes.append(dst), original_copyto(dst, src, *args, **kwargs)))

    @A.stage_cupy
    def touch(state):
        return None

    touch(cp.asarray(np.array([np.nan], np.float32)))
    assert writes == []  # NaN == NaN bitwise: nothing was written back


def test_unstaged_use_of_cupy_fails_loudly(cp):
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.asarray(cp.asarray(np.ones(2)))


def test_stage_cupy_api_wraps_public_functions_and_methods(cp):
    class Obs:
        def __init__(self):
            self.seen = None

        def __call__(self, x):
            return self.forward(x)

        def forward(self, x):
            self.seen = type(x)
            return x

        def _private(self, x):
            return type(x)

        @property
        def prop(self):
            return 1

    def func(x):
        return x * 2

    ns = {"Obs": Obs, "func": func, "_hidden": func, "__name__": Obs.__module__}
    A.stage_cupy_api(ns, ["Obs", "func"])
    assert ns["_hidden"] is func and ns["func"] is not func
    x = cp.asarray(np.ones(3))
    assert isinstance(ns["func"](x), cp.ndarray)
    obs = Obs()
    assert obs(x) is x and obs.seen is np.ndarray
    assert obs._private(x) is cp.ndarray and obs.prop == 1
    A.stage_cupy_api(ns, ["Obs", "func"])  # idempotent
    assert obs(x) is x


def test_stage_cupy_api_reaches_methods_of_same_module_bases(cp):
    class _Base:
        def forward(self, x):
            return type(x)

    class Public(_Base):
        pass

    ns = {"Public": Public, "__name__": Public.__module__}
    A.stage_cupy_api(ns, ["Public"])
    assert Public().forward(cp.asarray(np.ones(2))) is np.ndarray
    assert type(Public.forward.__wrapped__) is type(lambda: 0)
