"""``python -m quantcore`` / the ``quantcore`` console script.

Ctrl-C prints ``quantcore: interrupted`` (status 130) and SIGTERM
``quantcore: terminated`` (status 143), never a traceback, after every
cleanup ran (no output half-written, no temporary left): quantcore/_signals.py.
"""
import sys

from ._signals import EXIT_INTERRUPTED, Terminated, command_signals, end_guard


def main(argv=None):
    """The command line (quantcore.cli.main) under the command's signal
    handling; returns the exit status."""
    try:
        with command_signals():
            end_guard()
            from .cli import main as cli_main   # (Ctrl-C during these imports: 130 too)
            return cli_main(argv)
    except KeyboardInterrupt:
        print("quantcore: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Terminated as exc:
        print("quantcore: terminated", file=sys.stderr)
        return exc.code


if __name__ == "__main__":
    sys.exit(main())
