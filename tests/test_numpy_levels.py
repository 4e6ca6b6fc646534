"""numpy's SIMD dispatch level, which some references' results depend on.

numpy picks its float32 reduction order and its pow / exp / log code by the
SIMD level of the CPU (``X86_V2`` SSE4.2, ``X86_V3`` AVX2, ``X86_V4`` and
``AVX512_*``): onnxruntime's DistributionCalibrater, for one, gets other last
bits of ``std`` on an AVX-512 CPU than on an AVX2 one.  No test may expect a
value recorded on another CPU for such a result; ``make test`` runs the
numpy-dependent modules again with the dispatch capped at two lower levels
(``test-numpy-levels`` in the Makefile, ``QC_EXPECT_NUMPY_LEVEL`` set).  These
tests check that the cap really takes effect, so that phase cannot pass by
silently testing the default level again.
"""
import json
import os
import subprocess
import sys

import pytest

#: the dispatch targets of numpy >= 2.4 on x86-64 above each level
ABOVE = {"X86_V3": ("X86_V4", "AVX512_ICL", "AVX512_SPR"),
         "X86_V2": ("X86_V3", "X86_V4", "AVX512_ICL", "AVX512_SPR")}

_PROBE = ("import json; from numpy._core._multiarray_umath import __cpu_features__ as f; "
          "print(json.dumps(f))")


def _features(env_caps=None):
    env = dict(os.environ)
    env.pop("NPY_DISABLE_CPU_FEATURES", None)
    if env_caps is not None:
        env["NPY_DISABLE_CPU_FEATURES"] = " ".join(env_caps)
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)


def _x86():
    return "X86_V2" in _features()


@pytest.mark.parametrize("level", sorted(ABOVE))
def test_cap_turns_the_higher_levels_off(level):
    """NPY_DISABLE_CPU_FEATURES with the Makefile's list leaves no dispatch
    target above ``level`` enabled, on any x86-64 CPU."""
    if not _x86():
        pytest.skip("numpy's x86-64 levels only")
    feats = _features(ABOVE[level])
    assert not any(feats.get(name) for name in ABOVE[level]), feats


def test_this_process_runs_at_the_expected_level():
    """Under ``make test-numpy-levels`` this process's numpy is capped."""
    level = os.environ.get("QC_EXPECT_NUMPY_LEVEL")
    if level is None:
        pytest.skip("QC_EXPECT_NUMPY_LEVEL is set by make test-numpy-levels only")
    from numpy._core._multiarray_umath import __cpu_features__ as feats
    assert level in ABOVE, level
    assert not any(feats.get(name) for name in ABOVE[level]), feats


def test_makefile_caps_match():
    """The Makefile's two caps are the lists above (one list, not two copies
    that drift)."""
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, os.pardir, "Makefile")) as f:
        text = f.read()
    assert "NPY_CAP_AVX2 := " + " ".join(ABOVE["X86_V3"]) in text
    assert "NPY_CAP_BASELINE := X86_V3 $(NPY_CAP_AVX2)" in text
