"""FakeQuantize.forward's fast path (a plain C-contiguous float32 numpy
array, per tensor, host state: one call of
``_kernels.fake_quantize_step_f32``) against the paths it stands for.

* the fused path it replaces (``FakeQuantize._forward``: the interop
  decorator, input conversion and ``_forward_fused``), step after step,
  with attribute changes between the steps: the same output bytes, mask,
  state (statistics, qparams, batch counts, step; the state arrays keep
  their identity), errors and warnings;
* the general path (a strided view of the same values, which the fused
  kernel does not take: the observer's update, then the qparams, then
  ``ops._affine``): the same bits;
* every case the fast path declines (layouts, aliasing, state it cannot
  write in place) runs the general path once, with its errors, and counts
  the step once.
"""
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import quantcore as qc
from quantcore import ops
from quantcore._cpu import _kernels
from reference import assert_same_bytes as same

F32 = np.float32
RANGES = [(0, 255), (-128, 127), (0, 15), (-8, 7), (0, 1), (3, 200)]
OBSERVERS = {"minmax": lambda: qc.MinMaxObserver(),
             "moving_average": lambda: qc.MovingAverageMinMaxObserver(0.25),
             "moving_average_1": lambda: qc.MovingAverageMinMaxObserver(1.0)}


def spy_general(fq):
    """Count the calls of ``fq``'s general path (``_forward``, looked up on
    the instance by ``forward``)."""
    calls = []
    general = fq._forward

    def spy(x, out=None):
        calls.append(x)
        return general(x, out)
    fq._forward = spy
    return calls


def strided(x):
    """The values of ``x`` in a view that is neither C- nor F-contiguous
    (the fused kernel declines it: the general path)."""
    v = np.zeros(x.shape + (2,), x.dtype)[..., 0]
    v[...] = x
    assert x.size < 2 or not (v.flags.c_contiguous or v.flags.f_contiguous)
    return v


def state(fq):
    """Everything a forward may change, as comparable values."""
    obs = fq.observer
    mask = fq.mask
    mask = mask.get() if hasattr(mask, "get") else mask  # (a device step's mask: cupy)
    return [fq.scale, fq.zero_point, obs.min_val, obs.max_val,
            np.array([obs.num_batches, obs.nonfinite_batches, fq.step]),
            np.array([] if mask is None else [1]), np.zeros(0) if mask is None else mask,
            np.array(fq._mask_shape if fq._mask_shape is not None else (-1,))]


