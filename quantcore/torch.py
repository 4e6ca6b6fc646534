"""PyTorch autograd on quantcore's kernels: differentiable fake quantization
for ``torch.Tensor``s (optional: needs ``torch``).

The functions are ``torch.autograd.Function``s and the fake-quantize classes
are ``torch.nn.Module``s with the names, arguments and state-dict keys of
``torch.ao.quantization`` (the semantics of :mod:`quantcore.compat.torch`,
bit for bit with torch 2.13 CPU).  The forward runs quantcore's kernels on
the tensor's own memory -- a CPU tensor is viewed as numpy through DLPack,
a CUDA tensor as cupy -- and the result comes back as a tensor of the
input's device, without a copy.  The backward is the framework's gradient:

* straight-through estimator (``fake_quantize_per_tensor_affine``,
  ``fake_quantize_per_channel_affine``, the FakeQuantize modules)::

      dX = dY * mask,   mask = qmin <= round(x / scale) + zp <= qmax

  (a multiplication, as torch's: NaN * 0 is NaN, -g * 0 is -0.0); no
  gradient for scale / zero_point, as in torch.
* LSQ (``fake_quantize_learnable_per_tensor_affine`` and per channel):
  dX, and dScale / dZeroPoint per element from the compat layer's
  float32 model of torch's kernel, summed by torch's own ``Tensor.sum``
  over a tensor of x's layout -- the reduction torch's backward runs, so the
  sums are torch's to the bit too.

``.grad`` equals what torch's own autograd gives for
``torch.fake_quantize_per_tensor_affine`` / per channel / the learnable ops
on the same inputs, bit for bit (tests/test_autograd_torch.py).

Modules: ``FakeQuantize``, ``FusedMovingAvgObsFakeQuantize`` and
``FixedQParamsFakeQuantize`` are ``torch.ao.quantization.FakeQuantizeBase``
subclasses (so ``model.apply(torch.ao.quantization.disable_observer)``
reaches them), and the observers (``MinMaxObserver``, ...) are
``nn.Module``s; each wraps the :mod:`quantcore.compat.torch` object of the
same name (``module.impl``).  ``observer=`` takes these classes, their
``with_args`` partials, the compat classes or torch's own observer classes
and partials (mapped by name).  The state (``scale``, ``zero_point``, the
enable flags, ``min_val``, ...) lives in the compat object's numpy arrays;
attributes and ``state_dict()`` give tensors that share that memory (in
place updates are seen, as torch's buffers are), ``load_state_dict`` copies
into it, with torch's keys and module versions.  The state stays on the
host: ``module.to(device)`` does not move it (a CUDA input is computed
through cupy and its statistics kept in host arrays, as
:mod:`quantcore.compat.torch` does for cupy arrays).

Tensors that require grad are read through ``detach()``; the autograd
graph is recorded by these Functions.
"""
import functools

import numpy as np
import torch
from torch.ao.quantization.fake_quantize import FakeQuantizeBase

from . import _arrays as A
from . import ops
from .compat import _partial
from .compat import torch as T
from .compat.torch import lsq as _Tlsq

__all__ = [
    "fake_quantize_per_tensor_affine", "fake_quantize_per_channel_affine",
    "fake_quantize_learnable_per_tensor_affine", "fake_quantize_learnable_per_channel_affine",
    "MinMaxObserver", "MovingAverageMinMaxObserver", "PerChannelMinMaxObserver",
    "MovingAveragePerChannelMinMaxObserver", "HistogramObserver", "FixedQParamsObserver",
    "FakeQuantize", "FusedMovingAvgObsFakeQuantize", "FixedQParamsFakeQuantize",
]


# ------------------------------------------------------------ tensor <-> array
def _view(t):
    """numpy (CPU) or cupy (CUDA) view of a tensor's memory, no copy."""
    return A._from_dlpack(t.detach())


def _tensor(a):
    """A numpy / cupy array as a tensor on its device, no copy."""
    if isinstance(a, np.ndarray) and not a.flags.writeable:
        a = a.copy()  # torch.from_numpy warns about read-only memory
    return A._to_framework(a, "torch")


