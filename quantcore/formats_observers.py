"""The formats' observers: the public path of
:mod:`quantcore.formats.observers`, where they are defined."""
import sys

from .formats import observers as _observers

sys.modules[__name__] = _observers  # the same module object
