"""Run every call of the compat layers' tests twice: as the test wrote it
(numpy) and again on cupy copies of its array arguments, and fail unless
the two agree bit for bit.

``pytest --mirror-cupy`` (``make gpu-emu-test`` passes it for the compat
test modules, on the CUDA emulator) patches the public functions of the
compat modules and the public methods of their classes for the duration of
each test:

- a function call ``f(*args)`` is repeated as ``f(*device_args)``, where
  every numpy array among the arguments (also inside tuples and lists) is
  a cupy copy (one copy per distinct array, so aliasing is kept); the
  test gets the numpy result.  Array results must come back as cupy arrays
  of the same dtype, shape and bits (NaN lanes: both NaN); other results
  must be equal; arrays the call updates in place must be updated alike;
  when the numpy call raises, the cupy call must raise the same type.
- an object of a public class gets a twin, built from the same arguments
  (host copies of its arrays); each public method call (and ``__call__``)
  on the object is repeated on the twin with cupy arguments and compared
  as above, and after it the array attributes of the two (and of the
  quantcore objects they hold) must agree bit for bit.  Attributes the
  test sets on the object are set on the twin too (host copies), and
  arrays it writes into in place are copied to the twin before the next
  call.
"""
import contextlib
import functools
import types
import warnings

import numpy as np

from reference import bits_equal, to_numpy

#: the modules whose public API is mirrored
MODULES = ("quantcore.compat.tensorflow", "quantcore.compat.torch", "quantcore.compat.nvidia",
           "quantcore.compat.mindspore", "quantcore.compat.oneflow",
           "quantcore.compat.horizon", "quantcore.calib")
#: functions that take no tensor (they configure modules or global state)
SKIP = {"enable_fake_quant", "disable_fake_quant", "enable_observer", "disable_observer",
        "set_march", "get_march"}

#: id(object) -> (object, twin) for the objects made during a test (kept
#: outside the objects: their __dict__ and __eq__ stay as they are)
_TWINS = {}


def _twin_of(obj):
    entry = _TWINS.get(id(obj))
    return entry[1] if entry is not None and entry[0] is obj else None


#: mirrored calls in progress: calls made from inside one (the compat code's
#: own calls, the device replay, a twin's construction) are not mirrored again
_DEPTH = [0]


class _Inside:
    def __enter__(self):
        _DEPTH[0] += 1

    def __exit__(self, *exc):
        _DEPTH[0] -= 1


#: documented refusals of the device path (ValueError messages): the fused
#: op cannot resize an empty cupy per-row buffer in place as torch does
DEVICE_REFUSALS = ("must be resized to",)


class MirrorMismatch(AssertionError):
    pass


