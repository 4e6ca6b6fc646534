"""``quantize_model(..., fmt="modelopt")``: a Hugging Face model directory
quantized into ModelOpt's layout (:mod:`.modelopt`), streamed as the
compressed-tensors path is (one weight's outputs in memory at a time)."""
import time

from . import compressed_tensors as CT
from . import modelopt as MO
from .fused import FusedSetReader
from .hf import HFModel, parse_size, read_weight, write_quantized_dir


def quantize_modelopt(src, dst, scheme, group_size, max_shard_size, progress, input_amax,
                      device="cpu"):
    """:func:`quantcore.engines.quantize_model` for ``fmt="modelopt"``."""
    if scheme not in MO.SCHEMES:
        raise ValueError(f"scheme {scheme!r}: modelopt takes one of {list(MO.SCHEMES)}")
    if group_size is not None:
        raise ValueError(f"group size does not apply to modelopt {scheme} (NVFP4's group is 16)")
    needs_input = MO.SCHEMES[scheme][1]
    if input_amax is not None and not needs_input:
        raise ValueError(f"input amax applies to modelopt FP8 (static activations), not to "
                         f"{scheme}")
    limit = parse_size(max_shard_size)
    t0 = time.perf_counter()
    with HFModel(src) as model:
        chosen, ignore, copied = CT.select_checked(
            model, src, lambda n, shape: MO.check_shape(n, shape, scheme))
        if needs_input:
            amaxes = dict(input_amax or {})
            missing = [CT.module_of(n) for n in chosen if CT.module_of(n) not in amaxes]
            if missing:
                raise ValueError(f"modelopt FP8 quantizes activations with a static scale per "
                                 f"layer (vLLM's ModelOptFp8LinearMethod reads input_scale): "
                                 f"give the input amax of {len(missing)} layer(s), e.g. "
                                 f"{missing[:3]} (or use FP8_PER_CHANNEL_PER_TOKEN: "
                                 "activations per token at run time)")
        fused = FusedSetReader(chosen, MO.NVFP4_GROUP) if scheme == "W4A16_NVFP4" \
            else None
        exclude = MO.exclude_modules(model, ignore)
        hq = MO.hf_quant_config(scheme, exclude)
        config = dict(model.config)
        config["quantization_config"] = MO.quantization_config(hq)

        def quantize(x, dt, name):
            m = CT.module_of(name)
            g = maxima = None
            if fused is not None:  # (weight_scale_2 of the fused set's absmax)
                maxima, amax = fused.take(name)
                g = MO.global_scale(amax, m)
            outs = MO.quantize_tensor(x, dt, scheme, name, g=g, group_amax=maxima,
                                      in_amax=amaxes[m] if needs_input else None)
            return {f"{m}.{k}": v for k, v in outs.items()}

        written = write_quantized_dir(
            model, dst, config, set(chosen),
            lambda n, dt, shape: MO.plan(n, dt, shape, scheme, needs_input), quantize, limit,
            progress=progress, extra_files={"hf_quant_config.json": hq},
            bits=True, device=device,  # (every scheme's loops read BF16 bits as stored)
            read=fused.read if fused else read_weight)
    return {"quantized": chosen, "ignore": exclude, "copied": copied, **written,
            "seconds": time.perf_counter() - t0}
