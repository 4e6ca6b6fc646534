"""Exception types that keep a framework's exception class and quantcore's.

quantcore reports bad arguments as ``ValueError`` / ``TypeError``; a
framework may raise ``RuntimeError`` (PyTorch's ``TORCH_CHECK``) or
``AssertionError`` (its Python-side ``assert``) for the same call.  The
compat layers raise these subclasses of both, so code written against
either catches them: ``except RuntimeError`` as with torch, ``except
ValueError`` as with the rest of quantcore.
"""

__all__ = ["RuntimeValueError", "RuntimeTypeError", "AssertionValueError"]


class RuntimeValueError(RuntimeError, ValueError):
    """A bad argument value where the framework raises ``RuntimeError``."""


class RuntimeTypeError(RuntimeError, TypeError):
    """A wrong dtype where the framework raises ``RuntimeError`` (e.g. torch's
    "expected scalar type Float but found Double")."""


class AssertionValueError(AssertionError, ValueError):
    """A bad argument value where the framework fails an ``assert``."""
