"""The command line's signals (``python -m quantcore`` / the ``quantcore``
script): what Ctrl-C and SIGTERM do, so that no signal Python sees leaves a
temporary file or a half-written output behind.

- While the package is imported for the command line (the first second:
  numpy, the extension), Ctrl-C prints ``quantcore: interrupted`` and exits
  with status 130 at once, no traceback (nothing is written yet):
  :func:`guard_imports`, called when this module is imported (the first
  import of ``quantcore/__init__.py``), ended by :func:`end_guard` when the
  command's ``main`` begins.
- While a command runs, Ctrl-C is Python's KeyboardInterrupt and SIGTERM
  raises :class:`Terminated` in the main thread (:func:`command_signals`):
  both unwind the stack, so every ``finally`` and ``with`` block runs (the
  atomic writers drop their temporaries, the spill and spool files close);
  then the command prints one line and exits with 130 / 143.  A second
  SIGTERM ends the process at once (the default action).
"""
import contextlib
import os
import signal
import sys
import threading

__all__ = ["EXIT_INTERRUPTED", "EXIT_TERMINATED", "Terminated", "guard_imports", "end_guard",
           "command_signals"]

#: the shell's statuses for a process ended by SIGINT / SIGTERM (128 + signal)
EXIT_INTERRUPTED, EXIT_TERMINATED = 128 + signal.SIGINT, 128 + signal.SIGTERM

_saved = None


class Terminated(SystemExit):
    """SIGTERM while a command runs (a SystemExit with status 143: the
    stack unwinds, every cleanup runs)."""

    def __init__(self):
        super().__init__(EXIT_TERMINATED)


def _main_thread():
    return threading.current_thread() is threading.main_thread()


def _is_command():
    """Whether this process is the quantcore command starting."""
    argv = list(getattr(sys, "orig_argv", None) or [])
    if "-m" in argv and argv[argv.index("-m") + 1:argv.index("-m") + 2] == ["quantcore"]:
        return True
    return bool(sys.argv) and os.path.basename(sys.argv[0]) in ("quantcore", "quantcore.exe")


def _exit_interrupted(signum, frame):
    try:
        sys.stderr.write("quantcore: interrupted\n")
        sys.stderr.flush()
    finally:
        os._exit(EXIT_INTERRUPTED)


def guard_imports():
    """Ctrl-C exits with 130 and one line while the command's imports run
    (only in the quantcore command, only where Ctrl-C has Python's default
    handler)."""
    global _saved
    if _saved is None and _main_thread() and _is_command() and \
            signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        _saved = signal.signal(signal.SIGINT, _exit_interrupted)


def end_guard():
    """Ctrl-C is KeyboardInterrupt again (the command handles it)."""
    global _saved
    if _saved is not None and _main_thread():
        signal.signal(signal.SIGINT, _saved)
        _saved = None


def _raise_terminated(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)   # a second SIGTERM ends it at once
    raise Terminated()


@contextlib.contextmanager
def command_signals():
    """SIGTERM raises :class:`Terminated` in the main thread while the
    block runs (where SIGTERM has its default action: a handler someone
    else set, or SIG_IGN, is kept)."""
    if not _main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


guard_imports()   # (imported first by quantcore/__init__.py)
