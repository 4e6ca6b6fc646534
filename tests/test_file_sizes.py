"""No source file of the packages is longer than :data:`MAX_LINES` lines
(a file past it is split along its own sections, as ``compat/torch/``,
``formats/``, ``onnx/``, ``compat/nvidia/`` and
``compat/onnxruntime/`` are, and ``_cpu/_kernels.pyx`` into the
``_kernels_*.pxi`` files it includes), unless ``ALLOWED``
names it with the reason it is still over.  An allowed file that came under
the limit is dropped from the list (the list only shrinks)."""
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("quantcore", "quantcore_gpu")
SOURCES = (".py", ".pyx", ".pxd", ".pxi", ".h", ".cpp", ".cu", ".cuh")
MAX_LINES = 700

#: files still over the limit (path from the repository root): why
ALLOWED = {}


def _generated(path):
    """Cython's output (``x.cpp`` next to ``x.pyx``) is not a source."""
    stem, ext = os.path.splitext(path)
    return ext == ".cpp" and os.path.exists(stem + ".pyx")


def source_files():
    """{path from the root: lines} of every source file of the packages."""
    out = {}
    for pkg in PACKAGES:
        for dirpath, _, files in os.walk(os.path.join(ROOT, pkg)):
            for f in files:
                path = os.path.join(dirpath, f)
                if not f.endswith(SOURCES) or _generated(path):
                    continue
                with open(path, encoding="utf-8") as fh:
                    out[os.path.relpath(path, ROOT).replace(os.sep, "/")] = \
                        sum(1 for _ in fh)
    return out


FILES = source_files()


def test_the_scan_sees_the_packages():
    """The walk finds the sources of every kind (a scan that found nothing
    would pass everything)."""
    assert "quantcore/__init__.py" in FILES and "quantcore_gpu/kernels.py" in FILES
    assert {os.path.splitext(p)[1] for p in FILES} >= {".py", ".pyx", ".pxi", ".h", ".cu"}
    assert FILES["quantcore/_cpu/_kernels_codes.pxi"] > 100   # (counted, not skipped)


def test_no_file_over_the_limit():
    over = {p: n for p, n in FILES.items() if n > MAX_LINES and p not in ALLOWED}
    assert over == {}, (f"over {MAX_LINES} lines (split it along its sections, or add it "
                        f"to ALLOWED with the reason): {over}")


@pytest.mark.parametrize("path", sorted(ALLOWED))
def test_allowed_entries_are_live(path):
    """An allowed file exists, is still over the limit and has a reason."""
    assert path in FILES, f"{path}: no such source file (drop it from ALLOWED)"
    assert FILES[path] > MAX_LINES, (f"{path}: {FILES[path]} lines, under the limit now "
                                     f"(drop it from ALLOWED)")
    assert len(ALLOWED[path]) > 20
