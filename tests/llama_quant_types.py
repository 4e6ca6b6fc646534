"""llama.cpp's own per-tensor type choice of llama-quantize's mixes, recorded
(issue 39): writes tests/data/gguf_mix_types.json, which
tests/test_gguf_file.py::test_mix_types_recorded compares
quantcore.gguf.mixes.tensor_types with.

Not run in CI (about 2 min of compiling on 2 cores): run it by hand,
``python tests/llama_quant_types.py``, after changing the configurations
below or the sdist.  It compiles, from the llama-cpp-python sdist of
tests/ggml_oracle.py, llama.cpp's ``src/llama-quant.cpp`` with what its
testing API (``src/llama-ext.h``: ``llama_quant_model_from_metadata``,
``llama_quant_compute_types``, the API llama.cpp's own
tests/test-quant-type-selection.cpp uses) reaches: llama-model.cpp,
llama-arch.cpp, llama-vocab.cpp, llama-hparams.cpp, llama-impl.cpp, the
Llama / Qwen2 / Qwen3 model classes, ggml.c; every other symbol those
objects name is a stub that traps (never called on this path).  A driver
reads each configuration's tensors (in weights_map order) and prints the
type llama_tensor_get_type gives each quantizable one.
"""
import itertools
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ggml_oracle  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "gguf_mix_types.json")
SRC = ("src/", "include/", "ggml/include/", "ggml/src/ggml.c", "ggml/src/ggml-impl.h",
       "ggml/src/ggml-common.h", "ggml/src/ggml-quants.h", "ggml/src/ggml-threading.h",
       "ggml/src/ggml-threading.cpp")
#: llama_ftype numbers (include/llama.h)
FTYPES = {"Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18, "Q8_0": 7}
#: (n_layer, row, n_ff, n_head, n_head_kv, tied): K-quant rows, fallbacks (64: block 32; 48:
#: neither), the 70B rule (80 layers, GQA or not), tied embeddings, use_more_bits' spreads
CONFIGS = [(2, 256, 512, 4, 2, False), (8, 256, 512, 4, 2, False), (8, 256, 512, 4, 2, True),
           (2, 64, 128, 4, 2, False), (2, 48, 96, 4, 2, False), (80, 256, 512, 64, 8, False),
           (80, 256, 512, 64, 64, False), (36, 512, 1280, 8, 8, False),
           (28, 256, 300, 4, 1, True), (16, 256, 768, 4, 4, True)]
ARCHS = ("llama", "qwen2", "qwen3")

DRIVER = r"""
#include "llama.h"
#include "llama-ext.h"
#include "ggml.h"
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>
int main() {
    std::string arch; unsigned nl, ne, nff, nh, nkv; int ftype;
    std::cin >> arch >> nl >> ne >> nff >> nh >> nkv >> ftype;
    llama_quant_model_desc d = { arch.c_str(), ne, nff, nl, nh, nkv, 0, ne / nh, ne / nh };
    llama_model * m = llama_quant_model_from_metadata(&d);
    llama_model_quantize_params qp = llama_model_quantize_default_params();
    qp.ftype = (llama_ftype) ftype;
    quantize_state_impl * qs = llama_quant_init(m, &qp);
    ggml_init_params ip = { 256 * 1024 * 1024, nullptr, true };
    ggml_context * ctx = ggml_init(ip);
    std::vector<ggml_tensor *> ts; std::string name; long a, b;
    while (std::cin >> name >> a >> b) {
        ggml_tensor * t = b > 0 ? ggml_new_tensor_2d(ctx, GGML_TYPE_F32, a, b)
                                : ggml_new_tensor_1d(ctx, GGML_TYPE_F32, a);
        ggml_set_name(t, name.c_str());
        if (llama_quant_tensor_allows_quantization(qs, t)) ts.push_back(t);
        else printf("%s F32\n", name.c_str());
    }
    std::vector<ggml_type> out(ts.size());
    llama_quant_compute_types(qs, (llama_ftype) ftype, ts.data(), out.data(), ts.size());
    for (size_t i = 0; i < ts.size(); ++i) printf("%s %s\n", ts[i]->name, ggml_type_name(out[i]));
    return 0;
}
"""


def tensors(n_layer, row, ff, n_head, n_head_kv, tied):
    """[(gguf name, numpy shape)] of a dense Llama-shaped model."""
    kv = row * n_head_kv // n_head
    t = [("token_embd.weight", (300, row)), ("output_norm.weight", (row,))]
    if not tied:
        t.append(("output.weight", (300, row)))
    for i in range(n_layer):
        p = f"blk.{i}."
        t += [(p + "attn_q.weight", (row, row)), (p + "attn_k.weight", (kv, row)),
              (p + "attn_v.weight", (kv, row)), (p + "attn_output.weight", (row, row)),
              (p + "ffn_gate.weight", (ff, row)), (p + "ffn_up.weight", (ff, row)),
              (p + "ffn_down.weight", (row, ff)), (p + "attn_norm.weight", (row,)),
              (p + "ffn_norm.weight", (row,))]
    return t


def _sh(cmd, cwd):
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, shell=True)
    if res.returncode:
        raise RuntimeError(f"{cmd}\n{res.stderr[-3000:]}")
    return res.stdout