def run(call):
    """(("ok", result) or ("error", type, message), warnings as (category,
    message, file))."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            res = ("ok", call())
        except (ValueError, TypeError) as e:
            res = ("error", type(e), str(e))
    return res, [(w.category, str(w.message), w.filename) for w in caught]


def batch(kind, shape, scale, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * scale).astype(F32)
    flat = x.reshape(-1)
    if flat.size:
        if kind == "nan":
            flat[rng.integers(flat.size)] = np.nan
        elif kind == "inf":
            flat[rng.integers(flat.size)] = -np.inf
        elif kind == "zeros":
            flat[:] = 0.0
        elif kind == "constant":
            flat[:] = -scale
        elif kind == "ties":  # halfway values at scale 1 / 8
            flat[:] = (rng.integers(-40, 40, flat.size) + 0.5) / 8
    return x


SHAPES = st.sampled_from([(0,), (1,), (7,), (1000,), (4099,), (3, 5), (2, 3, 4), (1, 1)])
ACTIONS = st.one_of(
    st.just(("none",)), st.just(("none",)), st.just(("none",)),
    st.tuples(st.just("train"), st.booleans()),
    st.tuples(st.just("observer"), st.booleans()),
    st.tuples(st.just("fake_quant"), st.booleans()),
    st.tuples(st.just("eps"), st.sampled_from([2.0 ** -23, 1e-3, 0.5])),
    st.tuples(st.just("symmetric"), st.booleans()),
    st.tuples(st.just("range"), st.sampled_from(RANGES)),
    st.tuples(st.just("averaging_constant"), st.sampled_from([0.01, 0.5, 1.0])),
    st.tuples(st.just("nan_policy"), st.sampled_from(["skip", "propagate", "raise"])),
    st.tuples(st.just("packed_mask"), st.booleans()),
    st.tuples(st.just("quant_delay"), st.integers(0, 3)),
    st.tuples(st.just("rounding"), st.sampled_from(sorted(ops.ROUNDING))),
    st.tuples(st.just("qparams"), st.sampled_from([0.05, 0.5, 3.0]), st.integers(0, 1)),
    st.tuples(st.just("reset"),),
    st.tuples(st.just("new_observer"), st.sampled_from(sorted(OBSERVERS))),
)
STEPS = st.lists(st.tuples(
    ACTIONS, st.sampled_from(["normal", "normal", "nan", "inf", "zeros", "constant", "ties"]),
    st.sampled_from([0.01, 1.0, 300.0]), st.sampled_from(["none", "new", "x"])),
    min_size=1, max_size=8)


def apply(fq, action):
    """Change ``fq`` as a user may between two forwards."""
    name, args = action[0], action[1:]
    obs = fq.observer
    if name == "train":
        fq.train(args[0])
    elif name == "observer":
        fq.enable_observer(args[0])
    elif name == "fake_quant":
        fq.enable_fake_quant(args[0])
    elif name == "eps":
        fq.eps = args[0]
    elif name == "symmetric":
        fq.symmetric = args[0]
    elif name == "range":
        fq.quant_min, fq.quant_max = args[0]
    elif name == "averaging_constant":
        if isinstance(obs, qc.MovingAverageMinMaxObserver):
            obs.averaging_constant = args[0]
    elif name == "nan_policy":
        obs.nan_policy = args[0]
    elif name == "packed_mask":
        fq.packed_mask = args[0]
    elif name == "quant_delay":
        fq.quant_delay = args[0]
    elif name == "rounding":  # (the kernel's mode: what the horizon layer sets)
        fq._mode = ops.affine_mode(args[0])
    elif name == "qparams":
        fq.scale = args[0]
        fq.zero_point = fq.quant_max if args[1] else fq.quant_min
    elif name == "reset":
        obs.reset()
    elif name == "new_observer":
        fq.observer = OBSERVERS[args[0]]()


@settings(max_examples=120)
@given(shape=SHAPES, observer=st.sampled_from(sorted(OBSERVERS)),
       qrange=st.sampled_from(RANGES), symmetric=st.booleans(),
       packed=st.booleans(), delay=st.integers(0, 2), steps=STEPS)
def test_fast_path_equals_the_fused_path(shape, observer, qrange, symmetric, packed, delay,
                                         steps):
    """Fast (``fq(x)``) and fused (``fq._forward(x)``) paths, step after
    step with any attribute changes between: same results, state, errors
    and warnings; the fast path is taken whenever the step observes or
    quantizes."""
    fast, fused = (qc.FakeQuantize(OBSERVERS[observer](), *qrange, symmetric=symmetric,
                                   quant_delay=delay, packed_mask=packed) for _ in range(2))
    general_calls = spy_general(fast)
    arrays = [fast.scale, fast.zero_point, fast.observer.min_val, fast.observer.max_val]
    for i, (action, kind, scale, out_kind) in enumerate(steps):
        for fq in (fast, fused):
            apply(fq, action)
        if action[0] in ("reset", "new_observer"):
            arrays = [fast.scale, fast.zero_point, fast.observer.min_val, fast.observer.max_val]
        x = batch(kind, shape, scale, i)
        xs = [x.copy(), x.copy()]
        outs = [None if out_kind == "none" else v if out_kind == "x" else np.full_like(v, 7)
                for v in xs]
        before = len(general_calls)
        observe = fast.training and fast.observer_enabled
        quantize = fast.fake_quant_enabled and not (fast.training and
                                                    fast.step < fast.quant_delay)
        r_fast, w_fast = run(lambda: fast(xs[0], out=outs[0]))
        r_fused, w_fused = run(lambda: fused._forward(xs[1], out=outs[1]))
        assert w_fast == w_fused
        assert r_fast[0] == r_fused[0]
        if r_fast[0] == "error":
            assert r_fast == r_fused
        else:
            y_fast, y_fused = r_fast[1], r_fused[1]
            same(y_fast, y_fused)
            assert (y_fast is xs[0]) == (y_fused is xs[1])
            assert (y_fast is outs[0]) == (y_fused is outs[1])
            assert y_fast.flags.c_contiguous == y_fused.flags.c_contiguous
            assert y_fast.flags.owndata == y_fused.flags.owndata
        same(xs[0], xs[1])
        same(state(fast), state(fused))
        assert [a is b for a, b in zip(arrays, [fast.scale, fast.zero_point,
                                                fast.observer.min_val,
                                                fast.observer.max_val])] == [True] * 4
        if observe or quantize:
            assert len(general_calls) == before, f"step {i}: the fast path was not taken"
        else:
            assert len(general_calls) == before + 1


@settings(max_examples=60)
@given(shape=SHAPES, observer=st.sampled_from(sorted(OBSERVERS)),
       qrange=st.sampled_from(RANGES), delay=st.integers(0, 2),
       steps=st.lists(st.tuples(
           st.sampled_from([("none",), ("none",), ("train", False), ("train", True),
                            ("observer", False), ("observer", True), ("fake_quant", False),
                            ("fake_quant", True), ("averaging_constant", 0.5),
                            ("nan_policy", "propagate"),
                            ("nan_policy", "skip"), ("packed_mask", True), ("reset",)]),
           st.sampled_from(["normal", "normal", "nan", "inf", "zeros", "constant", "ties"]),
           st.sampled_from([0.01, 1.0, 300.0]), st.booleans()), min_size=1, max_size=8))
def test_fast_path_equals_the_general_path(shape, observer, qrange, delay, steps):
    """Fast path against the general path (a strided view of the same
    values: the observer's own update, then the qparams and
    ``ops._affine``): the same output bits and state.  (No changes of eps /
    symmetric here: after a skipped non-finite batch the general path
    recomputes the qparams from the unchanged statistics, with the settings
    of the moment, where the fused kernel keeps the last ones, as it always
    has; the other tests change them.)"""
    fast, general = (qc.FakeQuantize(OBSERVERS[observer](), *qrange, quant_delay=delay)
                     for _ in range(2))
    general_calls = spy_general(fast)
    for i, (action, kind, scale, with_out) in enumerate(steps):
        for fq in (fast, general):
            apply(fq, action)
        x = batch(kind, shape, scale, i)
        out = np.empty_like(x) if with_out else None
        before = len(general_calls)
        observe = fast.training and fast.observer_enabled
        quantize = fast.fake_quant_enabled and not (fast.training and
                                                    fast.step < fast.quant_delay)
        r_fast, w_fast = run(lambda: fast(x, out=out))
        r_gen, w_gen = run(lambda: general(strided(x)))
        assert [w[:2] for w in w_fast] == [w[:2] for w in w_gen]
        assert r_fast[0] == r_gen[0] == "ok"
        same(r_fast[1], np.ascontiguousarray(r_gen[1]))
        same(state(fast), state(general))
        assert len(general_calls) == before + (0 if observe or quantize else 1)


def test_attribute_changes_count_at_the_next_call():
    """Every attribute the step reads is read at each call: a change after
    a call gives the next call the general path's result for the new
    value."""
    rng = np.random.default_rng(5)
    x1 = (rng.standard_normal(1024) * 2).astype(F32)
    x2 = (rng.standard_normal(1024) * 3 + 0.5).astype(F32)
    changes = [
        lambda fq: setattr(fq, "quant_min", -128) or setattr(fq, "quant_max", 127),
        lambda fq: setattr(fq, "quant_max", 15),
        lambda fq: setattr(fq, "eps", 0.25),
        lambda fq: setattr(fq, "symmetric", True),
        lambda fq: setattr(fq.observer, "averaging_constant", 0.75),
        lambda fq: fq.disable_observer(),
        lambda fq: fq.disable_fake_quant(),
        lambda fq: fq.eval(),
        lambda fq: setattr(fq, "quant_delay", 5),
        lambda fq: setattr(fq, "packed_mask", True),
        lambda fq: setattr(fq, "_mode", ops.affine_mode("half_away")),
        lambda fq: setattr(fq, "scale", 0.125) or fq.disable_observer(),
        lambda fq: fq.observer.reset(),
        lambda fq: setattr(fq, "observer", qc.MinMaxObserver()),
    ]
    for change in changes:
        fast, general = qc.FakeQuantize(), qc.FakeQuantize()
        calls = spy_general(fast)
        same(fast(x1), general(strided(x1)))
        for fq in (fast, general):
            change(fq)
        same(fast(x2), np.ascontiguousarray(general(strided(x2))))
        same(state(fast), state(general))
        assert len(calls) == (0 if (fast.training and fast.observer_enabled) or
                              fast.fake_quant_enabled else 1)


@pytest.mark.parametrize("qrange", [(-128, 127), (0, 15), (3, 200)])
def test_symmetric_zero_point_follows_a_changed_range(qrange):
    """The symmetric zero point of the float32 steps comes from the range
    at each call (it was fixed at construction in the fused step, unlike
    the general and device paths)."""
    x = np.random.default_rng(2).standard_normal(2048).astype(F32)
    fqs = [qc.FakeQuantize(symmetric=True) for _ in range(3)]
    for fq in fqs:
        fq.quant_min, fq.quant_max = qrange
    y64 = fqs[0](x.astype(np.float64))  # the general path
    same(fqs[1](x), y64.astype(F32))  # the fast path
    same(fqs[2]._forward_fused(x, None), y64.astype(F32))
    zp = qc.qparams.symmetric_zero_point(*qrange)
    assert [int(fq.zero_point[0]) for fq in fqs] == [zp] * 3


class Sub(np.ndarray):
    pass


def declined_cases():
    """(name, make x, make out, make the FakeQuantize's state unusual, the
    forwards of three that decline: a state the fast path cannot write in
    place is replaced by the general path's first step)."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((6, 50)).astype(F32)

    def with_state(fq, name, value):
        fq.observer.__dict__[name] = value

    return [
        ("F-ordered", lambda: np.asfortranarray(x), lambda: None, None, 3),
        ("F-ordered out", lambda: x.copy(), lambda: np.asfortranarray(np.zeros_like(x)), None,
         3),
        ("strided", lambda: x[:, ::2], lambda: None, None, 3),
        ("big-endian", lambda: x.astype(">f4"), lambda: None, None, 3),
        ("float64", lambda: x.astype(np.float64), lambda: None, None, 3),
        ("float16", lambda: x.astype(np.float16), lambda: None, None, 3),
        ("subclass", lambda: x.copy().view(Sub), lambda: None, None, 3),
        ("subclass out", lambda: x.copy(), lambda: np.zeros_like(x).view(Sub), None, 3),
        ("list", lambda: x.tolist(), lambda: None, None, 3),
        ("float64 statistics", lambda: x.copy(), lambda: None,
         lambda fq: (fq(x), with_state(fq, "min_val", np.array(-2.0))), 1),
        ("read-only statistics", lambda: x.copy(), lambda: None,
         lambda fq: (fq(x), fq.observer.max_val.setflags(write=False)), 1),
        ("per-channel qparams", lambda: x.copy(), lambda: None,
         lambda fq: (fq(x), setattr(fq, "scale", [0.5, 0.25]),
                     setattr(fq, "zero_point", [3, 4])), 1),
        ("read-only scale", lambda: x.copy(), lambda: None,
         lambda fq: (fq(x), fq._scale.setflags(write=False)), 1),
    ]


@pytest.mark.parametrize("case", declined_cases(), ids=lambda c: c[0])
def test_declined_cases_take_the_general_path_once(case):
    """What the fast path does not take runs the general path (the one
    FakeQuantize took before it), with the same result and state, and the
    step counted once."""
    _, make_x, make_out, prepare, declined = case
    fast, fused = qc.FakeQuantize(), qc.FakeQuantize()
    if prepare is not None:
        for fq in (fast, fused):
            prepare(fq)
    calls = spy_general(fast)
    for _ in range(3):
        outs = [make_out(), make_out()]
        r_fast, w_fast = run(lambda: fast(make_x(), out=outs[0]))
        r_fused, w_fused = run(lambda: fused._forward(make_x(), out=outs[1]))
        assert w_fast == w_fused and r_fast[0] == r_fused[0] == "ok"
        same(np.asarray(r_fast[1]), np.asarray(r_fused[1]))
        assert (r_fast[1] is outs[0]) == (r_fused[1] is outs[1])
        same(state(fast), state(fused))
    assert len(calls) == declined


@pytest.mark.parametrize("shift", [1, -1, 3])
def test_partially_overlapping_out_is_declined(shift):
    """``out`` sharing part of x's memory is declined (the general path
    copies); out = x, or a view of x's memory exactly, is written in place."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal(1000).astype(F32)
    expect = qc.FakeQuantize()(x.copy())
    fq = qc.FakeQuantize()
    calls = spy_general(fq)
    buf = np.concatenate([x, x[:4]]) if shift > 0 else np.concatenate([x[-4:], x])
    lo = 4 if shift < 0 else 0
    xs = buf[lo:lo + 1000]
    out = buf[lo + shift:lo + shift + 1000]
    y = fq(xs, out=out)
    assert y is out and len(calls) == 1
    same(y, expect)
    fq2 = qc.FakeQuantize()
    calls2 = spy_general(fq2)
    x2 = x.copy()
    assert fq2(x2, out=x2[:]) is not None and not calls2
    same(x2, expect)


@pytest.mark.parametrize("bad", ["read-only", "shape", "dtype", "type"])
def test_bad_out_errors_are_the_general_paths(bad):
    x = np.linspace(-1, 1, 100, dtype=F32)
    out = {"read-only": np.zeros(100, F32), "shape": np.zeros(99, F32),
           "dtype": np.zeros(100, np.float64), "type": [0.0] * 100}[bad]
    if bad == "read-only":
        out.setflags(write=False)
    fast, fused = qc.FakeQuantize(), qc.FakeQuantize()
    r_fast, _ = run(lambda: fast(x, out=out))
    r_fused, _ = run(lambda: fused._forward(x, out=out))
    assert r_fast[0] == "error" and r_fast == r_fused
    assert fast.step == fused.step and fast.observer.num_batches == fused.observer.num_batches


def test_nan_first_batch_and_refusals():
    """A first batch that is skipped gives NaN qparams (class Notes), a
    refused one changes nothing but the step, as the fused path does."""
    x_nan = np.array([np.nan, 1.0, -1.0], F32)
    fq = qc.FakeQuantize()
    calls = spy_general(fq)
    with pytest.warns(RuntimeWarning, match="was skipped"):
        y = fq(x_nan)
    assert np.isnan(y).all() and np.isnan(fq.scale[0]) and not fq.mask.any()
    assert fq.scale.view(np.uint32)[0] == np.array(np.nan, F32).view(np.uint32)
    assert fq.observer.num_batches == 0 and fq.observer.nonfinite_batches == 1
    fq(np.array([-1.0, 1.0], F32))
    general = qc.FakeQuantize()
    general(np.array([-1.0, 1.0]))  # (float64: the general path)
    same(fq.scale, general.scale)
    assert fq.observer.num_batches == 1
    fq2 = qc.FakeQuantize(qc.MinMaxObserver(nan_policy="raise"))
    scale = fq2.scale.copy()
    with pytest.raises(ValueError, match="the batch contains NaN or inf"):
        fq2(x_nan)
    same(fq2.scale, scale)
    assert fq2.step == 1 and fq2.observer.num_batches == 0 and fq2.mask is None
    fq3 = qc.FakeQuantize()
    fq3(np.zeros(0, F32))  # empty: nothing observed, the default qparams kept
    same(fq3.scale, np.ones(1, F32))
    assert fq3.step == 1 and fq3.observer.num_batches == 0
    assert not calls


def test_kernel_entry_declines_without_writing():
    """``fake_quantize_step_f32`` returns None, writing nothing, for any
    argument not of its form (the caller then takes the general path)."""
    x = np.linspace(-1, 1, 64, dtype=F32)
    lo, hi = np.array(np.inf, F32), np.array(-np.inf, F32)
    s, z = np.ones(1, F32), np.zeros(1, np.int64)

    def call(**kw):
        a = dict(x=x, out=None, lo=lo, hi=hi, s=s, z=z)
        a.update(kw)
        return _kernels.fake_quantize_step_f32(a["x"], a["out"], a["lo"], a["hi"], False,
                                               _kernels.OBS_MINMAX, 1.0, 0, a["s"], a["z"], 0,
                                               255, 2.0 ** -23, 0, 0, True, 0, 1)
    ro = s.copy()
    ro.setflags(write=False)
    for kw in (dict(x=x[::2]), dict(x=x.astype(np.float64)), dict(x=x.view(Sub)),
               dict(out=np.zeros(63, F32)), dict(out=np.zeros(64, np.float64)),
               dict(lo=np.array([np.inf], F32)), dict(hi=np.array(-np.inf)), dict(s=ro),
               dict(s=np.ones(2, F32)), dict(z=np.zeros(1, np.int32)),
               dict(z=np.zeros((1, 1), np.int64))):
        assert call(**kw) is None
        assert lo == np.inf and hi == -np.inf and s[0] == 1 and z[0] == 0
    status, y, mask = call()
    assert status == _kernels.OBSERVED and y.dtype == F32 and mask.dtype == np.uint8
    assert (lo, hi) == (np.float32(-1), np.float32(1))
    general = qc.FakeQuantize(qc.MinMaxObserver())
    general(x.astype(np.float64))
    same(s, general.scale)
    same(z, general.zero_point)
    same(y, general(x.astype(np.float64)).astype(F32))


@pytest.mark.gpu
@pytest.mark.parametrize("observer", ["minmax", "moving_average"])
def test_alternating_host_and_device_steps(observer):
    """numpy steps (the fast path) and cupy steps (the device state) in any
    order: the same bits and state as with the fused path for the numpy
    steps; a host step after device steps waits for the state to come back
    (the fast path declines while the device state is ahead)."""
    cp = pytest.importorskip("cupy")
    import quantcore_gpu
    ok, reason = quantcore_gpu.can_use()
    if not ok:
        pytest.skip(str(reason))
    fast, fused = (qc.FakeQuantize(OBSERVERS[observer](), -128, 127) for _ in range(2))
    calls = spy_general(fast)
    rng = np.random.default_rng(11)
    for i, on_device in enumerate([False, True, True, False, False, True, False]):
        x = (rng.standard_normal(700) * (i + 1)).astype(F32)
        if on_device:
            ys = [fq(cp.asarray(x)).get() for fq in (fast, fused)]
        else:
            stale = fast._host_stale
            before = len(calls)
            ys = [fast(x), fused._forward(x)]
            assert len(calls) == before + (1 if stale else 0)
            assert stale == (i in (3, 6))
            same(state(fast), state(fused))  # (read after host steps only: it synchronises)
        same(ys[0], ys[1])
    same(state(fast), state(fused))
