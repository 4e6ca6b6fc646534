"""What the ``quantcore`` commands share: option helpers (``--tensors``
globs, ``-q``, ranged numbers), the input checks, the note and table
printing, the one-line argparse errors, and the optional packages' extras.
"""
import argparse
import contextlib
import fnmatch
import functools
import os
import sys
import textwrap

from .cli_files import CliError, list_tensors, one_line

#: notes and warnings are wrapped to this many columns
NOTE_WIDTH = 100


def match_tensors(keys, patterns, aliases=None):
    """The keys that match one of the globs ``patterns`` (a key also
    matches by its alias: its bare name when keys are FILE:name);
    CliError naming the globs that match nothing.  ``calibrate`` and
    ``quantize`` select with this."""
    keys = list(keys)
    aliases = keys if aliases is None else aliases
    if isinstance(aliases, (str, bytes)) or len(aliases) != len(keys):
        # zip() would stop at the shorter one and skip keys silently
        raise TypeError("match_tensors: aliases must be a list with one alias per key")

    def hit(key, alias):
        return any(fnmatch.fnmatchcase(key, p) or fnmatch.fnmatchcase(alias, p)
                   for p in patterns)
    unmatched = [p for p in patterns if not any(
        fnmatch.fnmatchcase(k, p) or fnmatch.fnmatchcase(a, p) for k, a in zip(keys, aliases))]
    if unmatched:
        raise CliError(f"--tensors: nothing matches {', '.join(unmatched)} (the file(s) hold "
                       f"{short_list(keys, 8)})")
    return [k for k, a in zip(keys, aliases) if hit(k, a)]


def short_list(items, n=6):
    """At most ``n`` items, comma-separated, and how many more."""
    items = list(items)
    more = f", ... (+{len(items) - n} more)" if len(items) > n else ""
    return ", ".join(items[:n]) + more


def check_input(path, expected=".npy, .npz or .safetensors"):
    """CliError unless ``path`` is an existing file (``calibrate`` and
    ``quantize`` report a missing path and a directory alike)."""
    if not os.path.exists(path):
        raise CliError(f"{path}: no such file")
    if os.path.isdir(path):
        raise CliError(f"{path}: is a directory, expected a {expected} file")


def list_checked(path):
    """``list_tensors``, a safetensors file first checked whole as
    ``quantize`` checks it (``calibrate`` and ``fake-quant`` read with this)."""
    if path.endswith(".safetensors"):
        check_input(path)
        open_safetensors(path).close()
    return list_tensors(path)


def open_safetensors(path):
    """A :class:`quantcore.checkpoints.SafetensorsReader`, or a CliError:
    a malformed or truncated file (a tensor whose bytes lie past its end)
    is refused as a whole, by ``calibrate`` and ``quantize`` alike."""
    from .checkpoints import SafetensorsReader
    try:
        return SafetensorsReader(path)
    except ValueError as exc:
        raise CliError(one_line(exc)) from None
    except OSError as exc:
        raise CliError(f"{path}: cannot read: {exc.strerror or one_line(exc)}") from None


def print_notes(notes, width=NOTE_WIDTH):
    """Each note (``warning: ...`` or ``note: ...``) wrapped to ``width``
    columns, continuation lines indented."""
    for note in notes:
        say(note if note.startswith("warning:") else f"note: {note}", width)


def say(text, width=NOTE_WIDTH):
    """Print a summary line wrapped to ``width`` columns."""
    print(textwrap.fill(text, width, subsequent_indent="    ", break_long_words=False,
                        break_on_hyphens=False))


def print_table(head, rows, left=1):
    """A table of strings, columns as wide as their widest cell (nothing
    cut); the first ``left`` columns left-aligned, the others right."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:{'<' if i < left else '>'}{w}}}" for i, w in enumerate(widths))
    header = fmt.format(*head)
    print(header)
    print("-" * len(header))
    for r in rows:
        print(fmt.format(*r).rstrip())


#: optional modules -> the extra of quantcore-fakequant that installs them
EXTRAS = {"sklearn": "demo", "matplotlib": "cli", "tqdm": "cli", "onnx": "onnx",
          "onnxruntime": "onnx", "ml_dtypes": "onnx", "torch": "torch", "dask": "dask",
          "jax": "jax", "tensorflow": "tensorflow", "yaml": "nvidia", "cupy": "gpu"}


def install_hint(module):
    """``pip install 'quantcore-fakequant[EXTRA]'`` for an optional module
    (the distribution's name: ``quantcore`` on PyPI is another project)."""
    top = (module or "").split(".")[0]
    extra = EXTRAS.get(top)
    return (f"pip install 'quantcore-fakequant[{extra}]'" if extra else
            f"pip install {top or 'the missing package'}")


def missing_extra(exc):
    """The one-line message of an ImportError: the module and its extra."""
    name = getattr(exc, "name", None)
    if not name:   # raised by quantcore with its own message (naming the extra)
        return one_line(exc)
    return f"this needs the optional package {name}: {install_hint(name)}"


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit status 2)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see '{self.prog} --help')\n")


def int_in(lo, hi):
    def parse(value):
        try:
            v = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {value!r}") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"must be in {lo}..{hi}, got {v}")
        return v
    return parse


def real_in(lo, hi, lo_open=True):
    def parse(value):
        try:
            v = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
        if not ((lo < v if lo_open else lo <= v) and v <= hi):
            raise argparse.ArgumentTypeError(
                f"must be in {'(' if lo_open else '['}{lo:g}, {hi:g}], got {value}")
        return v
    return parse


def formatter(base):
    """``base`` with room for the command names in the help's first column
    (argparse under-counts the indented sub-command names)."""
    class Formatter(base):
        def __init__(self, prog):
            super().__init__(prog, max_help_position=26, width=92)
            self._action_max_length = 14
    return Formatter


def add_tensors(parser, text):
    """``--tensors PATTERN ...``: globs, in ``calibrate`` and ``quantize``."""
    parser.add_argument("--tensors", nargs="+", metavar="PATTERN",
                        help=f"{text}, e.g. 'blocks.*.weight' (fnmatch globs: * ? [..]; a "
                             "glob that matches nothing is an error)")


def add_quiet(parser):
    """``-q``: the same meaning in ``calibrate`` and ``quantize``."""
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no per-tensor table and no progress bar: the summary lines, "
                             "notes, warnings and errors only")


def progress_bars(quiet):
    """``make(iterable=None, **tqdm options)``: tqdm bars on stderr, not
    left behind, when stderr is a terminal and ``quiet`` is false (``-q``);
    None otherwise, or when tqdm is not installed."""
    if quiet or not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return functools.partial(tqdm, file=sys.stderr, leave=False)


@contextlib.contextmanager
def quiet_ort():
    """ONNX Runtime without its warnings, restored afterwards: its C++
    logger's (session creation: "Removing initializer ...") at severity 3
    (errors) instead of its default 2, and quantize_static's root-logger
    advice to pre-process the model.  The ``onnx`` commands, ``compare`` on
    a model and the demo run in it; errors still show."""
    import logging
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        import onnxruntime
    except ImportError:
        onnxruntime = None
    if onnxruntime is not None:
        onnxruntime.set_default_logger_severity(3)
    try:
        yield
    finally:
        logging.disable(previous)
        if onnxruntime is not None:
            onnxruntime.set_default_logger_severity(2)   # ORT's default (it has no getter)
