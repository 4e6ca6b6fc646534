"""A Hugging Face model directory, read and written as transformers does:
``config.json``, the weights as one ``model.safetensors`` or as shards
listed by ``model.safetensors.index.json`` (``{"metadata": {"total_size"},
"weight_map": {tensor: shard file}}``), and the other files (tokenizer,
generation config, chat template, ...) copied as they are.

Reading maps every shard (:class:`quantcore.checkpoints.SafetensorsReader`);
writing plans the output tensors first, cuts them into shards of at most
``max_shard_size`` bytes in their order (a tensor larger than the limit
gets a shard of its own, as transformers' ``save_pretrained``), and writes
each shard tensor by tensor.  The output directory is built in a temporary
directory beside its final path and renamed into place at the end
(``quantcore._files.atomic_dir``): an interrupted run leaves no half
directory at the final path.
"""
import json
import os
import re
import shutil

import numpy as np

from ..checkpoints import DTYPES, SUBBYTE, SafetensorsReader, SafetensorsWriter

__all__ = ["HFModel", "plan_shards", "write_model_dir", "write_quantized_dir", "parse_size",
           "DEFAULT_MAX_SHARD_SIZE"]

#: transformers 5's ``save_pretrained(max_shard_size=...)`` default
DEFAULT_MAX_SHARD_SIZE = "50GB"
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
#: ModelOpt's quantization file: never copied (written anew, or dropped)
HF_QUANT_CONFIG = "hf_quant_config.json"
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


class ModelDirError(ValueError):
    """A malformed model directory: the message names the file and field."""


def parse_size(text):
    """Bytes of a size as transformers writes it: an int, or "5GB" (10**9),
    "500MiB" (2**20), ..."""
    if isinstance(text, int) and not isinstance(text, bool):
        size = text
    else:
        m = _SIZE.match(str(text))
        if not m:
            raise ValueError(f"max shard size {text!r}: expected bytes or a size such as "
                             "'5GB' / '500MiB'")
        size = int(float(m.group(1)) * _UNITS[(m.group(2) or "").upper()])
    if size < 1:
        raise ValueError(f"max shard size {text!r} must be at least 1 byte")
    return size


def _load_json(path, what):
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except json.JSONDecodeError as exc:
        raise ModelDirError(f"{path}: {what} is not JSON ({exc.msg}, line {exc.lineno})") \
            from None


class HFModel:
    """A model directory opened for reading: ``config`` (config.json as a
    dict), ``names`` (every tensor, in shard order), ``reader(name)`` (the
    shard's :class:`SafetensorsReader`), ``info(name)``, ``other_files``
    (what is copied), ``shard_metadata`` (the first shard's metadata)."""

    def __init__(self, path, *, quantized=False):
        self.path = os.fspath(path)
        cfg_path = os.path.join(self.path, "config.json")
        if not os.path.isfile(cfg_path):
            raise ModelDirError(f"{self.path}: not a Hugging Face model directory (no "
                                "config.json)")
        self.config = _load_json(cfg_path, "config.json")
        if not isinstance(self.config, dict):
            raise ModelDirError(f"{cfg_path}: config.json must hold a JSON object")
        qcfg = self.config.get("quantization_config")
        qm = qcfg.get("quant_method") if isinstance(qcfg, dict) else qcfg
        self.quant_method = qm
        if quantized and qm not in ("compressed-tensors", "modelopt"):
            raise ModelDirError(f"{cfg_path}: quantization_config.quant_method is {qm!r}, "
                                "not 'compressed-tensors' nor 'modelopt'")
        if not quantized and qcfg is not None:
            raise ModelDirError(f"{cfg_path}: quantization_config is already set "
                                f"(quant_method {qm!r}): the model is quantized")
        index = os.path.join(self.path, INDEX)
        if os.path.isfile(index):
            data = _load_json(index, INDEX)
            wmap = data.get("weight_map") if isinstance(data, dict) else None
            if not isinstance(wmap, dict) or not wmap:
                raise ModelDirError(f"{index}: field 'weight_map' must map tensor names to "
                                    "shard files")
            for name, shard in wmap.items():
                if not isinstance(shard, str) or os.path.basename(shard) != shard or \
                        not shard.endswith(".safetensors"):
                    raise ModelDirError(f"{index}: weight_map[{name!r}] = {shard!r} is not a "
                                        ".safetensors file of the directory")
            shards = list(dict.fromkeys(wmap.values()))
            self._index_files = {INDEX}
        elif os.path.isfile(os.path.join(self.path, SINGLE)):
            wmap, shards, self._index_files = None, [SINGLE], set()
        else:
            raise ModelDirError(f"{self.path}: no {SINGLE} nor {INDEX}")
        self._readers = {}
        self._where = {}
        for shard in shards:
            p = os.path.join(self.path, shard)
            if not os.path.isfile(p):
                raise ModelDirError(f"{index}: weight_map names {shard}, which is missing")
            try:
                r = SafetensorsReader(p)
            except ValueError as exc:
                raise ModelDirError(str(exc)) from None
            self._readers[shard] = r
            for name in r:
                if name in self._where:
                    raise ModelDirError(f"{p}: tensor {name!r} is also in "
                                        f"{self._where[name]}")
                if wmap is not None and wmap.get(name) != shard:
                    raise ModelDirError(f"{index}: weight_map[{name!r}] is "
                                        f"{wmap.get(name)!r}, the tensor is in {shard}")
                self._where[name] = shard
        if wmap is not None:
            missing = sorted(set(wmap) - set(self._where))
            if missing:
                raise ModelDirError(f"{index}: weight_map lists {missing[:3]} that no shard "
                                    "holds")
        self.names = list(self._where)
        first = self._readers[shards[0]]
        self.shard_metadata = dict(first.metadata)
        skip = set(shards) | self._index_files | {"config.json", HF_QUANT_CONFIG}
        self.other_files = sorted(f for f in os.listdir(self.path)
                                  if f not in skip and not f.startswith(".")
                                  and os.path.isfile(os.path.join(self.path, f)))

    def __contains__(self, name):
        return name in self._where

    def reader(self, name):
        return self._readers[self._where[name]]

    def info(self, name):
        return self.reader(name).info(name)

    @property
    def total_bytes(self):
        return sum(self.reader(n).nbytes(n) for n in self.names)

    def close(self):
        for r in self._readers.values():
            r.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def nbytes(dtype, shape):
    """Bytes of a declared tensor."""
    n = 1
    for d in shape:
        n *= d
    bits = SUBBYTE[dtype] if dtype in SUBBYTE else 8 * DTYPES[dtype][0]
    return n * bits // 8


