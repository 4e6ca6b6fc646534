"""``quantcore quantize``: weight-only quantization of a safetensors
checkpoint (BF16, F16, F32, F64 or FP8 weights, memory-mapped), written
tensor by tensor, with the size and per-tensor SQNR; ``quantcore
dequantize`` (and :func:`load_dequantized`) reads such a file back to float.

    quantcore quantize weights.safetensors --format int4 --group-size 128 -o q.safetensors
    quantcore quantize weights.safetensors --format int4 --symmetric --recipe awq -o q.safetensors
    quantcore quantize weights.safetensors --format fp8 -o q.safetensors
    quantcore quantize weights.safetensors --format mxfp4 -o q.safetensors
    quantcore dequantize q.safetensors -o back.safetensors

Which tensors (as torchao's and modelopt's weight-only recipes): by
default the 2-D floating-point weight matrices (linear layers), except
embeddings (names holding ``embed``, ``wte``, ``wpe``); everything else is
copied unchanged, bytes for bytes, with a note saying what and why:
convolution kernels (3 or more dimensions), biases, norm weights,
BatchNorm statistics (``running_mean``, ``running_var``,
``num_batches_tracked``), embeddings, integer tensors.  ``--tensors``
(globs, as ``calibrate``) names the tensors to quantize instead, any of
them.

Groups run along the input dimension: a tensor of shape ``(O, I)`` (torch's
``Linear.weight``) is quantized row by row with groups of ``g`` consecutive
values along ``I``; a tensor of more dimensions ``(O, d1, d2, ...)`` (a
convolution kernel, named with ``--tensors``) as the matrix ``(O, K)``,
``K = d1 * d2 * ...`` (its flattened input dimension: what GPTQ and AWQ see
of a conv weight); a 1-D tensor as one row.  Where the group does not fit
``K`` (``K`` not a multiple of it): the onnx recipe and the MX / NVFP4
blocks take a shorter last group (ORT MatMulNBits' padding), with a note;
the other int recipes leave a default-selected matrix unquantized (a note)
and refuse a named one.

Output layout, for a quantized tensor ``W`` seen as ``(R, K)`` (``G =
ceil(K / g)`` groups per row; every scale is a dequantization multiplier;
a 1-D tensor has no ``R`` axis):

- ``--format int4``: ``W.qweight`` U8 ``[R, ceil(K / 2)]``: the 4-bit
  codes two per byte along K, element 2i in the low nibble (ONNX INT4 /
  UINT4 and ORT MatMulNBits order; signed codes as two's-complement
  nibbles); ``W.scales`` F32 ``[R, G]``; ``W.zero_points`` ``[R, G]``
  unless ``--symmetric`` (U8 / I8 integer zero points, F32 for tinygemm and
  hqq, hqq_ort).  Dequantization: ``(q - zero_point) * scale`` (tinygemm:
  ``(q - 8) * scale + zero_point``); symmetric "onnx" / "gptq" have the
  implicit zero point 8 (codes 0..15), symmetric "awq" / "torchao" /
  "onnx_numpy" signed codes -8..7 and zero point 0.
- ``--format int8``: ``W.qweight`` U8 or I8 ``[R, K]``, scales and zero
  points as for int4 (implicit symmetric zero point 128 or 0).
- ``--format fp8``: ``W.qweight`` F8_E4M3 ``[R, K]`` (modelopt recipe,
  one amax per row); ``W.scales`` F32 ``[R]``: ``W ~= decode(qweight) *
  scales``.
- ``--format mxfp8`` / ``mxfp4`` (OCP microscaling, spec §4: blocks of 32
  along K sharing an E8M0 power-of-two scale, scale rule "floor", elements
  RNE): ``W.qweight`` F8_E4M3 ``[R, K]`` (mxfp8) or U8 ``[R, ceil(K / 2)]``
  (mxfp4: e2m1 codes two per byte, element 2i in the low nibble);
  ``W.scales`` U8 ``[R, ceil(K / 32)]``: the E8M0 codes c,
  ``W ~= decode(qweight) * 2**(c - 127)``.
- ``--format nvfp4`` (modelopt's NVFP4 export recipe, spec §5.1: blocks of
  16 along K): ``W.qweight`` U8 ``[R, ceil(K / 2)]`` (e2m1, packed as
  mxfp4); ``W.scales`` F8_E4M3 ``[R, ceil(K / 16)]``; ``W.scale_2`` F32
  ``[1]`` (the per-tensor scale, amax / 2688 over the whole tensor):
  ``W ~= decode(qweight) * f32(scales * scale_2)``.

``__metadata__`` records ``quantcore_format``, ``group_size``, ``recipe``,
``symmetric``, ``bits``, ``packing``, the quantcore version and
``quantcore_tensors`` (JSON: each quantized tensor's original shape and
dtype, which :func:`load_dequantized` restores), besides the input's own
metadata.

What is printed: the size line (input and output bytes of the whole file,
and of the quantized tensors alone with their bits per weight: codes,
scales and zero points over the weights' count) and the SQNR over the
quantized tensors only (float64 over their finite values, ``10 log10(sum
x^2 / sum (x - y)^2)`` with y the dequantized tensor; copied tensors are
exact and are not counted), per tensor and pooled.  A tensor whose
quantized form is not smaller than its input is a warning.  Tensors are
converted a chunk of rows at a time, so the peak memory is a fraction of
the largest tensor's, not the file's.
"""
import json
import math
import re
import time

