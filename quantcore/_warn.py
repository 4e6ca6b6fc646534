"""Warnings that point at the caller's line, not at quantcore's own files.

A fixed ``stacklevel`` is wrong as soon as the call goes through a wrapper
(the DLPack interop decorators, a compat layer, a
FakeQuantize calling its observer): the warning then names
``_arrays.py`` or ``fake_quantize.py``.  :func:`warn` walks the stack
instead and attributes the warning to the first frame outside the
quantcore packages, as ``warnings.warn(..., skip_file_prefixes=...)`` does
on Python >= 3.12.
"""
import os
import sys
import warnings

#: directories whose frames are skipped: quantcore and quantcore_gpu
_OWN_DIRS = (os.path.dirname(os.path.abspath(__file__)) + os.sep,
             os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "quantcore_gpu") + os.sep)


def warn(message, category=UserWarning):
    """``warnings.warn(message, category)`` attributed to the user's line:
    the innermost frame outside quantcore / quantcore_gpu."""
    frame = sys._getframe(1)  # the quantcore function that warns
    level = 2                 # (stacklevel 2 names that frame)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_OWN_DIRS):
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)