def plan_shards(groups, max_shard_size):
    """Cut the output into shards as transformers' ``save_pretrained``:
    ``groups`` is a list of lists of (name, dtype, shape) kept together (one
    input tensor's outputs); a group joins the current shard unless that
    would take it past ``max_shard_size`` (then a new shard starts; a group
    larger than the limit has a shard of its own).  Returns
    ``[(file name, [entries])]``: ``model.safetensors`` alone, else
    ``model-0000i-of-0000N.safetensors``."""
    shards, cur, size = [], [], 0
    for group in groups:
        g = sum(nbytes(dt, shape) for _, dt, shape in group)
        if cur and size + g > max_shard_size:
            shards.append(cur)
            cur, size = [], 0
        cur.extend(group)
        size += g
    if cur or not shards:
        shards.append(cur)
    if len(shards) == 1:
        return [(SINGLE, shards[0])]
    n = len(shards)
    return [(f"model-{i + 1:05d}-of-{n:05d}.safetensors", s) for i, s in enumerate(shards)]


def _refuse_same(src, dst):
    if os.path.exists(dst) and os.path.samefile(src, dst):
        raise ValueError(f"--output {dst} is the input directory")
    real_src, real_dst = os.path.realpath(src), os.path.realpath(dst)
    if real_dst.startswith(real_src + os.sep):
        raise ValueError(f"--output {dst} lies inside the input directory")


def write_model_dir(model, dst, config, shards, write_tensor, metadata=None, progress=None,
                    extra_files=None):
    """Write a model directory at ``dst`` (which must not exist, or be an
    empty directory): the other files of ``model`` copied, ``config`` as
    config.json, each shard of ``shards`` (:func:`plan_shards`) with
    ``write_tensor(writer, name)`` writing every entry, then the index when
    there are several shards.  Built in a temporary directory beside
    ``dst`` and renamed into place at the end, fsync-ed (removed on any
    error, or by the next run when this process died):
    :func:`quantcore._files.atomic_dir`.
    ``progress(shard file, entries)`` wraps each shard's entries (a
    progress bar) when given; ``extra_files`` ({file name: dict}) are
    written as JSON beside config.json (ModelOpt's hf_quant_config.json)."""
    dst = os.path.abspath(os.fspath(dst))
    _refuse_same(model.path, dst)
    if os.path.exists(dst) and (not os.path.isdir(dst) or os.listdir(dst)):
        raise FileExistsError(17, "exists (an empty directory or a new path is needed)", dst)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    from .._files import atomic_dir
    with atomic_dir(dst) as tmp:
        for f in model.other_files:
            shutil.copy2(os.path.join(model.path, f), os.path.join(tmp, f))
        with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as fh:
            json.dump(config, fh, indent=2, sort_keys=True)
            fh.write("\n")
        for fname, data in (extra_files or {}).items():
            with open(os.path.join(tmp, fname), "w", encoding="utf-8") as fh:
                json.dump(data, fh, indent=4)
                fh.write("\n")
        weight_map, total = {}, 0
        meta = {"format": "pt", **(metadata or {})}
        for fname, entries in shards:
            with SafetensorsWriter(os.path.join(tmp, fname), entries, meta) as w:
                for name, dt, shape in (progress(fname, entries) if progress else entries):
                    write_tensor(w, name)
                    weight_map[name] = fname
                    total += nbytes(dt, shape)
        if len(shards) > 1:
            with open(os.path.join(tmp, INDEX), "w", encoding="utf-8") as fh:
                json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, fh,
                          indent=2, sort_keys=True)
                fh.write("\n")
    return dst