import numpy as np

from . import formats as F
from .checkpoints import SafetensorsReader, SafetensorsWriter

__all__ = ["load_dequantized", "FORMATS"]

#: elements converted at a time (4 MiB as float32, plus two float64
#: temporaries of the SQNR): the peak stays below the size of a tensor of
#: 16 Mi BF16 elements and above
CHUNK_ELEMENTS = 1 << 20
FORMATS = ("int4", "int8", "fp8", "mxfp4", "mxfp8", "nvfp4")
_INT_FORMATS = ("int4", "int8")
#: block-scaled formats: (block size, element type of quantcore.mx or None for NVFP4)
_BLOCK_FORMATS = {"mxfp4": (32, "e2m1"), "mxfp8": (32, "e4m3"), "nvfp4": (16, None)}
DEFAULT_GROUP_SIZE = 128
#: the metadata keys quantize adds (dequantize drops them)
_META_KEYS = ("quantcore_format", "quantcore_version", "recipe", "group_size", "group_axis",
              "symmetric", "bits", "packing", "quantcore_tensors")
DEFAULT_RECIPE = "onnx"
#: a BatchNorm buffer (copied by default)
_BN_STATS = ("running_mean", "running_var", "num_batches_tracked")
#: an embedding table (copied by default): a name part holding embed, or GPT-2's wte / wpe
_EMBEDDING = re.compile(r"(^|[._])([^._]*embed[^._]*|wte|wpe)([._]|$)", re.IGNORECASE)


