"""``quantcore quantize``: weight-only quantization of a safetensors
checkpoint (BF16, F16, F32, F64 or FP8 weights, memory-mapped), written
tensor by tensor, with the per-tensor SQNR table.

    quantcore quantize weights.safetensors --format int4 --group-size 128 -o q.safetensors
    quantcore quantize weights.safetensors --format int4 --symmetric --recipe awq -o q.safetensors
    quantcore quantize weights.safetensors --format fp8 -o q.safetensors
    quantcore quantize weights.safetensors --format mxfp4 -o q.safetensors

Which tensors: every floating-point tensor with at least two dimensions
(``--tensors`` to choose by name); the others (biases, norms, integer
tensors) are copied unchanged, bytes for bytes.

Output layout, for a quantized tensor ``W`` of shape ``[..., K]`` (groups
of ``g`` consecutive elements along the last axis K, ``G = ceil(K / g)``;
every scale is a dequantization multiplier):

- ``--format int4``: ``W.qweight`` U8 ``[..., ceil(K / 2)]``: the 4-bit
  codes two per byte along K, element 2i in the low nibble (ONNX INT4 /
  UINT4 and ORT MatMulNBits order; signed codes as two's-complement
  nibbles); ``W.scales`` F32 ``[..., G]``; ``W.zero_points`` ``[..., G]``
  for asymmetric recipes (U8 / I8 integer zero points, F32 for tinygemm and
  hqq).  Dequantization: ``(q - zero_point) * scale`` (tinygemm:
  ``(q - 8) * scale + zero_point``); symmetric "onnx" has the implicit zero
  point 8 (codes 0..15), symmetric "awq" / "torchao" signed codes -8..7 and
  zero point 0.
- ``--format int8``: ``W.qweight`` U8 or I8 ``[..., K]``, scales and zero
  points as for int4 (the onnx recipe's symmetric zero point is 128).
- ``--format fp8``: ``W.qweight`` F8_E4M3 ``[..., K]`` (modelopt recipe,
  one amax per row of the last axis); ``W.scales`` F32 ``[...]``:
  ``W ~= decode(qweight) * scales``.

- ``--format mxfp8`` / ``mxfp4`` (OCP microscaling, spec §4: blocks of 32
  along K sharing an E8M0 power-of-two scale, scale rule "floor", elements
  RNE): ``W.qweight`` F8_E4M3 ``[..., K]`` (mxfp8) or U8
  ``[..., ceil(K / 2)]`` (mxfp4: e2m1 codes two per byte, element 2i in the
  low nibble); ``W.scales`` U8 ``[..., ceil(K / 32)]``: the E8M0 codes c,
  ``W ~= decode(qweight) * 2**(c - 127)``.
- ``--format nvfp4`` (modelopt's NVFP4 export recipe, spec §5.1: blocks of
  16 along K): ``W.qweight`` U8 ``[..., ceil(K / 2)]`` (e2m1, packed as
  mxfp4); ``W.scales`` F8_E4M3 ``[..., ceil(K / 16)]``; ``W.scale_2`` F32
  ``[1]`` (the per-tensor scale, amax / 2688 over the whole tensor):
  ``W ~= decode(qweight) * f32(scales * scale_2)``.

``__metadata__`` records ``quantcore_format``, ``group_size``, ``recipe``,
``symmetric``, ``bits``, ``packing`` and the quantcore version, besides the
input's own metadata.  The SQNR (dB, float64 over the finite values) and
the largest absolute error compare each tensor with its dequantization.
Tensors are converted a chunk of rows at a time, so the peak memory is a
fraction of the largest tensor's, not the file's.
"""
import math
import os
import time

import numpy as np

from . import formats as F
from .checkpoints import SafetensorsReader, SafetensorsWriter

#: elements converted at a time (4 MiB as float32, plus two float64
#: temporaries of the SQNR): the peak stays below the size of a tensor of
#: 16 Mi BF16 elements and above
CHUNK_ELEMENTS = 1 << 20
FORMATS = ("int4", "int8", "fp8", "mxfp4", "mxfp8", "nvfp4")
_INT_FORMATS = ("int4", "int8")
#: block-scaled formats: (block size, element type of quantcore.mx or None for NVFP4)
_BLOCK_FORMATS = {"mxfp4": (32, "e2m1"), "mxfp8": (32, "e4m3"), "nvfp4": (16, None)}


