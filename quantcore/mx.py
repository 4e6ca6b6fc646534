"""Block-scaled formats (OCP MX, NVFP4): the public path of
:mod:`quantcore.formats.mx`, where they are defined."""
import sys

from .formats import mx as _mx

sys.modules[__name__] = _mx  # the same module object: attributes and monkeypatches alike