def _host(value):
    """A scale / zero-point argument as numpy (a tensor's values are copied
    to the host; they are a few numbers)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return value


def _like(values, x):
    """``values`` (an array of x's shape) as a tensor laid out as
    ``torch.empty_like(x)`` lays out x's gradient buffers, so that torch's
    reductions over it run in the order torch's own backward runs them."""
    t = _tensor(values)
    if t.stride() == x.stride():
        return t
    return torch.empty_like(x).copy_(t)


# ----------------------------------------------------------- STE functions
class _StraightThrough(torch.autograd.Function):
    """Forward: ``run(view of x) -> (out, mask)`` on quantcore's kernels;
    backward: ``dY * mask`` (quantcore's ste kernel), or ``dY`` where the
    forward did not quantize (mask None)."""

    @staticmethod
    def forward(ctx, x, run):
        view = _view(x)
        out, mask = run(view)
        if A.array_module(out).may_share_memory(out, view):
            out = out.copy()  # (an output must not alias the input)
        ctx.has_mask = mask is not None
        ctx.save_for_backward(_tensor(mask) if mask is not None else None)
        return _tensor(out)

    @staticmethod
    def backward(ctx, grad):
        if not ctx.has_mask:
            return grad, None
        (mask,) = ctx.saved_tensors
        return _tensor(ops.ste_backward(_view(grad), _view(mask))), None


def fake_quantize_per_tensor_affine(input, scale, zero_point, quant_min, quant_max):
    """``torch.fake_quantize_per_tensor_affine`` with the STE backward.

    ``scale`` / ``zero_point`` as Python numbers, or one-element tensors
    (torch's tensor-qparams overload); formula and checks as
    :func:`quantcore.compat.torch.fake_quantize_per_tensor_affine`.
    """
    if isinstance(scale, torch.Tensor) or isinstance(zero_point, torch.Tensor):
        scale, zero_point = np.asarray(_host(scale)), np.asarray(_host(zero_point))

    def run(x):
        return T.fake_quantize_per_tensor_affine_cachemask(x, scale, zero_point, quant_min,
                                                           quant_max)
    return _StraightThrough.apply(input, run)


def fake_quantize_per_channel_affine(input, scale, zero_point, axis, quant_min, quant_max):
    """``torch.fake_quantize_per_channel_affine`` with the STE backward
    (formula and checks as :func:`quantcore.compat.torch.fake_quantize_per_channel_affine`)."""
    scale, zero_point = _host(scale), _host(zero_point)

    def run(x):
        return T.fake_quantize_per_channel_affine_cachemask(x, scale, zero_point, axis,
                                                            quant_min, quant_max)
    return _StraightThrough.apply(input, run)


# ----------------------------------------------------------- LSQ functions
def _learnable_function(forward, terms, total):
    """An autograd Function for one of torch's learnable (LSQ) fake quants:
    ``forward(x, scale, zero_point, *args)`` computes the output,
    ``terms`` the per-element gradients (on the tensor's device), and
    ``total(values, x, scale_or_zero_point, args)`` sums a gradient vector
    with torch's own reduction, as torch's backward does."""

    class _Learnable(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, scale, zero_point, *args):
            out = forward(_view(x), _host(scale), _host(zero_point), *args)
            ctx.save_for_backward(x, scale, zero_point)
            ctx.args = args
            return _tensor(out)

        @staticmethod
        def backward(ctx, grad):
            x, scale, zero_point = ctx.saved_tensors
            dx, ds, dz, summed = terms(_view(grad), _view(x), _host(scale), _host(zero_point),
                                       *ctx.args)
            unused = (None,) * len(ctx.args)
            if summed:  # torch's empty-input return: (x, scale, zero_point)
                return (_tensor(dx), _tensor(ds), _tensor(dz)) + unused
            return (_tensor(dx), total(_like(ds, x), x, scale, ctx.args),
                    total(_like(dz, x), x, zero_point, ctx.args)) + unused

    return _Learnable


# dScale_vec.sum().unsqueeze(0), as torch's per-tensor backward
_LearnablePerTensor = _learnable_function(
    T.fake_quantize_learnable_per_tensor_affine, _Tlsq._lsq_terms_per_tensor,
    lambda values, x, param, args: values.sum().unsqueeze(0).to(param.device))
# dScale_vec.sum(every dim but axis), as torch's per-channel backward (a 1-D x sums all)
_LearnablePerChannel = _learnable_function(
    T.fake_quantize_learnable_per_channel_affine, _Tlsq._lsq_terms_per_channel,
    lambda values, x, param, args: values.sum(list(_Tlsq._lsq_sum_axes(x.ndim, args[0]))))


def fake_quantize_learnable_per_tensor_affine(input, scale, zero_point, quant_min, quant_max,
                                              grad_factor=1.0):
    """``torch._fake_quantize_learnable_per_tensor_affine`` (LSQ) with its
    backward: gradients for input, ``scale`` and ``zero_point`` (float32
    tensors of shape [1]) as torch computes them."""
    return _LearnablePerTensor.apply(input, scale, zero_point, quant_min, quant_max,
                                     grad_factor)


def fake_quantize_learnable_per_channel_affine(input, scale, zero_point, axis, quant_min,
                                               quant_max, grad_factor=1.0):
    """``torch._fake_quantize_learnable_per_channel_affine`` (LSQ) with its
    backward: gradients for input, ``scale`` and ``zero_point`` ([C])."""
    return _LearnablePerChannel.apply(input, scale, zero_point, axis, quant_min, quant_max,
                                      grad_factor)


# ------------------------------------------------------------------ modules
class _Wrapped:
    """What the modules share: ``impl`` is the compat object; its array
    attributes read as tensors sharing their memory; state dicts with
    torch's keys that share that memory too."""

    #: names of the compat object's own state arrays (the state-dict keys)
    _STATE = ()

    def __getattr__(self, name):
        try:
            return torch.nn.Module.__getattr__(self, name)
        except AttributeError:
            impl = self.__dict__.get("impl")
            if impl is None or name.startswith("__"):
                raise
        value = getattr(impl, name)
        return _tensor(value) if isinstance(value, np.ndarray) else value

    def __setattr__(self, name, value):
        impl = self.__dict__.get("impl")
        if impl is not None and name in self._STATE:
            # assigning a buffer binds a new array, as assigning a torch buffer
            value = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value
            setattr(impl, name, np.array(value, dtype=getattr(impl, name).dtype))
            return
        torch.nn.Module.__setattr__(self, name, value)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        for name in self._STATE:
            destination[prefix + name] = _tensor(getattr(self.impl, name))

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        local = {name: _host(state_dict[prefix + name]) for name in self._STATE
                 if prefix + name in state_dict}
        if strict:
            missing_keys.extend(prefix + name for name in self._STATE if name not in local)
            for key in state_dict.keys():
                head = key[len(prefix):].split(".", 1)[0]
                if key.startswith(prefix) and head not in self._STATE and \
                        head not in self._modules:
                    unexpected_keys.append(key)
        try:
            self._load_local(local, local_metadata or {})
        except (ValueError, TypeError) as exc:
            error_msgs.append(str(exc))

    def _load_local(self, local, metadata):
        self.impl._load(local, "")

    def extra_repr(self):
        return getattr(self.impl, "extra_repr", lambda: "")()


class _ObserverModule(_Wrapped, torch.nn.Module):
    """An observer of :mod:`quantcore.compat.torch` as an ``nn.Module``."""

    _COMPAT = None
    with_args = classmethod(_partial._with_args)
    with_callable_args = classmethod(_partial._with_callable_args)

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.impl = self._COMPAT(*args, **kwargs)

    @property
    def _STATE(self):
        return type(self.impl)._BUFFERS

    @property
    def _version(self):
        """torch's module version of the observer (its state-dict metadata)."""
        return type(self.impl)._VERSION

    @classmethod
    def _wrap(cls, impl):
        module = cls.__new__(cls)
        torch.nn.Module.__init__(module)
        module.impl = impl
        return module

    def forward(self, x_orig):
        """Record x (its values; no autograd) and return it."""
        self.impl.forward(_view(x_orig))
        return x_orig

    def calculate_qparams(self):
        return tuple(_tensor(np.array(v)) for v in self.impl.calculate_qparams())

    def reset_min_max_vals(self):
        self.impl.reset_min_max_vals()

    def _load_local(self, local, metadata):
        # torch's eps reset for checkpoints without a version (compat _prepare)
        self.impl._prepare(local, "", {"": metadata})
        self.impl._load(local, "")


def _observer_module(name):
    compat = getattr(T, name)
    return type(name, (_ObserverModule,), {
        "_COMPAT": compat, "__module__": __name__,
        "__doc__": f"``torch.ao.quantization.{name}`` as an ``nn.Module`` on "
                   f":class:`quantcore.compat.torch.{name}` (``impl``)."})


MinMaxObserver = _observer_module("MinMaxObserver")
MovingAverageMinMaxObserver = _observer_module("MovingAverageMinMaxObserver")
PerChannelMinMaxObserver = _observer_module("PerChannelMinMaxObserver")
MovingAveragePerChannelMinMaxObserver = _observer_module("MovingAveragePerChannelMinMaxObserver")
HistogramObserver = _observer_module("HistogramObserver")
FixedQParamsObserver = _observer_module("FixedQParamsObserver")

_OBSERVER_MODULES = {cls._COMPAT: cls for cls in (
    MinMaxObserver, MovingAverageMinMaxObserver, PerChannelMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver, HistogramObserver, FixedQParamsObserver)}


def _compat_observer(observer):
    """The compat constructor for an ``observer=`` argument: one of this
    module's observer classes or their partials, a compat class or partial,
    or torch's own observer class or partial (mapped by class name)."""
    partial = getattr(observer, "p", None)
    if isinstance(partial, functools.partial):
        wrapper = _partial._PartialWrapper(functools.partial(_compat_observer(partial.func),
                                                      *partial.args, **partial.keywords))
        wrapper.callable_args = dict(getattr(observer, "callable_args", {}))
        return wrapper
    if isinstance(observer, type):
        if issubclass(observer, _ObserverModule):
            return observer._COMPAT
        if observer.__module__.startswith("torch.ao.quantization") and \
                observer.__name__ in T.__all__:
            return getattr(T, observer.__name__)
    return observer


class _FakeQuantizeModule(_Wrapped, FakeQuantizeBase):
    """A fake-quantize module of :mod:`quantcore.compat.torch` as a
    ``FakeQuantizeBase``: forward through :class:`_StraightThrough`."""

    _COMPAT = None
    _STATE = ("fake_quant_enabled", "observer_enabled", "scale", "zero_point")
    _version = 1
    #: the fused module always returns a new tensor (its mask is all ones
    #: with fake quant off); FakeQuantize returns x itself then
    _ALWAYS_NEW = False

    def __init__(self, *args, **kwargs):
        FakeQuantizeBase.__init__(self)
        # the enable flags live in the compat object (read through __getattr__)
        del self._buffers["fake_quant_enabled"], self._buffers["observer_enabled"]
        self._build(*args, **kwargs)
        self.activation_post_process = _OBSERVER_MODULES.get(
            type(self.impl.activation_post_process), _ObserverModule)._wrap(
                self.impl.activation_post_process)

    def _build(self, observer=T.MovingAverageMinMaxObserver, quant_min=None, quant_max=None,
               **observer_kwargs):
        self.impl = self._COMPAT(_compat_observer(observer), quant_min, quant_max,
                                 **observer_kwargs)

    def forward(self, X):
        impl = self.impl
        if not self._ALWAYS_NEW and impl.fake_quant_enabled[0] != 1:
            impl.forward(_view(X))  # observe only: torch returns X itself
            return X

        def run(x):
            out = impl.forward(x)
            return out, impl._last_mask
        return _StraightThrough.apply(X, run)

    def calculate_qparams(self):
        return tuple(_tensor(np.array(v)) for v in self.impl.calculate_qparams())


class FakeQuantize(_FakeQuantizeModule):
    """``torch.ao.quantization.FakeQuantize`` as a ``FakeQuantizeBase`` on
    :class:`quantcore.compat.torch.FakeQuantize` (``impl``), STE backward."""

    _COMPAT = T.FakeQuantize


class FusedMovingAvgObsFakeQuantize(_FakeQuantizeModule):
    """``torch.ao.quantization.FusedMovingAvgObsFakeQuantize`` on
    :class:`quantcore.compat.torch.FusedMovingAvgObsFakeQuantize`, STE backward."""

    _COMPAT = T.FusedMovingAvgObsFakeQuantize
    _ALWAYS_NEW = True

    def _build(self, observer=T.MovingAverageMinMaxObserver, quant_min=0, quant_max=255,
               **observer_kwargs):
        super()._build(observer, quant_min, quant_max, **observer_kwargs)


class FixedQParamsFakeQuantize(_FakeQuantizeModule):
    """``torch.ao.quantization.FixedQParamsFakeQuantize`` on
    :class:`quantcore.compat.torch.FixedQParamsFakeQuantize`, STE backward."""

    _COMPAT = T.FixedQParamsFakeQuantize

    def _build(self, observer):
        self.impl = self._COMPAT(_compat_observer(observer))
