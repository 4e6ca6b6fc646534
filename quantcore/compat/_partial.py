"""torch's ``with_args`` / ``with_callable_args`` partials (``_PartialWrapper``),
shared by the framework layers whose modules have them (torch, Horizon)."""
import functools


class _PartialWrapper:
    """torch's ``_PartialWrapper``: a chainable constructor with fixed
    keyword arguments (``p`` is the ``functools.partial``) and, with
    ``with_callable_args``, arguments computed at each construction; each
    call builds a fresh instance."""

    def __init__(self, p):
        self.p = p
        self.callable_args = {}

    def __call__(self, *args, **keywords):
        for name, fn in self.callable_args.items():
            if name not in keywords:
                keywords = {**keywords, name: fn()}
        return self.p(*args, **keywords)

    def __repr__(self):
        return repr(self.p) + repr(self.callable_args)

    def with_args(self, **kwargs):
        return _with_args(self, **kwargs)

    def with_callable_args(self, **kwargs):
        result = _PartialWrapper(self.p)
        result.callable_args = {**self.callable_args, **kwargs}
        return result


def _with_args(cls_or_self, **kwargs):
    return _PartialWrapper(functools.partial(cls_or_self, **kwargs))


def _with_callable_args(cls_or_self, **kwargs):
    return _PartialWrapper(functools.partial(cls_or_self)).with_callable_args(**kwargs)