def add_parser(sub, formatter=None):
    """Register the ``quantize`` and ``dequantize`` sub-commands on an
    argparse sub-parsers object (``quantcore.cli`` calls this)."""
    from .cli_common import add_quiet, add_tensors
    kw = {"formatter_class": formatter} if formatter else {}
    p = sub.add_parser(
        "quantize", help="weight-only int4 / int8 / fp8 / MX / NVFP4 quantization of a "
                         ".safetensors file",
        description="Quantize the linear layers' weight matrices of a .safetensors checkpoint "
                    "(BF16, F16, F32, F64 or FP8; memory-mapped) group-wise along their input "
                    "dimension to int4 / int8, row-wise to FP8 e4m3fn, or block-scaled to "
                    "MXFP8 / MXFP4 / NVFP4; copy the rest (convolutions, norms, biases, "
                    "BatchNorm statistics, embeddings: a note says which); write packed codes "
                    "+ scales (+ zero points) and print the sizes and each quantized tensor's "
                    "SQNR.  int4 / int8 default to affine groups (zero points), the default "
                    "of ORT MatMulNBits and torchao's int4 weight-only: a group of 128 "
                    "weights is seldom centred on 0, so a zero point costs a byte and buys "
                    "precision (calibrate's per-tensor default is symmetric, as torch's "
                    "weight observers).  Layout: 'python -m pydoc quantcore.cli_quantize'; "
                    "'quantcore dequantize' reads the output back.",
        **kw)
    from .engines import ENGINE_FORMATS, cli as engine_cli
    p.add_argument("file", metavar="FILE", help="input .safetensors, or a model directory")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="output .safetensors "
                                                                        "(or directory)")
    p.add_argument("--format", choices=FORMATS + ENGINE_FORMATS + ("gguf",), default=None,
                   help="default int4 (a model directory: compressed-tensors; gguf: a "
                        "llama.cpp GGUF file of a model directory, --type)")
    p.add_argument("--group-size", type=int, default=None, metavar="G",
                   help=f"int4 / int8 only: values per group along the input dimension "
                        f"(default {DEFAULT_GROUP_SIZE}; MX blocks are 32, NVFP4 16, FP8 one "
                        f"scale per row)")
    sch = p.add_mutually_exclusive_group()
    sch.add_argument("--symmetric", dest="symmetric", action="store_true", default=None,
                     help="int4 / int8 only: symmetric groups (no zero points stored)")
    sch.add_argument("--affine", dest="symmetric", action="store_false",
                     help="int4 / int8 only: affine groups with zero points (the default)")
    p.add_argument("--recipe", choices=F.GROUP_RECIPES, default=None,
                   help=f"int4 / int8 only: group recipe (default {DEFAULT_RECIPE}: ORT "
                        "MatMulNBits)")
    add_tensors(p, "quantize only the tensors whose name matches one of these globs, whatever "
                   "their kind (default: the 2-D weight matrices but embeddings)")
    add_quiet(p)
    engine_cli.add_arguments(p)
    from .engines import gguf_cli
    gguf_cli.add_arguments(p)
    p.set_defaults(run=run)
    d = sub.add_parser(
        "dequantize", help="read a 'quantcore quantize' output back to float32",
        description="Dequantize every tensor that 'quantcore quantize' wrote (codes, scales, "
                    "zero points) back to a float32 tensor of its original name and shape; "
                    "copied tensors are copied.  The values are those the quantize run "
                    "measured its SQNR on.",
        **kw)
    d.add_argument("file", metavar="FILE", help="a .safetensors written by 'quantcore quantize' "
                                                "(or a compressed-tensors model directory)")
    d.add_argument("-o", "--output", required=True, metavar="OUT", help="output .safetensors")
    d.set_defaults(run=run_dequantize)
    return p


def _error(msg):
    from .cli_files import CliError
    return CliError(msg)


class _Sqnr:
    """Signal and noise sums over chunks: SQNR = 10 log10(sum x^2 / sum
    (x - y)^2) in float64 over the finite x (cli.sqnr_db's definition,
    accumulated), and the largest |x - y|."""

    def __init__(self):
        self.signal = self.noise = self.max_err = 0.0

    def add(self, x, y):
        """Add a chunk (x finite: the caller refuses non-finite tensors);
        two float64 temporaries of the chunk's size."""
        x64 = x.reshape(-1).astype(np.float64)
        d = x64 - y.reshape(-1)
        self.signal += float(np.dot(x64, x64))
        self.noise += float(np.dot(d, d))
        if d.size:
            self.max_err = max(self.max_err, float(d.max()), -float(d.min()))

    def merge(self, other):
        self.signal += other.signal
        self.noise += other.noise
        self.max_err = max(self.max_err, other.max_err)

    def db(self):
        return float("inf") if self.noise == 0 else 10 * math.log10(self.signal / self.noise)


# ------------------------------------------------------------------ options
def _bits(fmt):
    return {"int4": 4, "int8": 8, "fp8": 8, "mxfp4": 4, "mxfp8": 8, "nvfp4": 4}[fmt]


def _group(args):
    """Values per scale along K (None: FP8, one scale per row)."""
    if args.format in _BLOCK_FORMATS:
        return _BLOCK_FORMATS[args.format][0]
    return None if args.format == "fp8" else args.group_size


def _settle_options(args):
    """Refuse the options that do not apply to ``--format``; fill in the
    defaults of those that do."""
    if args.format not in _INT_FORMATS:
        given = [opt for opt, value in (("--group-size", args.group_size),
                                        ("--recipe", args.recipe),
                                        ("--symmetric / --affine", args.symmetric))
                 if value is not None]
        if given:
            what = ("one scale per row (modelopt)" if args.format == "fp8" else
                    f"fixed blocks of {_BLOCK_FORMATS[args.format][0]}")
            raise _error(f"{', '.join(given)} applies to --format int4 / int8 only; "
                         f"--format {args.format} has {what}")
        args.symmetric = True   # (the block and fp8 scales are symmetric)
        return
    args.group_size = DEFAULT_GROUP_SIZE if args.group_size is None else args.group_size
    args.recipe = DEFAULT_RECIPE if args.recipe is None else args.recipe
    args.symmetric = bool(args.symmetric)
    if args.group_size < 1:
        raise _error(f"--group-size must be >= 1, got {args.group_size}")
    try:
        F.group_qrange(_bits(args.format), args.recipe, args.symmetric)
    except ValueError as exc:
        raise _error(f"--recipe {args.recipe}: {str(exc).split(': ', 1)[-1]}") from None


