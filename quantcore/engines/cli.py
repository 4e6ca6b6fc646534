"""The command line's part of the engines: ``quantcore quantize MODEL_DIR
--format compressed-tensors`` (a model directory in, one out) and
``quantcore dequantize MODEL_DIR -o OUT.safetensors``; cli_quantize.py
routes a directory input or an engine ``--format`` here."""
import os

__all__ = ["add_arguments", "is_model_dir", "settle", "run", "run_dequantize"]


def add_arguments(p):
    """The options of ``quantize`` that only a model directory takes."""
    from . import compressed_tensors as CT
    from . import modelopt as MO
    from .hf import DEFAULT_MAX_SHARD_SIZE, DEVICES
    p.add_argument("--scheme", choices=tuple(CT.SCHEMES) + tuple(MO.SCHEMES), default=None,
                   help="a model directory only. compressed-tensors: llm-compressor's preset "
                        "(default FP8_DYNAMIC: FP8 weights per channel, FP8 activations per "
                        "token at run time; W4A16 / W8A16: int4 / int8 symmetric groups, "
                        "--group-size, default 128; W4A16_ASYM: int4 groups with zero "
                        "points; NVFP4A16: FP4 in groups of 16, FP8 scales, a global "
                        "scale per fused set; MXFP4A16: FP4 in groups of 32, power-of-two "
                        "E8M0 scales; MXFP4: the same, FP4 activations at run time). "
                        "modelopt: its quant_algo (default "
                        "FP8_PER_CHANNEL_PER_TOKEN; FP8: per tensor, static activations, "
                        "needs --input-amax; W4A16_NVFP4: FP4 weights only, weight_scale_2 "
                        "per fused set)")
    p.add_argument("--input-amax", default=None, metavar="JSON",
                   help="modelopt FP8 only: a JSON file {module: amax of its input} for every "
                        "quantized layer (written as input_scale = amax / 448)")
    p.add_argument("--max-shard-size", default=DEFAULT_MAX_SHARD_SIZE, metavar="SIZE",
                   help=f"a model directory only: bytes per output shard at most "
                        f"(default {DEFAULT_MAX_SHARD_SIZE}, transformers' default; '5GB', "
                        "'500MiB' or a number)")
    p.add_argument("--device", choices=DEVICES, default="cpu",
                   help="a model directory only (compressed-tensors, modelopt, gguf): where "
                        "the weights are quantized (default cpu; gpu: on the current CUDA "
                        "device through cupy, the same bytes)")


def is_model_dir(path):
    """A directory given as input, but one named like a .safetensors file
    (which the file path refuses as a directory)."""
    return os.path.isdir(path) and not os.fspath(path).endswith(".safetensors")


def settle(args):
    """Whether ``quantize`` is given a model directory (or an engine
    format); for a file, refuse the directory's options and default
    ``--format`` to int4."""
    from . import ENGINE_FORMATS
    from .hf import DEFAULT_MAX_SHARD_SIZE
    if is_model_dir(args.file) or args.format in ENGINE_FORMATS:
        return True
    for opt, v in (("--scheme", args.scheme is not None),
                   ("--input-amax", args.input_amax is not None),
                   ("--max-shard-size", args.max_shard_size != DEFAULT_MAX_SHARD_SIZE),
                   ("--device", args.device != "cpu")):
        if v:
            raise _error(f"{opt} applies to a model directory, not to a .safetensors file")
    args.format = args.format or "int4"
    return False


def _error(msg):
    from ..cli_files import CliError
    return CliError(msg)


def _progress(quiet):
    """A tqdm bar per shard on a terminal (None otherwise)."""
    from ..cli_common import progress_bars
    make = progress_bars(quiet)
    if make is None:
        return None
    return lambda fname, entries: make(entries, desc=fname, unit="tensor")


def run(args):
    """``quantize`` of a model directory; returns the exit status."""
    from . import ENGINE_FORMATS, ModelDirError, quantize_model
    from ..cli_common import print_notes, say, short_list
    if not is_model_dir(args.file):
        raise _error(f"{args.file}: --format {args.format} reads a Hugging Face model "
                     "directory (config.json and model.safetensors or its shards)")
    if args.format is None:
        args.format = ENGINE_FORMATS[0]
    if args.format not in ENGINE_FORMATS:
        raise _error(f"{args.file} is a model directory: --format must be one of "
                     f"{list(ENGINE_FORMATS)}, got {args.format}")
    given = [opt for opt, v in (("--recipe", args.recipe), ("--symmetric / --affine",
                                                             args.symmetric),
                                ("--tensors", args.tensors)) if v]
    if given:
        raise _error(f"{', '.join(given)} applies to a .safetensors file, not to a model "
                     "directory (the layers follow the producer; --scheme chooses the format)")
    from . import DEFAULT_SCHEMES
    scheme = args.scheme or DEFAULT_SCHEMES[args.format]
    try:
        rep = quantize_model(args.file, args.output, scheme, fmt=args.format,
                             group_size=args.group_size, max_shard_size=args.max_shard_size,
                             progress=_progress(args.quiet),
                             input_amax=_input_amax(args.input_amax), device=args.device)
    except (ModelDirError, ValueError, FileExistsError) as exc:
        raise _error(str(exc)) from None
    except OSError as exc:
        raise _error(f"{args.output}: cannot write: {exc.strerror or exc}") from None
    mib = 2 ** 20
    say(f"quantized {len(rep['quantized'])} Linear weight(s) to {args.format} {scheme} in "
        f"{rep['seconds']:.1f} s -> {args.output} ({len(rep['shards'])} shard(s), "
        f"{rep['bytes_in'] / mib:.2f} MiB -> {rep['bytes_out'] / mib:.2f} MiB)")
    notes = [f"left alone, {why}: {short_list(names)}" for why, names in rep["copied"].items()]
    notes.append(f"ignore (quantization_config): {rep['ignore']}")
    print_notes(notes)
    return 0