#: safetensors dtype -> the numpy dtype of its stored bits that a
#: ``bits=True`` quantize receives as they are (uint16 BF16 bits, F32 values)
STORED_BITS = {"BF16": "<u2", "F32": "<f4"}


def read_weight(model, name, bits):
    """A weight of ``model`` read once: with ``bits``, as stored when its
    dtype is in :data:`STORED_BITS` (no float32 copy), else its float32
    values."""
    dt, shape = model.info(name)
    reader = model.reader(name)
    if bits and dt in STORED_BITS:
        return reader.read_bytes(name).view(STORED_BITS[dt]).reshape(shape)
    return reader.float32(name)


def nonfinite_error(name):
    """The ValueError for a weight that holds NaN or inf values."""
    return ValueError(f"tensor {name!r} holds NaN or inf values: not quantized")


#: where quantize_model's loops run
DEVICES = ("cpu", "gpu")


def check_device(device):
    """ValueError naming ``device`` unless it is one of :data:`DEVICES` and,
    for "gpu", the GPU path can run here (cupy and a device, or the CUDA
    emulator: ``quantcore_gpu.can_use``)."""
    if device not in DEVICES:
        raise ValueError(f"device {device!r}: expected one of {list(DEVICES)}")
    if device == "gpu":
        import quantcore_gpu
        ok, reason = quantcore_gpu.can_use()
        if not ok:
            raise ValueError(f"device 'gpu': the GPU path cannot run here: {reason}")


def write_quantized_dir(model, dst, config, todo, plan, quantize, max_shard_size,
                        progress=None, extra_files=None, bits=False, device="cpu",
                        read=read_weight):
    """Stream ``model`` into a model directory at ``dst``
    (:func:`write_model_dir`) with the weights ``todo`` quantized and every
    other tensor copied as stored.  ``plan(name, dtype, shape)`` lists a
    weight's output entries ``(name, dtype, shape)``;
    ``quantize(x, dtype, name)`` gives them ``{output name: array}`` from
    the weight's float32 values ``x``: one weight's outputs in memory at a
    time.  Shards of at most ``max_shard_size`` bytes (:func:`plan_shards`).
    ``bits=True``: ``x`` is the weight as stored when its dtype is in
    :data:`STORED_BITS` (BF16: its uint16 bits, read once, no float32
    copy), else its float32 values, and ``quantize`` refuses NaN / inf
    itself (:func:`nonfinite_error`).  ``device="gpu"``: ``x`` is copied to
    the current cupy device and ``quantize``'s outputs back (its loops run
    there: ``compressed_tensors.on_device``; :func:`check_device` first).
    ``read(model, name, bits)`` reads a weight (:func:`read_weight`, or
    NVFP4's ``fused.FusedSetReader.read``, which reads a fused set at once).

    Returns ``{"shards": file names, "bytes_in", "bytes_out"}``; raises
    ValueError naming a weight that holds NaN or inf values."""
    groups, source = [], {}
    for n in model.names:
        entries = plan(n, *model.info(n)) if n in todo else [(n, *model.info(n))]
        for e in entries:
            source[e[0]] = n
        groups.append(entries)
    shards = plan_shards(groups, max_shard_size)
    cache = {}

    def write_tensor(writer, name):
        src_name = source[name]
        if src_name not in todo:
            writer.copy_from(model.reader(src_name), name, src_name)
            return
        if src_name not in cache:
            cache.clear()  # (one weight's outputs at a time)
            dt = model.info(src_name)[0]
            x = read(model, src_name, bits)
            if not bits and x.size and not (np.isfinite(x.max()) and
                                            np.isfinite(x.min())):  # (NaN: NaN)
                raise nonfinite_error(src_name)
            if device == "gpu":
                import cupy
                cache[src_name] = {k: cupy.asnumpy(v) for k, v in
                                   quantize(cupy.asarray(x), dt, src_name).items()}
            else:
                cache[src_name] = quantize(x, dt, src_name)
        writer.write(name, cache[src_name][name])

    write_model_dir(model, dst, config, shards, write_tensor, progress=progress,
                    extra_files=extra_files)
    return {"shards": [f for f, _ in shards], "bytes_in": model.total_bytes,
            "bytes_out": sum(sum(nbytes(dt, s) for _, dt, s in e) for _, e in shards)}
