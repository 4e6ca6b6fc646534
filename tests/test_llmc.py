"""quantcore's compressed-tensors model directories against llm-compressor
itself, live: the same BF16 model directory quantized by llm-compressor's
data-free path and by ``quantcore quantize --format compressed-tensors``,
the two outputs compared tensor by tensor, byte for byte, and their
``quantization_config`` field by field.

Runs in its own venv (pyproject.toml's ``llmc`` extra: llmcompressor
0.14.0.1, which pins transformers <= 5.17.0 and compressed-tensors ==
0.19.0, so it cannot live beside the main venv's engines extra), with the
project on PYTHONPATH and the main venv's in-place extension::

    PYTHONPATH=$PWD .venv-llmc/bin/python -m pytest -q tests/test_llmc.py -p no:cacheprovider

Without llmcompressor (the main venv) the module is skipped, unless
``QC_REQUIRE_LLMC=1``, when the import error is raised.

The producer's path (llm-compressor 0.14.0.1's own sources):

- ``llmcompressor.utils.dev.load_context`` around ``from_pretrained`` (its
  MoE example, ``examples/quantizing_moe/mixtral_example.py``, loads that
  way; ``modeling/moe/linearize.py`` then splits transformers' fused 3-D
  experts into one Linear per expert);
- ``oneshot(model=..., recipe=QuantizationModifier(...))`` with no data set:
  ``entrypoints/oneshot.py`` infers ``pipelines/data_free/pipeline.py``'s
  ``DataFreePipeline`` (the modifier's ``requires_calibration_data`` is
  False for these weight-only / dynamic-activation schemes), whose
  ``sequential_epoch_end`` runs ``modifiers/quantization/calibration.py``'s
  ``observe`` / ``update_qparams`` on every weight
  (``observers/min_max.py``'s memoryless min-max; NVFP4's global scale
  shared over ``observers/helpers.py``'s ``FUSED_LAYER_NAMES``);
- ``model.save_pretrained(dir, save_compressed=True)``
  (``transformers/compression/compressed_tensors_utils.py``'s wrapper:
  compressed-tensors 0.19.0's compressors, config.json's
  ``quantization_config``, and a ``recipe.yaml``).

The ignore lists are the examples' own: ``["lm_head"]``
(``examples/quantization_w8a8_fp8/llama3_example.py``) and, for the MoE,
``["lm_head", "re:.*mlp.gate"]`` (the router, ``mixtral_example.py``).  The
integer group schemes run with group 32 on the tiny models (hidden 64: the
preset's 128 does not divide it) through a ``config_groups`` entry that is
the preset with that one field changed; a wider Llama runs the presets as
they are (group 128).

What must agree: the set of tensor names, and each tensor's dtype, shape
and raw bytes; config.json but ``quantization_config``; in
``quantization_config``, ``quant_method``, ``format``,
``quantization_status``, ``kv_cache_scheme``, ``sparsity_config``,
``transform_config``, ``global_compression_ratio``, ``ignore`` as a set of
modules, and ``config_groups`` as compressed-tensors 0.19.0's
``QuantizationConfig`` parses them (targets, format, and every
``QuantizationArgs`` field of weights / input / output activations: bits,
type, symmetric, strategy, group size, dynamic, scale / zero-point dtype,
block structure, actorder) but the calibration-only ``observer``; the other
files.

The differences found, each checked here to be exactly what is said:

- cosmetic (:data:`COSMETIC_ARGS`, :data:`COSMETIC_TOP`): ``version``
  (the writer's compressed-tensors: 0.19.0 / quantcore's 0.20.0 layout);
  ``moe_sparsity_config`` (a 0.20 key; 0.19 ignores it); the weights'
  ``observer: memoryless_minmax`` and ``observer_kwargs: {}`` that
  llm-compressor records (the calibration observer; no loader reads it);
  ``zp_dtype: torch.int8`` written by 0.19 for W4A16_ASYM (0.19's
  validator, ``quantization/quant_args.py``, fills the same value for
  quantcore's config, which leaves it out); ``null`` fields that 0.19
  writes and quantcore leaves out.  All of these are 0.19 / 0.20
  serialization: 0.20.0's ``QuantizationArgs._serialize`` (quant_args.py)
  drops null ``actorder`` / ``block_structure`` / ``scale_dtype``, an empty
  ``observer_kwargs``, and ``observer`` / ``zp_dtype`` that the user did
  not set; 0.19.0 has no serializer and writes every field.  Also the order
  of ``ignore``, and llm-compressor's ``recipe.yaml``.
- Gemma's RMSNorm weights: llm-compressor's ``modeling/offset_norm.py``
  (``norm_calibration_context``, ``CalibrationOffsetNorm``) replaces each
  offset norm (``x * (1 + w)``) by ``bf16(1 + w)`` during oneshot and
  restores ``bf16(that - 1)``: a lossy BF16 round trip of tensors it does
  not quantize.  quantcore copies them as stored; llm-compressor's bytes
  are checked to be that round trip of the source's.
- Mixtral's experts: llm-compressor 0.14.0.1 with transformers 5.17 saves
  the linearized experts as ``experts.N.{gate,up,down}_proj`` (the source,
  and vLLM's and transformers' Mixtral loaders, name them ``w1`` / ``w3`` /
  ``w2``); transformers 5.17 does not load those expert tensors back.
  quantcore keeps the source's names; the comparison maps the names
  (:data:`EXPERT_NAMES`) and then asks the same bytes.

Each case's end-to-end time (llm-compressor: load + oneshot + save;
quantcore: the command line) and the growth of the process's RSS during the
call are printed at the end of the module (not asserted).
"""
import json
import os
import re
import threading
import time