# ----------------------------------------------------------------- selection
def _matrix(shape):
    """(rows, K) of a tensor seen as the matrix its groups run along."""
    if len(shape) <= 1:
        return 1, (shape[0] if shape else 1)
    return shape[0], math.prod(shape[1:])


def _why_copied(reader, name):
    """Why the default selection copies a tensor (None: it is quantized)."""
    dt, shape = reader.info(name)
    if name.rsplit(".", 1)[-1] in _BN_STATS:
        return "BatchNorm statistics"
    if not reader.is_float(name):
        return "not floating point"
    if len(shape) < 2:
        return "1-D or scalar: biases, norm weights"
    if len(shape) > 2:
        return ("convolution kernels (3+ dimensions; weight-only formats target linear "
                "layers)")
    if _EMBEDDING.search(name):
        return "embeddings"
    if 0 in shape:
        return "empty"
    return None


def _select(reader, args, notes):
    """The names of the tensors to quantize; what is copied goes to notes."""
    from .cli_common import match_tensors
    names = list(reader)
    copied = {}
    if args.tensors:
        chosen = match_tensors(names, args.tensors)
        for n in chosen:
            dt, shape = reader.info(n)
            if not reader.is_float(n) or 0 in shape:
                raise _error(f"{args.file}: tensor {n!r} ({dt}{list(shape)}) is not a "
                             "non-empty float tensor")
    else:
        chosen = []
        for n in names:
            why = _why_copied(reader, n)
            if why is None:
                chosen.append(n)
            else:
                copied.setdefault(why, []).append(n)
    g = _group(args)
    short = []
    for n in list(chosen):
        k = _matrix(reader.info(n)[1])[1]
        if g is None or k % g == 0:
            continue
        if args.format in _INT_FORMATS and args.recipe != "onnx":
            if args.tensors:
                raise _error(f"tensor {n!r}: its input dimension {k} is not a multiple of "
                             f"--group-size {g} (recipe {args.recipe}; the onnx recipe pads "
                             "the last group)")
            chosen.remove(n)
            copied.setdefault(f"input dimension not a multiple of --group-size {g} "
                              f"(recipe {args.recipe}; --recipe onnx pads the last group)",
                              []).append(n)
        else:
            short.append(f"{n} (K={k})")
    from .cli_common import short_list
    for why, keys in copied.items():
        # BatchNorm statistics (num_batches_tracked is an int) and integer
        # tensors are refused by --tensors: no hint for them
        hint = "; --tensors quantizes them" if why.startswith(
            ("convolution", "1-D", "embeddings")) else ""
        notes.append(f"copied {len(keys)} tensor(s) unchanged, {why}{hint}: {short_list(keys)}")
    if short:
        notes.append(f"{len(short)} tensor(s) end with a shorter last group (the input "
                     f"dimension K is not a multiple of {g}; the group is padded, as ORT "
                     f"MatMulNBits and the MX / NVFP4 references do): {short_list(short)}")
    return chosen


