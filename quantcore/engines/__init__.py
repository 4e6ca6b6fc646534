"""Checkpoints that serving engines load: a Hugging Face model directory
in, a model directory out whose weights and ``quantization_config`` are
those a producer (llm-compressor for compressed-tensors) writes, bit for
bit, so that vLLM and transformers load it as is.

    quantcore quantize MODEL_DIR --format compressed-tensors --scheme FP8_DYNAMIC -o OUT_DIR

Streamed: each input shard is memory-mapped, each weight quantized alone
(every scheme of both formats: read once as stored, its BF16 bits going
straight into the C loops of ``quantcore/_cpu/_engines.pyx``, the output
and per-group temporaries beside it; an F16 weight: a float32 copy), each
output shard written tensor by tensor; the output
directory appears at its path only when complete
(:func:`quantcore.engines.hf.write_model_dir`).  Peak memory about 1.3x the
largest weight (bench/test_bench_engines.py's tracemalloc peak).

Modules: :mod:`.hf` (the directory: reading, sharding, writing),
:mod:`.compressed_tensors` (that layout and its producer's numerics),
:mod:`.cli` (the command line's part).
"""
import time

import numpy as np

from . import compressed_tensors as CT
from . import modelopt as MO
from .fused import FusedSetReader
from .hf import DEFAULT_MAX_SHARD_SIZE, HFModel, ModelDirError, check_device, parse_size, \
    read_weight, write_quantized_dir

__all__ = ["quantize_model", "load_dequantized", "convert_model", "ENGINE_FORMATS",
           "ModelDirError"]

#: --format values that write a model directory
ENGINE_FORMATS = ("compressed-tensors", "modelopt")
#: each format's default scheme
DEFAULT_SCHEMES = {"compressed-tensors": "FP8_DYNAMIC", "modelopt": "FP8_PER_CHANNEL_PER_TOKEN"}


def quantize_model(src, dst, scheme=None, *, fmt="compressed-tensors", group_size=None,
                   max_shard_size=DEFAULT_MAX_SHARD_SIZE, progress=None, input_amax=None,
                   device="cpu"):
    """Quantize a Hugging Face model directory into a compressed-tensors or
    ModelOpt one.

    Parameters
    ----------
    src, dst : str
        The model directory, and the output directory (new, or empty).
    scheme : str, optional
        compressed-tensors: llm-compressor's preset (:data:`compressed_tensors.
        SCHEMES`: FP8_DYNAMIC, the default, W4A16, W8A16, W4A16_ASYM, NVFP4A16,
        MXFP4A16, MXFP4); modelopt: its
        quant_algo (:data:`modelopt.SCHEMES`: FP8_PER_CHANNEL_PER_TOKEN, the
        default, FP8, W4A16_NVFP4).
    fmt : {"compressed-tensors", "modelopt"}
    group_size : int, optional
        W4A16 / W8A16 / W4A16_ASYM's group along the input dimension
        (default 128).
    max_shard_size : int or str
        Bytes per output shard at most ("50GB", transformers' default).
    progress : callable, optional
        ``progress(shard file, entries)`` -> an iterable over the entries
        (a progress bar).
    input_amax : dict, optional
        modelopt FP8 (static activations): ``{module: amax of its input}``
        for every quantized module (written as ``input_scale``).
    device : {"cpu", "gpu"}
        Where the weights' loops run: "gpu" copies each weight to the
        current cupy device and its outputs back (``quantcore_gpu.
        engine_kernels``, the same bytes).

    Returns
    -------
    dict: ``quantized`` (names), ``ignore``, ``copied`` ({reason: names}),
    ``shards`` (file names), ``bytes_in``, ``bytes_out``, ``seconds``.

    Raises
    ------
    ValueError
        An unknown scheme, a malformed directory (:class:`ModelDirError`,
        naming the file and field), a layer whose shape the scheme's kernels
        refuse (naming the layer), output == input.
    """
    if fmt not in ENGINE_FORMATS:
        raise ValueError(f"format {fmt!r}: expected one of {list(ENGINE_FORMATS)}")
    scheme = DEFAULT_SCHEMES[fmt] if scheme is None else scheme
    check_device(device)
    if fmt == "modelopt":
        return _quantize_modelopt(src, dst, scheme, group_size, max_shard_size, progress,
                                  input_amax, device)
    if input_amax is not None:
        raise ValueError("input_amax applies to modelopt FP8, not to compressed-tensors")
    if scheme not in CT.SCHEMES:
        raise ValueError(f"scheme {scheme!r}: expected one of {list(CT.SCHEMES)}")
    int_group = CT.is_int_group(scheme)
    if not int_group and group_size is not None:
        raise ValueError(f"group size applies to the integer group schemes, not {scheme}")
    group = (CT.DEFAULT_GROUP_SIZE if group_size is None else int(group_size)) \
        if int_group else None
    if group is not None and group < 1:
        raise ValueError(f"group size must be >= 1, got {group}")
    limit = parse_size(max_shard_size)
    t0 = time.perf_counter()
    with HFModel(src) as model:
        chosen, ignore, copied = CT.select_checked(
            model, src, lambda n, shape: CT.check_shape(n, shape, scheme, group))
        fused = FusedSetReader(chosen, CT.NVFP4_GROUP) if scheme == "NVFP4A16" else None
        config = dict(model.config)
        config["quantization_config"] = CT.quantization_config(scheme, ignore, group)

        def quantize(x, dt, name):
            g = maxima = None
            if fused is not None:  # (the global scale of the fused set's absmax)
                maxima, amax = fused.take(name)
                g = CT.nvfp4_global_scale(amax, dt)
            outs = CT.quantize_tensor(x, dt, scheme, group, g, name, maxima)
            return {f"{CT.module_of(name)}.{k}": v for k, v in outs.items()}

        written = write_quantized_dir(model, dst, config, set(chosen),
                                      lambda n, dt, shape: CT.plan(n, dt, shape, scheme, group),
                                      quantize, limit, progress=progress,
                                      bits=True,  # (every scheme's loops read stored bits)
                                      device=device, read=fused.read if fused else read_weight)
    return {"quantized": chosen, "ignore": ignore, "copied": copied, **written,
            "seconds": time.perf_counter() - t0}