import numpy as np
import pytest

try:
    import llmcompressor  # noqa: F401
except ImportError:
    if os.environ.get("QC_REQUIRE_LLMC") == "1":
        raise
    pytest.skip("llm-compressor is not installed (its own venv: pyproject.toml's llmc extra)",
                allow_module_level=True)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme  # noqa: E402
from llmcompressor import oneshot  # noqa: E402
from llmcompressor.modifiers.quantization import QuantizationModifier  # noqa: E402
from llmcompressor.utils import load_context  # noqa: E402
from safetensors import safe_open  # noqa: E402

from quantcore.cli import main  # noqa: E402
from quantcore.engines import compressed_tensors as CT  # noqa: E402
from tiny_models import tiny_model  # noqa: E402

MODELS = ("llama", "qwen3", "mixtral", "gemma")
SCHEMES = ("FP8_DYNAMIC", "W4A16", "W4A16_ASYM", "W8A16", "NVFP4A16", "MXFP4A16", "MXFP4")
#: the integer group size on the tiny models (hidden 64)
TINY_GROUP = 32
MOE_IGNORE = ["lm_head", "re:.*mlp.gate"]
#: llm-compressor's names of Mixtral's linearized experts -> the source's (and quantcore's)
EXPERT_NAMES = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}
_EXPERT = re.compile(r"(\.experts\.\d+\.)(gate_proj|up_proj|down_proj)\.")
#: QuantizationArgs fields whose raw JSON may differ (the parsed configs must agree but
#: ``observer``); a field absent on one side and null on the other is no difference
COSMETIC_ARGS = {"observer", "observer_kwargs", "zp_dtype"}
#: top-level quantization_config keys that may differ
COSMETIC_TOP = {"version", "moe_sparsity_config", "ignore"}
#: the offset norms of llm-compressor's modeling/offset_norm.py among the tiny models
OFFSET_NORM_MODELS = ("gemma",)

#: transformers' notice on every save under load_context (offloading is set up, unused here)
pytestmark = pytest.mark.filterwarnings(
    "ignore:Attempting to save a model with offloaded modules:UserWarning")

TIMINGS = []
FINDINGS = {}


@pytest.fixture(scope="module", autouse=True)
def _report(request):
    """Print the timings and the differences found when the module ends."""
    yield
    tr = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if tr is None or capture is None or not TIMINGS:
        return
    with capture.global_and_fixture_disabled():
        _write_report(tr)