def add_parser(sub, formatter=None):
    """Register the ``quantize`` sub-command on an argparse sub-parsers
    object (``quantcore.cli`` calls this)."""
    kw = {"formatter_class": formatter} if formatter else {}
    p = sub.add_parser(
        "quantize", help="weight-only int4 / int8 / fp8 / MX / NVFP4 quantization of a "
                         ".safetensors file",
        description="Quantize the weight matrices of a .safetensors checkpoint (BF16, F16, "
                    "F32, F64 or FP8; memory-mapped) group-wise to int4 / int8, or row-wise "
                    "to FP8 e4m3fn, or block-scaled to MXFP8 / MXFP4 / NVFP4, write packed "
                    "codes + scales (+ zero points) to a new .safetensors file and print each "
                    "tensor's SQNR.  Layout: see 'python -m pydoc quantcore.cli_quantize'.",
        **kw)
    p.add_argument("file", metavar="FILE", help="input .safetensors")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="output .safetensors")
    p.add_argument("--format", choices=FORMATS, default="int4", help="default int4")
    p.add_argument("--group-size", type=int, default=128, metavar="G",
                   help="elements per group along the last axis (int4 / int8; default 128)")
    p.add_argument("--symmetric", action="store_true", help="symmetric quantization")
    p.add_argument("--recipe", choices=F.GROUP_RECIPES, default="onnx",
                   help="group recipe (int4 / int8; default onnx: ORT MatMulNBits)")
    p.add_argument("--tensors", nargs="+", metavar="NAME",
                   help="quantize only these tensors (default: every float tensor with 2 or "
                        "more dimensions)")
    p.add_argument("-q", "--quiet", action="store_true", help="no table")
    p.set_defaults(run=run)
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

    def db(self):
        return float("inf") if self.noise == 0 else 10 * math.log10(self.signal / self.noise)