def _quantize_modelopt(*args):
    from .modelopt_dir import quantize_modelopt
    return quantize_modelopt(*args)


def load_dequantized(path):
    """The weights of a compressed-tensors or ModelOpt model directory as
    the format's own decompressor gives them back: ``{name: (dtype,
    float32 array)}`` with every quantized module's ``X.weight``
    (compressed-tensors: values of the scale's dtype, exactly those
    transformers' ``from_pretrained`` loads; ModelOpt: its dequantize in
    the model's dtype) and every other tensor as stored (its dtype and a
    read-only array of its raw bytes).

    Raises ModelDirError when the directory's config.json has neither a
    compressed-tensors nor a modelopt ``quantization_config``.
    """
    with HFModel(path, quantized=True) as model:
        def get(name):
            if name not in model:
                return None
            dt, shape = model.info(name)
            return dt, shape, model.reader(name).raw(name)
        if model.quant_method == "modelopt":
            MO.scheme_of(model.config)
            dt = MO.model_dtype(model.config)
            modules = [n[:-len(".weight_scale")] for n in model.names
                       if n.endswith(".weight_scale")]
            parts = {f"{m}.{p}": m for m in modules for p in MO.STORED}
            decode = lambda m: MO.dequantize_module(get, m, dt)  # noqa: E731
        else:
            modules = [n[:-len(".weight_scale")] for n in model.names
                       if n.endswith(".weight_scale")]
            parts = {f"{m}.{p}": m for m in modules for p in CT.STORED}
            decode = lambda m: CT.dequantize_module(get, m)  # noqa: E731
        out = {}
        for n in model.names:
            if n not in parts:
                out[n] = (model.info(n)[0], np.array(model.reader(n).raw(n)))
            elif f"{parts[n]}.weight" not in out:
                out[f"{parts[n]}.weight"] = decode(parts[n])
        return out


def convert_model(src, dst, fmt, *, max_shard_size=DEFAULT_MAX_SHARD_SIZE, progress=None):
    """A compressed-tensors model directory rewritten as ModelOpt's, or the
    reverse, without requantizing (:mod:`.convert`)."""
    from .convert import convert
    return convert(src, dst, fmt, max_shard_size=max_shard_size, progress=progress)