def build(root):
    """Extract and compile the driver under ``root``; its path."""
    ggml_oracle.extract(root, lambda rel: rel.startswith(SRC))
    with open(os.path.join(root, "ggml/src/ggml-version.h"), "w") as fh:
        fh.write('#pragma once\n#define GGML_VERSION "0"\n#define GGML_COMMIT "sdist"\n')
    with open(os.path.join(root, "drv.cpp"), "w") as fh:
        fh.write(DRIVER)
    inc = "-Iinclude -Iggml/include -Iggml/src -Isrc"
    objs = []
    for src in ("src/llama-quant.cpp", "src/llama-model.cpp", "src/llama-arch.cpp",
                "src/llama-vocab.cpp", "src/llama-hparams.cpp", "src/llama-impl.cpp",
                "src/models/llama.cpp", "src/models/qwen2.cpp", "src/models/qwen3.cpp"):
        obj = src.replace("/", "_") + ".o"
        _sh(f"g++ -std=c++17 -O0 -fPIC -c {src} {inc} -o {obj}", root)
        objs.append(obj)
    _sh(f"gcc -std=gnu11 -O0 -fPIC -c ggml/src/ggml.c {inc} -o ggml.o", root)
    _sh(f"g++ -std=c++17 -O0 -fPIC -c ggml/src/ggml-threading.cpp {inc} -o ggml-threading.o",
        root)
    objs += ["ggml.o", "ggml-threading.o"]
    undef = set(_sh(f"nm -u --format=just-symbols {' '.join(objs)}", root).split())
    defined = set(_sh(f"nm --defined-only --format=just-symbols {' '.join(objs)}",
                      root).split())
    libs = _sh("g++ -print-file-name=libstdc++.so.6", root).strip()
    for lib in (libs, "/lib/x86_64-linux-gnu/libc.so.6", "/lib/x86_64-linux-gnu/libm.so.6",
                "/lib/x86_64-linux-gnu/libgcc_s.so.1"):
        if os.path.exists(lib):
            defined |= {s.split("@")[0] for s in _sh(
                f"nm -D --defined-only --format=just-symbols {lib}", root).split()}
    need = sorted(undef - defined - {"_GLOBAL_OFFSET_TABLE_"})
    with open(os.path.join(root, "stubs.c"), "w") as fh:
        for s in need:
            fh.write(f"void {s}(void) __attribute__((weak));\n"
                     f"void {s}(void) {{ __builtin_trap(); }}\n")
    _sh("gcc -fPIC -c stubs.c -o stubs.o", root)
    _sh(f"g++ -std=c++17 -O0 drv.cpp {inc} {' '.join(objs)} stubs.o -lpthread -lm -o drv", root)
    return os.path.join(root, "drv")


def main():
    from quantcore.gguf import mixes
    root = os.path.join(ggml_oracle.ROOT, "build", "llama-quant-types")
    drv = os.path.join(root, "drv")
    if not os.path.exists(drv):
        import shutil
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
        drv = build(root)
    table = []
    for arch, cfg, mix in itertools.product(ARCHS, CONFIGS, FTYPES):
        t = tensors(*cfg)
        shapes = dict(t)
        order = mixes.quantize_order(list(shapes))
        inp = f"{arch} {cfg[0]} {cfg[1]} {cfg[2]} {cfg[3]} {cfg[4]} {FTYPES[mix]}\n" + "".join(
            f"{n} {shapes[n][-1]} {shapes[n][0] if len(shapes[n]) > 1 else 0}\n" for n in order)
        res = subprocess.run([drv], input=inp, capture_output=True, text=True, check=True)
        got = dict(line.split() for line in res.stdout.splitlines() if line)
        table.append({"arch": arch, "config": list(cfg), "mix": mix,
                      "types": " ".join(got[n].upper() for n in order)})
    with open(OUT, "w") as fh:
        json.dump({"source": f"llama-cpp-python {ggml_oracle.SDIST_VERSION} sdist, "
                             "src/llama-quant.cpp llama_quant_compute_types "
                             "(tests/llama_quant_types.py)",
                   "order": "quantcore.gguf.mixes.quantize_order of tests/llama_quant_types."
                            "tensors(*config)", "table": table}, fh, indent=0)
    print(f"wrote {len(table)} tables to {OUT}")


if __name__ == "__main__":
    main()
