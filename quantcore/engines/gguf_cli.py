"""The command line's part of GGUF files: ``quantcore quantize MODEL_DIR
--format gguf --type TYPE -o model.gguf`` and ``quantcore dequantize
model.gguf -o out.safetensors`` (cli_quantize.py routes ``--format gguf``
and a ``.gguf`` input here)."""
__all__ = ["add_arguments", "run", "run_dequantize", "TYPES"]

from .gguf_file import FILE_TYPES

#: --type values
TYPES = tuple(FILE_TYPES)


def add_arguments(p):
    """``quantize``'s --type (a model directory to a GGUF file only)."""
    p.add_argument("--type", default=None, choices=TYPES, dest="gguf_type",
                   help="--format gguf only: F32 / F16 / Q8_0 (llama.cpp's converter's "
                        "--outtype) or a llama-quantize mix Q4_K_M / Q4_K_S / Q5_K_M / Q6_K "
                        "(default Q8_0)")
    p.add_argument("--imatrix", default=None, metavar="FILE",
                   help="--format gguf with a mix only: llama-imatrix's importance matrix "
                        "(GGUF or legacy .dat), as llama-quantize --imatrix")
    p.add_argument("--tokenizer-pre", default=None, metavar="NAME",
                   help="--format gguf only: tokenizer.ggml.pre for a BPE tokenizer whose "
                        "probe hash llama.cpp's converter does not know (it refuses it)")


def _error(msg):
    from ..cli_files import CliError
    return CliError(msg)


def run(args):
    """``quantize --format gguf``; returns the exit status."""
    import os
    from ..cli_common import say
    from ..cli_files import check_writable
    from .gguf_file import GGUFFileError, write_gguf
    from .hf import ModelDirError
    if not os.path.isdir(args.file):
        raise _error(f"{args.file}: --format gguf reads a Hugging Face model directory "
                     "(config.json, model.safetensors or its shards, tokenizer.json or "
                     "tokenizer.model)")
    given = [opt for opt, v in (("--recipe", args.recipe), ("--symmetric / --affine",
                                                             args.symmetric is not None),
                                ("--tensors", args.tensors), ("--scheme", args.scheme),
                                ("--group-size", args.group_size)) if v]
    if given:
        raise _error(f"{', '.join(given)} does not apply to --format gguf (--type chooses "
                     "the types)")
    if not args.output.endswith(".gguf"):
        raise _error(f"-o {args.output}: --format gguf writes a .gguf file")
    # (--type / --tokenizer-pre without --format gguf: cli_quantize refuses them)
    check_writable(args.output, "-o", [os.path.join(args.file, n) for n in
                                       os.listdir(args.file)])
    type = args.gguf_type or "Q8_0"
    try:
        rep = write_gguf(args.file, args.output, type, tokenizer_pre=args.tokenizer_pre,
                         imatrix=args.imatrix, device=args.device)
    except (ModelDirError, GGUFFileError, ValueError) as exc:
        raise _error(str(exc)) from None
    except OSError as exc:
        raise _error(f"{args.output}: cannot write: {exc.strerror or exc}") from None
    mib = 2 ** 20
    counts = {}
    for t in rep["tensors"].values():
        counts[t] = counts.get(t, 0) + 1
    say(f"wrote {len(rep['tensors'])} tensor(s) as {type} in {rep['seconds']:.1f} s -> "
        f"{args.output} ({rep['bytes_in'] / mib:.2f} MiB -> {rep['bytes_out'] / mib:.2f} MiB; "
        + ", ".join(f"{t}: {c}" for t, c in sorted(counts.items())) + ")"
        + (f"; {len(rep['imatrix'])} with the imatrix's weights" if args.imatrix else ""))
    return 0


def run_dequantize(args):
    """``dequantize model.gguf -o out.safetensors``: every tensor as float32
    (GGUF names, PyTorch axis order)."""
    from ..checkpoints import SafetensorsWriter
    from ..cli_files import check_writable
    from .gguf_file import GGUFFileError, read_gguf
    if not args.output.endswith(".safetensors"):
        raise _error(f"-o {args.output}: dequantize writes a .safetensors file")
    check_writable(args.output, "-o", [args.file])
    try:
        tensors, kv = read_gguf(args.file)
    except GGUFFileError as exc:
        raise _error(str(exc)) from None
    meta = {"format": "pt", "dequantized_from": "gguf",
            "general.architecture": str(kv.get("general.architecture", ""))}
    try:
        with SafetensorsWriter(args.output, [(n, "F32", a.shape) for n, a in tensors.items()],
                               meta) as w:
            for n, a in tensors.items():
                w.write(n, a)
    except OSError as exc:
        raise _error(f"{args.output}: cannot write: {exc.strerror or exc}") from None
    print(f"wrote {len(tensors)} tensor(s) to {args.output}")
    return 0
