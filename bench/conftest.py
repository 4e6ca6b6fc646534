import os
import sys

import pytest

import quantcore as qc

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture
def threads():
    """Set quantcore's thread count for one benchmark."""
    def use(n):
        qc.set_num_threads(n)
    yield use
    qc.set_num_threads(None)
