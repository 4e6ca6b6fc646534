"""llama.cpp itself against quantcore's GGUF files (issue 39; ``make
llama-cpp-check``, not in ``make test``: the llama-cpp-python build takes
~12 min on 2 cores).

Two steps, two venvs:

``python tests/llama_cpp_check.py make DIR`` (the project's venv): a tiny
random Llama directory (tests/test_gguf_file.py's ``_tiny``), the sdist's
converter's F32 GGUF of it, and ``quantcore quantize --format gguf --type
MIX`` of the directory for each mix (also with an imatrix file, legacy
format).

``python tests/llama_cpp_check.py check DIR`` (a venv with llama-cpp-python
built from the same sdist, ``GGML_NATIVE=OFF``: no FMA, as the oracle):
llama.cpp's own ``llama_model_quantize`` of the F32 file for each mix (with
the imatrix's weights as ``llama-quantize --imatrix`` hands them, and its
kv overrides), then per mix: the tensors' names, types and bytes, the
key/values, the whole file, and both files loaded by llama.cpp
(``llama_cpp.Llama``) and run on the same tokens: the logits.  Exit
status 1 on any difference.  (The imatrix file's reading is the tool's,
tools/quantize/quantize.cpp, which the library does not export: here the
weights come from quantcore's reader, whose normalisation
tests/test_gguf_file.py checks; this proves their use per tensor and the
keys.)
"""
import ctypes
import os
import sys
from pathlib import Path

MIXES = ("Q4_K_M", "Q4_K_S", "Q5_K_M", "Q6_K")
TOKENS = [1, 5, 9, 22, 37, 40, 41, 7]


def _imatrix_entries(path):
    """{name: float32 weights} written to the legacy imatrix file (random,
    one per 2-D weight but token_embd; ncall 3)."""
    import numpy as np
    import gguf
    r = gguf.GGUFReader(path)
    rng = np.random.default_rng(7)
    return {t.name: rng.random(int(t.shape[0])).astype(np.float32) * 30 for t in r.tensors
            if len(t.shape) == 2 and not t.name.startswith("token_embd")}


def make(root):
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    import ggml_oracle
    import test_gguf_file as T
    from quantcore.engines import gguf_file as GF
    d = T._tiny("llama", os.path.join(root, "llama"), hidden=256, layers=2)
    f32 = os.path.join(root, "conv_f32.gguf")
    ggml_oracle.convert_hf([(d, "f32", f32)], tokenizer_pre=T.PRE)
    T._write_legacy_imatrix(Path(root, "imatrix.dat"),
                            [(n, 3, w * 3) for n, w in _imatrix_entries(f32).items()],
                            chunks=9, dataset="wiki")
    for mix in MIXES:
        GF.write_gguf(d, os.path.join(root, f"qc_{mix}.gguf"), mix, tokenizer_pre=T.PRE)
        GF.write_gguf(d, os.path.join(root, f"qc_{mix}_imatrix.gguf"), mix, tokenizer_pre=T.PRE,
                      imatrix=os.path.join(root, "imatrix.dat"))
    print(f"made {root}")


def _quantize(llama_cpp, src, dst, mix, imatrix=None, overrides=()):
    """llama_model_quantize(src, dst) with the mix's ftype, one thread; the
    imatrix {name: weights} and kv overrides [(key, value)] as
    tools/quantize/quantize.cpp passes them."""
    import numpy as np
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{mix}")
    p.nthread = 1
    keep = []
    if imatrix:
        entry = llama_cpp.llama_model_imatrix_data  # llama.h: name, data, size
        arr = (entry * (len(imatrix) + 1))()
        for i, (name, w) in enumerate(imatrix.items()):
            w = np.ascontiguousarray(w, np.float32)
            keep += [w, name.encode()]
            arr[i].name = keep[-1]
            arr[i].data = w.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            arr[i].size = w.size
        keep.append(arr)  # (the last entry stays zeroed: the terminator)
        p.imatrix = ctypes.cast(arr, ctypes.POINTER(entry))
    if overrides:
        kvo = (llama_cpp.llama_model_kv_override * (len(overrides) + 1))()
        for i, (key, value) in enumerate(overrides):
            kvo[i].key = key.encode()
            if isinstance(value, str):
                kvo[i].tag = llama_cpp.LLAMA_KV_OVERRIDE_TYPE_STR
                kvo[i].value.val_str = value.encode()[:127]
            else:
                kvo[i].tag = llama_cpp.LLAMA_KV_OVERRIDE_TYPE_INT
                kvo[i].value.val_i64 = value
        kvo[len(overrides)].key = b""
        keep.append(kvo)
        p.kv_overrides = ctypes.cast(kvo, ctypes.POINTER(llama_cpp.llama_model_kv_override))
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize({mix}) returned {rc}")


def _logits(llama_cpp, path):
    import numpy as np
    m = llama_cpp.Llama(model_path=path, n_ctx=64, logits_all=True, verbose=False, n_threads=1)
    m.eval(TOKENS)
    return np.array(m.scores[:len(TOKENS)], np.float32)


def _compare(gguf, np, ref, ours, what, llama_cpp):
    a, b = gguf.GGUFReader(ref), gguf.GGUFReader(ours)
    ta = [(t.name, t.tensor_type.name, bytes(t.data)) for t in a.tensors]
    tb = [(t.name, t.tensor_type.name, bytes(t.data)) for t in b.tensors]
    ka = [(k, f.contents()) for k, f in a.fields.items() if not k.startswith("GGUF.")]
    kb = [(k, f.contents()) for k, f in b.fields.items() if not k.startswith("GGUF.")]
    la, lb = _logits(llama_cpp, ref), _logits(llama_cpp, ours)
    same = sum(x == y for x, y in zip(ta, tb))
    whole = open(ref, "rb").read() == open(ours, "rb").read()
    ok = ta == tb and ka == kb and whole and np.array_equal(la, lb)
    print(f"{what}: tensors {same}/{len(ta)} identical, key/values "
          f"{'identical' if ka == kb else [x for x in ka if x not in kb][:3]}, whole file "
          f"{'identical' if whole else 'differs'}, logits {la.shape} "
          f"{'identical' if np.array_equal(la, lb) else 'differ'}: {'ok' if ok else 'FAIL'}")
    return ok


def check(root):
    import numpy as np
    import gguf
    import llama_cpp
    f32 = os.path.join(root, "conv_f32.gguf")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from quantcore.gguf.imatrix import read_imatrix
    im = read_imatrix(os.path.join(root, "imatrix.dat"))
    print(f"llama-cpp-python {llama_cpp.__version__}")
    ok = True
    for mix in MIXES:
        ref = os.path.join(root, f"llama_{mix}.gguf")
        _quantize(llama_cpp, f32, ref, mix)
        ok &= _compare(gguf, np, ref, os.path.join(root, f"qc_{mix}.gguf"), mix, llama_cpp)
        ref = os.path.join(root, f"llama_{mix}_imatrix.gguf")
        _quantize(llama_cpp, f32, ref, mix, im.entries, [(k, v) for k, v, _ in im.keys()])
        ok &= _compare(gguf, np, ref, os.path.join(root, f"qc_{mix}_imatrix.gguf"),
                       f"{mix} with the imatrix", llama_cpp)
    return ok


if __name__ == "__main__":
    mode, root = sys.argv[1], sys.argv[2]
    os.makedirs(root, exist_ok=True)
    if mode == "make":
        make(root)
    else:
        sys.exit(0 if check(root) else 1)