# -------------------------------------------------------------------- layout
def _plan(reader, name, args):
    """The output tensors [(name, dtype, shape)] of one input tensor."""
    shape = reader.info(name)[1]
    rows, k = _matrix(shape)
    lead = (rows,) if len(shape) >= 2 else ()
    if args.format == "fp8":
        return [(f"{name}.qweight", "F8_E4M3", lead + (k,)), (f"{name}.scales", "F32", lead)]
    packed = lead + ((k + 1) // 2,)
    if args.format in _BLOCK_FORMATS:
        bs, elem = _BLOCK_FORMATS[args.format]
        out = [(f"{name}.qweight", "F8_E4M3" if elem == "e4m3" else "U8",
                lead + (k,) if elem == "e4m3" else packed),
               (f"{name}.scales", "U8" if elem else "F8_E4M3", lead + (-(-k // bs),))]
        return out + ([(f"{name}.scale_2", "F32", (1,))] if elem is None else [])
    bits = _bits(args.format)
    qmin, _ = F.group_qrange(bits, args.recipe, args.symmetric)
    code = "I8" if qmin < 0 else "U8"
    ng = -(-k // args.group_size)
    out = [(f"{name}.qweight", "U8" if bits == 4 else code, packed if bits == 4 else lead + (k,)),
           (f"{name}.scales", "F32", lead + (ng,))]
    if not args.symmetric:
        zdt = "F32" if args.recipe in ("tinygemm", "hqq", "hqq_ort") else code
        out.append((f"{name}.zero_points", zdt, lead + (ng,)))
    return out


def _quantize_chunk(x, args, global_scale=None, amax=None):
    """(outputs in _plan order, the dequantized chunk) of float32 rows x
    (NVFP4: without the per-tensor scale, which the caller writes; FP8:
    ``amax`` per row when x is a piece of its rows)."""
    if args.format in _BLOCK_FORMATS:
        from . import mx
        _, elem = _BLOCK_FORMATS[args.format]
        k = x.shape[-1]
        if elem is None:
            q, s, _ = mx.nvfp4_quantize(x, global_scale)
            return [q, s], mx.nvfp4_dequantize(q, s, global_scale, length=k)
        s, q = mx.mx_quantize(x, elem)
        return [q, s], mx.mx_dequantize(s, q, elem, length=k if elem == "e2m1" else None)
    if args.format == "fp8":
        codes, s = F.fp8_quantize(x, amax, axis=0)
        inv = (np.float32(1) / s).astype(np.float32)
        y = F.fp8_dequantize(codes, s, axis=0)
        return [codes, inv], y
    bits = _bits(args.format)
    q, s, z = F.group_quantize(x, bits, args.group_size, symmetric=args.symmetric,
                               recipe=args.recipe)
    y = F.group_dequantize(q, s, z, args.group_size, recipe=args.recipe, bits=bits)
    outs = [F.pack_int4(q) if bits == 4 else q, s]
    if not args.symmetric:
        outs.append(z)
    return outs, y


def _nbytes(entries):
    from .checkpoints import DTYPES
    return sum(DTYPES[dt][0] * math.prod(shape) for _, dt, shape in entries)


def _metadata(reader, args, chosen):
    import quantcore
    meta = dict(reader.metadata)
    meta.update({"quantcore_format": args.format, "quantcore_version": quantcore.__version__,
                 "recipe": {"fp8": "modelopt", "nvfp4": "modelopt", "mxfp4": "ocp_floor",
                            "mxfp8": "ocp_floor"}.get(args.format, args.recipe),
                 "group_size": "row" if _group(args) is None else str(_group(args)),
                 "group_axis": "input (dims 1.. of a tensor, flattened)",
                 "symmetric": str(bool(args.symmetric)).lower(),
                 "bits": str(_bits(args.format)),
                 "packing": "low_first" if args.format in ("int4", "mxfp4", "nvfp4")
                 else "none",
                 "quantcore_tensors": json.dumps(
                     {n: {"shape": list(reader.info(n)[1]), "dtype": reader.info(n)[0]}
                      for n in chosen}, separators=(",", ":"))})
    return meta


def open_checkpoint(path):
    """A SafetensorsReader of an input file, or the CliError that
    ``calibrate`` gives the same file."""
    from .cli_common import check_input, open_safetensors
    check_input(path, ".safetensors")
    return open_safetensors(path)


def run(args):
    """The ``quantize`` command; returns the exit status."""
    from .cli_files import check_writable as _check_writable
    from .engines import cli as engine_cli, gguf_cli
    if args.format == "gguf":  # a model directory to a GGUF file
        return gguf_cli.run(args)
    if args.gguf_type is not None or args.tokenizer_pre is not None or args.imatrix is not None:
        raise _error("--type / --tokenizer-pre / --imatrix apply to --format gguf only")
    if engine_cli.settle(args):  # a model directory: quantcore.engines
        return engine_cli.run(args)
    _settle_options(args)
    if not args.output.endswith(".safetensors"):
        raise _error(f"-o {args.output}: quantize writes a .safetensors file")
    reader = open_checkpoint(args.file)
    with reader:
        _check_writable(args.output, "-o", [args.file])   # (not the input, by any path)
        names = list(reader)
        notes = []
        chosen = _select(reader, args, notes)
        if not chosen:   # the notes on what was copied become the error
            raise _error(f"{args.file}: nothing to quantize: {'; '.join(notes) or 'no tensors'}")
        entries = []
        for n in names:
            entries += _plan(reader, n, args) if n in chosen else \
                [(n, reader.info(n)[0], reader.info(n)[1])]
        rows_out = []
        t0 = time.perf_counter()
        try:
            with SafetensorsWriter(args.output, entries, _metadata(reader, args, chosen)) \
                    as writer:
                for n in names:
                    if n not in chosen:
                        writer.copy_from(reader, n)
                        continue
                    rows_out.append(_quantize_tensor(reader, writer, n, args))
        except OSError as exc:
            raise _error(f"{args.output}: cannot write: {exc.strerror or exc}") from None
        total_in = sum(reader.nbytes(n) for n in names)
        copied = _copied_headline(reader, names, chosen, args, total_in)
    seconds = time.perf_counter() - t0
    total_out = _nbytes(entries)
    _print_result(rows_out, args, seconds, total_in, total_out, notes, copied)
    return 0


#: the share of the input's bytes copied unchanged above which the run says so
#: in one headline line (a conv net's kernels are most of its bytes)
COPIED_HEADLINE_SHARE = 0.5


def _copied_headline(reader, names, chosen, args, total_in):
    """One line when most of the input's bytes are copied unchanged: how
    much, the reason that holds most of them, and the option that quantizes
    them (None otherwise)."""
    by_why = {}
    for n in names:
        if n not in chosen:
            why = "not chosen by --tensors" if args.tensors else _why_copied(reader, n)
            by_why[why] = by_why.get(why, 0) + reader.nbytes(n)
    copied = sum(by_why.values())
    if not total_in or copied <= COPIED_HEADLINE_SHARE * total_in:
        return None
    why = max(by_why, key=by_why.get)
    hint = (" (--tensors 'PATTERN' quantizes them)"
            if why.startswith(("convolution", "1-D", "embeddings")) else "")
    return (f"note: {100 * copied / total_in:.0f}% of the input's bytes were copied "
            f"unchanged, mostly {why.split(' (')[0]}{hint}")


def _quantize_tensor(reader, writer, name, args):
    """Quantize one tensor a chunk of rows at a time; write its outputs.
    Returns the table row: (name, shape, dtype, input bytes, output bytes,
    weights, _Sqnr)."""
    dt, shape = reader.info(name)
    rows, k = _matrix(shape)
    step = max(1, CHUNK_ELEMENTS // max(k, 1))
    plan = _plan(reader, name, args)
    parts = [[] for _ in plan]
    acc = _Sqnr()
    # a row longer than a chunk is read in pieces of whole groups / blocks (an
    # even count, for the two-per-byte packings): the memory follows the
    # chunk size whatever the shape
    unit = (1 if args.format == "fp8" else _BLOCK_FORMATS[args.format][0]
            if args.format in _BLOCK_FORMATS else args.group_size)
    unit *= 1 + unit % 2
    width = k if k <= CHUNK_ELEMENTS else max(unit, CHUNK_ELEMENTS // unit * unit)
    chunks = [(slice(start, min(start + step, rows)),
               None if width == k else slice(col, min(col + width, k)))
              for start in range(0, rows, step) for col in range(0, k, width)]

    def read(c):
        return reader.float32(name, *c, width=k)

    def amax_of(c):
        return np.abs(read(c)).max(axis=-1, initial=0)
    g = row_amax = None
    if args.format == "nvfp4":  # modelopt's per-tensor scale: amax / 2688 over the whole tensor
        amax = max(float(amax_of(c).max(initial=0)) for c in chunks)
        g = np.float32(np.float32(amax) / np.float32(2688))
        parts[2].append(np.array([g], np.float32))
    for flat_rows, cols in chunks:
        x = read((flat_rows, cols))
        if not np.isfinite(x).all():
            raise _error(f"tensor {name!r} holds NaN or inf values: not quantized (choose "
                         "tensors with --tensors)")
        if args.format == "fp8" and cols is not None:  # the row's scale, from all its pieces
            if cols.start == 0:
                row_amax = np.max([amax_of((flat_rows, c)) for r, c in chunks
                                   if r == flat_rows], axis=0)
        outs, y = _quantize_chunk(x, args, g, row_amax)
        acc.add(x, y)
        for i, o in enumerate(outs):
            if not (args.format == "fp8" and i == 1 and cols is not None and cols.start):
                parts[i].append(np.ascontiguousarray(o))  # (FP8: one scale per row)
    # the tensor's outputs, in the declared order (each the concatenation of
    # its chunks: a fraction of the input tensor's size)
    for (out_name, _, _), pieces in zip(plan, parts):
        writer.write(out_name, np.concatenate([c.reshape(-1) for c in pieces]))
    return (name, list(shape), dt, reader.nbytes(name), _nbytes(plan), rows * k, acc)


def _mib(n):
    return (f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB" if n >= 2**10
            else f"{n} B")


def _scheme_text(args):
    if args.format == "fp8":
        return "e4m3fn, one scale per row (modelopt)"
    if args.format in _BLOCK_FORMATS:
        return f"blocks of {_BLOCK_FORMATS[args.format][0]} along the input dimension"
    return (f"groups of {args.group_size} along the input dimension, recipe {args.recipe}, "
            f"{'symmetric' if args.symmetric else 'affine'}")


def _print_result(rows, args, seconds, total_in, total_out, notes, headline=None):
    from .cli_common import print_notes, print_table, say
    q_in = sum(r[3] for r in rows)
    q_out = sum(r[4] for r in rows)
    weights = sum(r[5] for r in rows)
    pooled = _Sqnr()
    for r in rows:
        pooled.merge(r[6])
    say(f"quantized {len(rows)} tensor(s) to {args.format} ({_scheme_text(args)}) in "
        f"{seconds:.1f} s -> {args.output}")
    if headline:
        say(headline)
    if not args.quiet:
        print_table(("tensor", "shape", "dtype", "bits/weight", "SQNR dB", "max |err|"),
                    [(n, "x".join(map(str, s)), dt, f"{8 * b_out / w:.2f}", f"{a.db():.2f}",
                      f"{a.max_err:.3g}") for n, s, dt, _, b_out, w, a in rows], left=3)
    say(f"size: file {_mib(total_in)} -> {_mib(total_out)}; quantized tensors {_mib(q_in)} -> "
        f"{_mib(q_out)}, {8 * q_out / weights:.2f} bits per weight (codes + scales + zero "
        f"points over {weights} weights)")
    worst = min(rows, key=lambda r: r[6].db())
    say(f"SQNR over the quantized tensors only (copied tensors are exact): pooled "
        f"{pooled.db():.2f} dB, lowest {worst[6].db():.2f} dB ({worst[0]})")
    grew = [f"{r[0]} ({_mib(r[3])} -> {_mib(r[4])})" for r in rows if r[4] >= r[3]]
    if grew:
        from .cli_common import short_list
        notes.append(f"warning: {len(grew)} tensor(s) did not get smaller (scales per group "
                     f"outweigh the codes; a larger group or another format suits them): "
                     f"{short_list(grew)}")
    print_notes(notes)


# --------------------------------------------------------------- dequantize
def load_dequantized(path):
    """The tensors of a ``quantcore quantize`` output, as float32 arrays.

    Every quantized tensor ``W`` (listed in the ``quantcore_tensors``
    metadata) comes back under its own name and original shape, decoded
    from ``W.qweight``, ``W.scales`` (and ``W.zero_points`` / ``W.scale_2``)
    as the module docstring's formulas say: exactly the values the quantize
    run measured its SQNR on.  Copied tensors come back as stored (the
    reader's memory-mapped arrays).

    Parameters
    ----------
    path : str
        A .safetensors file written by ``quantcore quantize``.

    Returns
    -------
    dict of str -> ndarray, in the file's order.
    """
    with SafetensorsReader(path) as reader:
        meta = reader.metadata
        if "quantcore_tensors" not in meta or meta.get("quantcore_format") not in FORMATS:
            raise ValueError(f"{path}: not written by 'quantcore quantize' (no "
                             "quantcore_tensors / quantcore_format metadata)")
        try:
            info = json.loads(meta["quantcore_tensors"])
            fmt, recipe = meta["quantcore_format"], meta["recipe"]
            sym = meta["symmetric"] == "true"
            group = None if meta["group_size"] == "row" else int(meta["group_size"])
        except (KeyError, ValueError) as exc:
            raise ValueError(f"{path}: malformed quantize metadata ({exc})") from None
        parts = {f"{n}.{p}" for n in info for p in ("qweight", "scales", "zero_points",
                                                    "scale_2")}
        out = {}
        for name in reader:
            if name not in parts:
                out[name] = reader[name]
        for name, d in info.items():
            out[name] = _dequantize_one(reader, name, tuple(d["shape"]), fmt, recipe, sym,
                                        group)
        return {n: out[n] for n in _original_order(reader, info)}


def _original_order(reader, info):
    seen = []
    for name in reader:
        base = name.rsplit(".", 1)[0]
        n = base if base in info and name != base else name
        if n not in seen:
            seen.append(n)
    return seen


def _dequantize_one(reader, name, shape, fmt, recipe, sym, group):
    rows, k = _matrix(shape)
    q = np.asarray(reader[f"{name}.qweight"])
    s = np.asarray(reader[f"{name}.scales"])
    two_d = (rows, -1)
    if fmt == "fp8":
        y = F.fp8_decode(q.reshape(rows, k).view(np.uint8), "e4m3fn") * \
            s.reshape(rows, 1).astype(np.float32)
    elif fmt in _BLOCK_FORMATS:
        from . import mx
        if fmt == "nvfp4":
            g2 = np.float32(np.asarray(reader[f"{name}.scale_2"]).reshape(-1)[0])
            y = mx.nvfp4_dequantize(q.view(np.uint8).reshape(two_d), s.reshape(two_d), g2,
                                    length=k)
        else:
            elem = _BLOCK_FORMATS[fmt][1]
            y = mx.mx_dequantize(s.view(np.uint8).reshape(two_d), q.reshape(two_d), elem,
                                 length=k if elem == "e2m1" else None)
    else:
        bits = _bits(fmt)
        qmin, _ = F.group_qrange(bits, recipe, sym)
        if bits == 4:
            codes = F.unpack_int4(q.reshape(two_d), k, signed=qmin < 0)
        else:
            codes = q.reshape(rows, k)
        s = s.reshape(two_d)
        if sym:
            z = np.full(s.shape, 0 if qmin < 0 else 1 << (bits - 1),
                        np.int8 if qmin < 0 else np.uint8)
        else:
            z = np.asarray(reader[f"{name}.zero_points"]).reshape(two_d)
        y = F.group_dequantize(codes, s, z, group, recipe=recipe, bits=bits)
    return np.asarray(y, np.float32).reshape(shape)


def run_dequantize(args):
    """The ``dequantize`` command."""
    from .cli_files import check_writable as _check_writable
    from .engines import cli as engine_cli, gguf_cli
    if args.file.endswith(".gguf"):  # a GGUF file
        return gguf_cli.run_dequantize(args)
    if engine_cli.is_model_dir(args.file):  # quantcore.engines
        return engine_cli.run_dequantize(args)
    if not args.output.endswith(".safetensors"):
        raise _error(f"-o {args.output}: dequantize writes a .safetensors file")
    open_checkpoint(args.file).close()
    _check_writable(args.output, "-o", [args.file])   # (not the input, by any path)
    try:
        tensors = load_dequantized(args.file)
    except ValueError as exc:
        raise _error(str(exc)) from None
    with SafetensorsReader(args.file) as reader:
        meta = reader.metadata
        quantized = json.loads(meta["quantcore_tensors"])
        entries = [(n, "F32", a.shape) if n in quantized else (n, *reader.info(n))
                   for n, a in tensors.items()]
        keep = {k: v for k, v in meta.items() if k not in _META_KEYS}
        try:
            with SafetensorsWriter(args.output, entries,
                                   {**keep, "dequantized_from": meta["quantcore_format"]}) as w:
                for n, a in tensors.items():
                    if n in quantized:
                        w.write(n, a)
                    else:
                        w.copy_from(reader, n)   # copied: bytes for bytes
        except OSError as exc:
            raise _error(f"{args.output}: cannot write: {exc.strerror or exc}") from None
    print(f"wrote {len(tensors)} tensor(s) to {args.output} ({len(quantized)} dequantized to "
          f"float32, {len(tensors) - len(quantized)} copied)")
    return 0