def _write_report(tr):
    tr.write_line("")
    tr.write_line(f"llm-compressor {llmcompressor.__version__} (load + oneshot + save) vs "
                  "quantcore quantize (command line); RSS: growth during the call")
    for kind, scheme, (lt, lm), (qt, qm) in TIMINGS:
        tr.write_line(f"  {kind:10s} {scheme:11s} llm-compressor {lt:6.2f} s {lm:+5.0f} MB   "
                      f"quantcore {qt:5.2f} s {qm:+4.0f} MB   ({lt / max(qt, 1e-9):4.1f}x)")
    for what, detail in sorted(FINDINGS.items()):
        tr.write_line(f"  difference: {what}: {detail}")


def _rss():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _measured(fn):
    """(seconds, peak RSS growth in MB) of ``fn()``: /proc/self/statm polled
    every 2 ms from a thread (after glibc's malloc_trim, where there is one,
    so that memory freed by an earlier call is not counted as free room)."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    base = _rss()
    peak = [base]
    stop = threading.Event()

    def poll():
        while not stop.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.002)
    th = threading.Thread(target=poll, daemon=True)
    th.start()
    t0 = time.perf_counter()
    try:
        fn()
    finally:
        seconds = time.perf_counter() - t0
        stop.set()
        th.join()
    return seconds, (max(peak[0], _rss()) - base) / 1e6


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """{kind: a tiny BF16 model directory} (tests/tiny_models.py), made once."""
    made = {}

    def get(kind):
        if kind not in made:
            path = tmp_path_factory.mktemp("src") / kind
            if kind == "wide-llama":
                _wide_llama(path)
            else:
                tiny_model(kind, path)
            made[kind] = str(path)
        return made[kind]
    return get


def _wide_llama(path, hidden=1024, blocks=2, heads=8, vocab=4096, std=0.5):
    """A Llama whose widths take the presets' group 128 (by default hidden
    1024, two blocks; ~40M parameters, BF16; intermediate 11/4 of hidden),
    weights N(0, std): 0.5 as tiny_models' (bench/llmc_scale.py makes a
    larger one)."""
    torch.manual_seed(1)
    cfg = transformers.LlamaConfig(hidden_size=hidden, intermediate_size=hidden * 11 // 4,
                                   num_hidden_layers=blocks, num_attention_heads=heads,
                                   num_key_value_heads=4, vocab_size=vocab,
                                   max_position_embeddings=64)
    cfg.architectures = ["LlamaForCausalLM"]
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, std)
    model.save_pretrained(path)


def _recipe(scheme, group, ignore):
    """llm-compressor's QuantizationModifier for a preset (``group``: the
    preset with its weights' group size replaced, as a config group)."""
    if group is None:
        return QuantizationModifier(targets="Linear", scheme=scheme, ignore=ignore)
    s = preset_name_to_scheme(scheme, ["Linear"])
    s.weights = s.weights.model_copy(update={"group_size": group})
    return QuantizationModifier(config_groups={"group_0": s}, ignore=ignore)


def run_llmc(src, dst, scheme, group=None, moe=False):
    """llm-compressor's data-free path end to end: load, oneshot, save."""
    recipe = _recipe(scheme, group, MOE_IGNORE if moe else ["lm_head"])
    assert not recipe.requires_calibration_data  # the data-free pipeline
    with load_context():
        model = transformers.AutoModelForCausalLM.from_pretrained(src)
    assert model.dtype == torch.bfloat16
    oneshot(model=model, recipe=recipe)
    model.save_pretrained(dst, save_compressed=True)


def run_quantcore(src, dst, scheme, group=None):
    argv = ["quantize", src, "--format", "compressed-tensors", "--scheme", scheme, "-o", dst]
    assert main(argv + (["--group-size", str(group)] if group else [])) == 0


