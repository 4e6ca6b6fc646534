"""The test run's own temporary folder, shared by tests/conftest.py and
bench/conftest.py (either may be the only one a run loads: ``pytest
bench`` alone, ``make test``'s test-bench phase).

Importing this module makes the folder and points TMPDIR (and so pytest's
tmp_path and every child process) at it, never the shared system one:
another process's files there are not this run's, and what quantcore
leaves behind here is found at the end (:func:`pytest_sessionfinish`).
"""
import os
import shutil
import tempfile

import pytest

TEST_TMPDIR = tempfile.mkdtemp(prefix="qc-")   # short: paths end up in wrapped reports
os.environ["TMPDIR"] = TEST_TMPDIR
tempfile.tempdir = None


def pytest_sessionfinish(session, exitstatus):
    """Fail the run when quantcore left a temporary file of its own (a spill
    or spool file, a ``quantcore_*`` folder) in the run's temporary folder;
    then remove the folder (once: both conftests register this hook)."""
    if not os.path.isdir(TEST_TMPDIR):
        return
    # (quantcore-kernels-*: this process's kernel cache with
    # QUANTCORE_KERNEL_CACHE=off, removed at exit by quantcore_gpu.cache's
    # atexit handler, which runs after this hook)
    left = sorted(name for name in os.listdir(TEST_TMPDIR)
                  if (name.startswith(("quantcore", ".quantcore")) or name.endswith(
                      (".spill", ".partial", ".tmp")))
                  and not name.startswith("quantcore-kernels-"))
    shutil.rmtree(TEST_TMPDIR, ignore_errors=True)
    if left:
        print(f"\nquantcore left temporary files behind: {', '.join(left)}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