@contextlib.contextmanager
def _quiet():
    """The device repeat's warnings are the host call's again: not shown
    (tests count the host call's)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _to_device(value, cp, copies):
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        key = id(value)
        if key not in copies:
            copies[key] = (value, cp.asarray(value))
        return copies[key][1]
    if type(value) in (tuple, list):
        return type(value)(_to_device(v, cp, copies) for v in value)
    if type(value) is dict:
        return {k: _to_device(v, cp, copies) for k, v in value.items()}
    twin = _twin_of(value)
    return value if twin is None else twin


def _same(dev, host):
    d, h = to_numpy(dev), np.asarray(host)
    if d.dtype != h.dtype or d.shape != h.shape:
        return False
    return bits_equal(d, h) if h.dtype.kind == "f" else bool(np.array_equal(d, h))


def _host_copy(value):
    """value with its numpy arrays copied (the twin's own state)."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if type(value) in (tuple, list):
        return type(value)(_host_copy(v) for v in value)
    if type(value) is dict:
        return {k: _host_copy(v) for k, v in value.items()}
    twin = _twin_of(value)
    return value if twin is None else twin


def _compare(host, dev, cp, where, device_results=True):
    """``dev`` (the device call's result) against ``host``; array results
    must be cupy arrays when the call was given cupy arrays
    (``device_results``; a method of an object given none may answer from
    host state)."""
    if isinstance(host, np.ndarray):
        if device_results and not isinstance(dev, cp.ndarray):
            raise MirrorMismatch(f"{where}: numpy gave an array, cupy gave {type(dev).__name__}")
        if not _same(dev, host):
            raise MirrorMismatch(f"{where}: {host.dtype}{host.shape} vs {dev.dtype}{dev.shape}"
                                 f", or their bits differ")
        return
    if isinstance(host, np.generic):
        if not _same(dev, host):
            raise MirrorMismatch(f"{where}: {host!r} vs {dev!r}")
        return
    if type(host) in (tuple, list):
        if type(dev) is not type(host) or len(dev) != len(host):
            raise MirrorMismatch(f"{where}: {type(host).__name__} of {len(host)} vs {dev!r:.80}")
        for i, (h, d) in enumerate(zip(host, dev)):
            _compare(h, d, cp, f"{where}[{i}]", device_results)
        return
    if isinstance(host, float) and host != host:
        if not (isinstance(dev, float) and dev != dev):
            raise MirrorMismatch(f"{where}: NaN vs {dev!r}")
        return
    if isinstance(host, (bool, int, float, str, type(None))):
        if dev != host:
            raise MirrorMismatch(f"{where}: {host!r} vs {dev!r}")


def _replay(name, call_host, call_dev, args, kwargs, cp, twin=False):
    """Run the host call, then the device call; compare; return the host
    result.  A function call whose first argument (the tensor) is not a
    numpy array is not repeated; a method call always is (``twin``: the
    twin's state follows), and its array results must be cupy arrays only
    when the tensor was."""
    copies = {}
    dev_args = _to_device(args, cp, copies)
    dev_kwargs = _to_device(kwargs, cp, copies)
    # the tensor (the first argument) on the host: not a device call of a
    # function (only a method's twin must follow)
    on_device = bool(args) and isinstance(args[0], np.ndarray) and args[0].dtype.kind in "biuf"
    if on_device is False and twin and args and isinstance(args[0], np.generic) and \
            args[0].dtype.kind == "f":
        # a float scalar as the tensor of a method: the twin gets a 0-d device array
        dev_args = (cp.asarray(args[0]),) + tuple(dev_args[1:])
    if not on_device and not twin:
        with _Inside():
            return call_host(*args, **kwargs)
    try:
        with _Inside():
            result = call_host(*args, **kwargs)
    except Exception as exc:
        try:
            with _Inside(), _quiet():
                call_dev(*dev_args, **dev_kwargs)
        except type(exc):
            raise exc from None
        except Exception as dev_exc:
            raise MirrorMismatch(f"{name}: numpy raised {type(exc).__name__}, cupy raised "
                                 f"{type(dev_exc).__name__}: {dev_exc}") from dev_exc
        raise MirrorMismatch(f"{name}: numpy raised {type(exc).__name__}: {exc}; cupy did "
                             "not raise") from exc
    try:
        with _Inside(), _quiet():
            dev_result = call_dev(*dev_args, **dev_kwargs)
    except Exception as exc:
        if isinstance(exc, ValueError) and any(r in str(exc) for r in DEVICE_REFUSALS):
            return result
        raise MirrorMismatch(f"{name}: cupy raised {type(exc).__name__}: {exc}; numpy did "
                             "not raise") from exc
    _compare(result, dev_result, cp, name, on_device)
    for host_arr, dev_arr in copies.values():
        if not _same(dev_arr, host_arr):
            raise MirrorMismatch(f"{name}: an argument updated in place differs")
    return result


def _mirror_function(func, name, cp):
    @functools.wraps(func)
    def mirrored(*args, **kwargs):
        if _DEPTH[0]:
            return func(*args, **kwargs)
        return _replay(name, func, func, args, kwargs, cp)
    mirrored.__mirror_original__ = func
    return mirrored


def _mirror_class(cls, cp, patches, names):
    """Patch cls and its bases in the mirrored modules (``names``) in place,
    and on cls the public methods it inherits from quantcore's other
    classes; record the originals in ``patches`` as (owner, attr, original),
    None where the attribute is new."""
    for klass in cls.__mro__:
        if not klass.__module__.startswith(names):
            continue
        for attr, member in list(vars(klass).items()):
            if type(member) is not types.FunctionType or getattr(member, "__mirror_original__",
                                                                   None):
                continue
            if attr == "__init__":
                patches.append((klass, attr, member))
                setattr(klass, attr, _mirror_init(member))
            elif attr == "__setattr__":
                continue
            elif attr == "__call__" or not attr.startswith("_"):
                patches.append((klass, attr, member))
                setattr(klass, attr, _mirror_method(member, attr, cp))
    for attr in dir(cls):  # public methods inherited from quantcore's core classes
        if (attr.startswith("_") and attr != "__call__") or attr in vars(cls):
            continue
        owner = next(k for k in cls.__mro__ if attr in vars(k))
        member = vars(owner)[attr]
        if owner.__module__.startswith("quantcore.") and \
                not owner.__module__.startswith(names) and type(member) is types.FunctionType:
            patches.append((cls, attr, None))
            setattr(cls, attr, _mirror_method(member, attr, cp))
    if "__setattr__" not in vars(cls):
        patches.append((cls, "__setattr__", None))
        cls.__setattr__ = _mirror_setattr()


def _mirror_init(init):
    @functools.wraps(init)
    def mirrored(self, *args, **kwargs):
        if _DEPTH[0] or type(self).__init__ is not mirrored:
            return init(self, *args, **kwargs)  # (a base's __init__ from a subclass's)
        with _Inside():
            init(self, *args, **kwargs)
            twin = object.__new__(type(self))
            with _quiet():
                init(twin, *_host_copy(args), **_host_copy(kwargs))
        _TWINS[id(self)] = (self, twin)
    mirrored.__mirror_original__ = init
    return mirrored


def _state_arrays(obj, cp, prefix="", depth=0):
    """{"attr" or "holder_attr.attr": (holder, attr, array)} for obj's array
    attributes and those of the quantcore objects it holds (one level down)."""
    found = {}
    for attr, value in list(getattr(obj, "__dict__", {}).items()):
        if isinstance(value, (np.ndarray, cp.ndarray)):
            found[prefix + attr] = (obj, attr, value)
        elif depth == 0 and type(value).__module__.startswith("quantcore"):
            found.update(_state_arrays(value, cp, prefix + attr + ".", 1))
    return found


def _sync_state(obj, twin, cp):
    """Give the twin the object's array state where the two differ before a
    call: the test wrote into the object's arrays in place (every call
    leaves the two equal, :func:`_check_state`)."""
    theirs = _state_arrays(twin, cp)
    for key, (_, _, value) in _state_arrays(obj, cp).items():
        if key in theirs:
            holder, attr, current = theirs[key]
            if not _same(current, value):
                xp = cp if isinstance(current, cp.ndarray) else np
                object.__setattr__(holder, attr, xp.array(value))


def _check_state(obj, twin, cp, name):
    """After a call, the object's array state and the twin's agree."""
    theirs = _state_arrays(twin, cp)
    for key, (_, _, value) in _state_arrays(obj, cp).items():
        if key in theirs and np.shape(value) == tuple(theirs[key][2].shape) and \
                not _same(theirs[key][2], value):
            raise MirrorMismatch(f"{name}: state {key} differs after the call")


def _mirror_method(method, name, cp):
    @functools.wraps(method)
    def mirrored(self, *args, **kwargs):
        twin = _twin_of(self)
        if twin is None or _DEPTH[0]:
            return method(self, *args, **kwargs)
        where = f"{type(self).__name__}.{name}"
        _sync_state(self, twin, cp)
        result = _replay(where, functools.partial(method, self),
                         functools.partial(method, twin), args, kwargs, cp, twin=True)
        _check_state(self, twin, cp, where)
        return result
    mirrored.__mirror_original__ = method
    return mirrored


def _mirror_setattr():
    def mirrored(self, attr, value):
        object.__setattr__(self, attr, value)
        twin = _twin_of(self)
        if twin is not None and not _DEPTH[0]:  # (the test sets it)
            with _Inside():
                setattr(twin, attr, _host_copy(value))
    return mirrored


def install(modules, cp, namespace):
    """Patch the public API of ``modules`` (module objects), and the names
    of ``namespace`` (a test module's globals) bound to its functions;
    returns the undo list for :func:`uninstall`."""
    patches = []
    seen = set()
    names = tuple(module.__name__ for module in modules)
    for module in modules:
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            if name in SKIP:
                continue
            if type(obj) is types.FunctionType:
                patches.append((module, name, obj))
                mirrored = _mirror_function(obj, f"{module.__name__}.{name}", cp)
                setattr(module, name, mirrored)
                for key, value in list(namespace.items()):
                    if value is obj:
                        patches.append((namespace, key, obj))
                        namespace[key] = mirrored
            elif isinstance(obj, type) and obj not in seen:
                seen.add(obj)
                _mirror_class(obj, cp, patches, names)
    return patches


def uninstall(patches):
    _TWINS.clear()
    for owner, attr, original in reversed(patches):
        if isinstance(owner, dict):
            owner[attr] = original
        elif original is None:
            delattr(owner, attr)
        else:
            setattr(owner, attr, original)