def tensors(d):
    """{name: (safetensors dtype, shape, raw bytes as uint8)} over a directory's shards."""
    out = {}
    for f in sorted(os.listdir(d)):
        if not f.endswith(".safetensors"):
            continue
        with safe_open(os.path.join(d, f), framework="pt") as fh:
            for n in fh.keys():
                t = fh.get_tensor(n).contiguous()
                raw = t.reshape(-1).view(torch.uint8).numpy().copy()
                out[n] = (fh.get_slice(n).get_dtype(), tuple(t.shape), raw)
    return out


def _offset_round_trip(raw_bf16):
    """llm-compressor's CalibrationOffsetNorm on stored BF16 bits:
    ``bf16(float(bf16(1 + w)) - 1)`` (round to nearest even both times)."""
    w = (raw_bf16.view("<u2").astype(np.uint32) << np.uint32(16)).view(np.float32)
    up = CT.round_to(np.float32(1) + w, "BF16")
    back = CT.round_to((up - np.float32(1)).astype(np.float32), "BF16")
    return CT.as_dtype_bytes(back, "BF16").view(np.uint8)


def _args_diff(a, b):
    """Fields of two raw QuantizationArgs dicts (or None) that differ, a
    field absent on one side equal to null on the other."""
    a, b = a or {}, b or {}
    return {f for f in set(a) | set(b) if a.get(f) != b.get(f)}


def _parsed_groups(qcfg):
    """config_groups as compressed-tensors 0.19.0 parses them, ``observer``
    (calibration only) left out."""
    dump = QuantizationConfig.model_validate(qcfg).model_dump()
    for group in dump["config_groups"].values():
        for part in ("weights", "input_activations", "output_activations"):
            if group.get(part):
                group[part].pop("observer", None)
    return dump["config_groups"]


def compare(kind, scheme, src, llmc_dir, qc_dir):
    """Assert the two directories agree (the module docstring's list); return
    the cosmetic differences seen."""
    S, L, Q = tensors(src), tensors(llmc_dir), tensors(qc_dir)
    renamed = {_EXPERT.sub(lambda m: f"{m.group(1)}{EXPERT_NAMES[m.group(2)]}.", n): v
               for n, v in L.items()}
    if renamed.keys() != L.keys():
        FINDINGS["mixtral expert names"] = (
            "llm-compressor writes experts.N.gate_proj / up_proj / down_proj, the source and "
            "quantcore experts.N.w1 / w3 / w2")
        assert kind == "mixtral"
    assert len(renamed) == len(L)
    assert set(renamed) == set(Q), (sorted(set(renamed) - set(Q)), sorted(set(Q) - set(renamed)))
    quantized = {n[:-len(".weight_scale")] for n in Q if n.endswith(".weight_scale")}
    assert quantized
    rewritten = []
    for n in sorted(Q):
        (ldt, lshape, lraw), (qdt, qshape, qraw) = renamed[n], Q[n]
        assert (ldt, lshape) == (qdt, qshape), (n, (ldt, lshape), (qdt, qshape))
        module, _, suffix = n.rpartition(".")
        if module not in quantized or suffix not in CT.STORED:  # copied as stored by quantcore
            assert np.array_equal(qraw, S[n][2]), n
            if kind in OFFSET_NORM_MODELS and n.endswith("norm.weight"):
                assert np.array_equal(lraw, _offset_round_trip(S[n][2])), n
                if not np.array_equal(lraw, qraw):
                    rewritten.append(n)
                continue
        assert np.array_equal(lraw, qraw), f"{kind} {scheme}: {n} differs in " \
            f"{int((lraw != qraw).sum())} of {lraw.size} bytes"
    if kind in OFFSET_NORM_MODELS:
        assert rewritten, "the offset norms' BF16 round trip changed nothing"
        FINDINGS["gemma offset norms"] = (
            f"llm-compressor stores bf16(bf16(1 + w) - 1) for {len(rewritten)} of the "
            f"{kind} norm weights (modeling/offset_norm.py), quantcore w as stored")

    cl = json.load(open(os.path.join(llmc_dir, "config.json")))
    cq = json.load(open(os.path.join(qc_dir, "config.json")))
    ql, qq = cl.pop("quantization_config"), cq.pop("quantization_config")
    assert cl == cq
    for f in ("quant_method", "format", "quantization_status", "kv_cache_scheme",
              "sparsity_config", "transform_config", "global_compression_ratio"):
        assert ql.get(f) == qq.get(f), (f, ql.get(f), qq.get(f))
    assert set(ql["ignore"]) == set(qq["ignore"]), (ql["ignore"], qq["ignore"])
    assert _parsed_groups(ql) == _parsed_groups(qq)
    cosmetic = {f"{k}: {ql.get(k, '<absent>')!r} / {qq.get(k, '<absent>')!r}"
                for k in (set(ql) | set(qq)) - {"config_groups"} if ql.get(k) != qq.get(k)}
    assert {c.split(":")[0] for c in cosmetic} <= COSMETIC_TOP, cosmetic
    for name in set(ql["config_groups"]) | set(qq["config_groups"]):
        gl, gq = ql["config_groups"][name], qq["config_groups"][name]
        for part in ("weights", "input_activations", "output_activations"):
            diff = _args_diff(gl.get(part), gq.get(part))
            assert diff <= COSMETIC_ARGS, (part, diff)
            cosmetic |= {f"{part}.{f}: {(gl.get(part) or {}).get(f, '<absent>')!r} / "
                         f"{(gq.get(part) or {}).get(f, '<absent>')!r}" for f in diff}
    files_l, files_q = set(os.listdir(llmc_dir)), set(os.listdir(qc_dir))
    assert files_l - {"recipe.yaml"} == files_q, (files_l, files_q)
    for f in files_q - {"config.json"} - {n for n in files_q if n.endswith(".safetensors")}:
        with open(os.path.join(llmc_dir, f), "rb") as a, open(os.path.join(qc_dir, f), "rb") as b:
            assert a.read() == b.read(), f
    return cosmetic