def _input_amax(path):
    """{module: float} of --input-amax's JSON file (None without it)."""
    import json
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except OSError as exc:
        raise _error(f"--input-amax {path}: cannot read: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise _error(f"--input-amax {path}: not JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(data, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in data.values()):
        raise _error(f"--input-amax {path}: expected a JSON object {{module: number}}")
    return {str(k): float(v) for k, v in data.items()}


def run_dequantize(args):
    """``dequantize`` of a compressed-tensors or ModelOpt model directory
    into one .safetensors file: the quantized weights as the format's
    decompressor gives them, the rest as stored."""
    from . import ModelDirError, load_dequantized
    from . import compressed_tensors as CT
    from ..checkpoints import SafetensorsWriter
    if not args.output.endswith(".safetensors"):
        raise _error(f"-o {args.output}: dequantize writes a .safetensors file")
    try:
        tensors = load_dequantized(args.file)
    except (ModelDirError, ValueError) as exc:
        raise _error(str(exc)) from None
    entries = [(n, dt, a.shape if dt in CT.WEIGHT_DTYPES and a.dtype == CT.F32 else None)
               for n, (dt, a) in tensors.items()]
    from .hf import HFModel
    with HFModel(args.file, quantized=True) as model:
        entries = [(n, dt, shape if shape is not None else model.info(n)[1])
                   for n, dt, shape in entries]
    try:
        with SafetensorsWriter(args.output, entries, {"format": "pt"}) as w:
            for n, (dt, a) in tensors.items():
                if a.dtype == CT.F32 and dt in CT.WEIGHT_DTYPES:
                    w.write(n, CT.as_dtype_bytes(a, dt))
                else:
                    w.write_bytes(n, a)
    except OSError as exc:
        raise _error(f"{args.output}: cannot write: {exc.strerror or exc}") from None
    print(f"wrote {len(tensors)} tensor(s) to {args.output}")
    return 0


def add_convert_parser(sub, formatter):
    """``quantcore convert SRC_DIR -o DST_DIR --format F``."""
    from .hf import DEFAULT_MAX_SHARD_SIZE
    p = sub.add_parser(
        "convert", formatter_class=formatter,
        help="rewrite a quantized model directory in the other engine layout (no requantizing)",
        description="Rewrite a compressed-tensors model directory as ModelOpt's, or the "
                    "reverse, with the same codes: NVFP4 (NVFP4A16 <-> W4A16_NVFP4: the global "
                    "scale inverted, refused where no float32 inverse keeps every block's "
                    "factor) and FP8 per channel (FP8_DYNAMIC <-> FP8_PER_CHANNEL_PER_TOKEN). "
                    "'python -m pydoc quantcore.engines.convert' has the rules.")
    p.add_argument("file", metavar="SRC_DIR", help="a quantized model directory")
    p.add_argument("-o", "--output", required=True, metavar="DST_DIR")
    p.add_argument("--format", required=True, choices=("compressed-tensors", "modelopt"))
    p.add_argument("--max-shard-size", default=DEFAULT_MAX_SHARD_SIZE, metavar="SIZE")
    p.add_argument("-q", "--quiet", action="store_true")
    p.set_defaults(run=run_convert)


def run_convert(args):
    from . import ModelDirError, convert_model
    from ..cli_common import say
    if not is_model_dir(args.file):
        raise _error(f"{args.file}: convert reads a quantized Hugging Face model directory")
    try:
        rep = convert_model(args.file, args.output, args.format,
                            max_shard_size=args.max_shard_size, progress=_progress(args.quiet))
    except (ModelDirError, ValueError, FileExistsError) as exc:
        raise _error(str(exc)) from None
    except OSError as exc:
        raise _error(f"{args.output}: cannot write: {exc.strerror or exc}") from None
    say(f"converted {len(rep['converted'])} {rep['kind']} layer(s) to {args.format} in "
        f"{rep['seconds']:.1f} s -> {args.output} ({len(rep['shards'])} shard(s))")
    return 0