def _plan(reader, name, args):
    """The output tensors [(name, dtype, shape)] of one input tensor."""
    dt, shape = reader.info(name)
    lead, k = tuple(shape[:-1]), shape[-1]
    if args.format == "fp8":
        return [(f"{name}.qweight", "F8_E4M3", shape), (f"{name}.scales", "F32", lead)]
    if args.format in _BLOCK_FORMATS:
        bs, elem = _BLOCK_FORMATS[args.format]
        out = [(f"{name}.qweight", "F8_E4M3" if elem == "e4m3" else "U8",
                lead + ((k,) if elem == "e4m3" else ((k + 1) // 2,))),
               (f"{name}.scales", "U8" if elem else "F8_E4M3", lead + (-(-k // bs),))]
        return out + ([(f"{name}.scale_2", "F32", (1,))] if elem is None else [])
    bits = 4 if args.format == "int4" else 8
    qmin, _ = F.group_qrange(bits, args.recipe, args.symmetric)
    code = "I8" if qmin < 0 else "U8"
    ng = -(-k // args.group_size)
    out = [(f"{name}.qweight", "U8" if bits == 4 else code,
            lead + ((k + 1) // 2 if bits == 4 else k,)),
           (f"{name}.scales", "F32", lead + (ng,))]
    if not args.symmetric:
        zdt = "F32" if args.recipe in ("tinygemm", "hqq") else code
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
    bits = 4 if args.format == "int4" else 8
    q, s, z = F.group_quantize(x, bits, args.group_size, symmetric=args.symmetric,
                               recipe=args.recipe)
    y = F.group_dequantize(q, s, z, args.group_size, recipe=args.recipe, bits=bits)
    outs = [F.pack_int4(q) if bits == 4 else q, s]
    if not args.symmetric:
        outs.append(z)
    return outs, y


def _check_args(args, reader):
    if not args.file.endswith(".safetensors") or not args.output.endswith(".safetensors"):
        raise _error("quantize reads and writes .safetensors files")
    if os.path.abspath(args.file) == os.path.abspath(args.output):
        raise _error("--output must differ from the input file")
    if args.format in _INT_FORMATS:
        if args.group_size < 1:
            raise _error(f"--group-size must be >= 1, got {args.group_size}")
        try:
            F.group_qrange(4 if args.format == "int4" else 8, args.recipe, args.symmetric)
        except ValueError as exc:
            raise _error(str(exc)) from None
    if args.tensors:
        missing = [t for t in args.tensors if t not in reader]
        if missing:
            raise _error(f"{args.file}: no tensor {', '.join(map(repr, missing))}")


def _selected(reader, name, args):
    if args.tensors:
        return name in args.tensors
    dt, shape = reader.info(name)
    return reader.is_float(name) and len(shape) >= 2


def run(args):
    """The ``quantize`` command; returns the exit status."""
    from .cli_files import check_writable as _check_writable
    if os.path.isdir(args.file):
        raise _error(f"{args.file}: is a directory, expected a .safetensors file")
    if not os.path.exists(args.file):
        raise _error(f"{args.file}: no such file")
    try:
        reader = SafetensorsReader(args.file)
    except (ValueError, OSError) as exc:
        raise _error(f"{args.file}: cannot read: {exc}") from None
    with reader:
        _check_args(args, reader)
        _check_writable(args.output, "-o")
        names = list(reader)
        chosen = [n for n in names if _selected(reader, n, args)]
        for n in chosen:
            dt, shape = reader.info(n)
            if not reader.is_float(n) or len(shape) < 1 or 0 in shape:
                raise _error(f"{args.file}: tensor {n!r} ({dt}{list(shape)}) is not a "
                             "non-empty float tensor")
            if args.format in _INT_FORMATS and args.recipe not in ("onnx", "onnx_numpy") and \
                    shape[-1] % args.group_size:
                raise _error(f"tensor {n!r}: last axis {shape[-1]} is not a multiple of "
                             f"--group-size {args.group_size} (recipe {args.recipe})")
        entries = []
        for n in names:
            if n in chosen:
                entries += _plan(reader, n, args)
            else:
                entries.append((n, reader.info(n)[0], reader.info(n)[1]))
        import quantcore
        meta = dict(reader.metadata)
        block = _BLOCK_FORMATS.get(args.format)
        meta.update({"quantcore_format": args.format, "quantcore_version": quantcore.__version__,
                     "recipe": {"fp8": "modelopt", "nvfp4": "modelopt", "mxfp4": "ocp_floor",
                                "mxfp8": "ocp_floor"}.get(args.format, args.recipe),
                     "group_size": "row" if args.format == "fp8" else
                     str(block[0] if block else args.group_size),
                     "symmetric": str(bool(args.symmetric)).lower(),
                     "bits": {"int4": "4", "int8": "8", "fp8": "8", "mxfp4": "4", "mxfp8": "8",
                              "nvfp4": "4"}[args.format],
                     "packing": "low_first" if args.format in ("int4", "mxfp4", "nvfp4")
                     else "none"})
        rows_out = []
        t0 = time.perf_counter()
        try:
            with SafetensorsWriter(args.output, entries, meta) as writer:
                for n in names:
                    if n not in chosen:
                        writer.write_bytes(n, reader.raw(n))
                        continue
                    rows_out.append(_quantize_tensor(reader, writer, n, args))
        except OSError as exc:
            raise _error(f"{args.output}: cannot write: {exc.strerror or exc}") from None
    if not args.quiet:
        _print_table(rows_out, args, time.perf_counter() - t0)
    return 0


def _quantize_tensor(reader, writer, name, args):
    """Quantize one tensor a chunk of rows at a time; write its outputs."""
    dt, shape = reader.info(name)
    k = shape[-1]
    lead = tuple(shape[:-1]) if len(shape) > 1 else ()
    rows = math.prod(lead)
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
              for start in range(0, max(rows, 1), step) for col in range(0, max(k, 1), width)]

    def amax_of(c):
        return np.abs(reader.float32(name, *c)).max(axis=-1, initial=0)
    g = row_amax = None
    if args.format == "nvfp4":  # modelopt's per-tensor scale: amax / 2688 over the whole tensor
        amax = max(float(amax_of(c).max(initial=0)) for c in chunks)
        g = np.float32(np.float32(amax) / np.float32(2688))
        parts[2].append(np.array([g], np.float32))
    for flat_rows, cols in chunks:
        x = reader.float32(name, flat_rows, cols)
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
    for (out_name, _, _), chunks in zip(plan, parts):
        writer.write(out_name, np.concatenate([c.reshape(-1) for c in chunks]))
    return (name, list(shape), dt, acc.db(), acc.max_err)


def _print_table(rows, args, seconds):
    head = ("tensor", "shape", "dtype", "SQNR dB", "max |err|")
    lines = [(n, "x".join(map(str, s)), dt, f"{db:.2f}", f"{err:.3g}")
             for n, s, dt, db, err in rows]
    widths = [max([len(h)] + [len(r[i]) for r in lines]) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:{'<' if i < 3 else '>'}{w}}}" for i, w in enumerate(widths))
    print(f"quantized {len(rows)} tensors to {args.format}"
          + ("" if args.format == "fp8" else
             f" (blocks of {_BLOCK_FORMATS[args.format][0]})" if args.format in _BLOCK_FORMATS
             else f" (group {args.group_size}, {args.recipe}, "
             f"{'symmetric' if args.symmetric else 'asymmetric'})")
          + f" in {seconds:.1f} s -> {args.output}")
    print(fmt.format(*head))
    for r in lines:
        print(fmt.format(*r))