def _case(sources, tmp_path, kind, scheme, group):
    src = sources(kind)
    lo, qo = str(tmp_path / "llmc"), str(tmp_path / "quantcore")
    q = _measured(lambda: run_quantcore(src, qo, scheme, group))
    lt = _measured(lambda: run_llmc(src, lo, scheme, group, moe=kind == "mixtral"))
    TIMINGS.append((kind, scheme, lt, q))
    for c in compare(kind, scheme, src, lo, qo):
        FINDINGS.setdefault(f"cosmetic {c.split(':')[0]}", c.split(": ", 1)[1] +
                            " (llm-compressor / quantcore)")


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("kind", MODELS)
def test_bit_for_bit_with_llm_compressor(sources, tmp_path, kind, scheme):
    _case(sources, tmp_path, kind, scheme, TINY_GROUP if CT.is_int_group(scheme) else None)


@pytest.mark.parametrize("scheme", ["FP8_DYNAMIC", "W4A16", "W4A16_ASYM", "NVFP4A16"])
def test_presets_as_they_are_on_a_wider_llama(sources, tmp_path, scheme):
    """The presets unchanged (integer groups of 128) on hidden 1024."""
    _case(sources, tmp_path, "wide-llama", scheme, None)


def test_transformers_loads_quantcores_mixtral_experts(sources, tmp_path):
    """quantcore's Mixtral directory (the experts under the source's w1 / w2
    / w3 names) loads in transformers with every expert weight found; what
    transformers makes of llm-compressor's (gate_proj / up_proj / down_proj
    names) is recorded, not asserted."""
    src = sources("mixtral")
    run_quantcore(src, str(tmp_path / "q"), "W4A16", TINY_GROUP)
    run_llmc(src, str(tmp_path / "l"), "W4A16", TINY_GROUP, moe=True)
    auto = transformers.AutoModelForCausalLM
    _, info = auto.from_pretrained(tmp_path / "q", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    _, info = auto.from_pretrained(tmp_path / "l", output_loading_info=True)
    if info["missing_keys"]:
        FINDINGS["mixtral expert names, loaded by transformers " + transformers.__version__] = (
            f"llm-compressor's directory: missing {sorted(info['missing_keys'])}, "
            f"{len(info['unexpected_keys'])} unexpected; quantcore's: none")
