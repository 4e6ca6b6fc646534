"""Faults lose nothing (issue 41): real ``python -m quantcore`` processes
killed (SIGKILL, SIGTERM, SIGINT) in the middle of writing an output, over
a previous good file; a full disk; two writers of one output at once; an
output that is the input by another path; an input truncated while it is
read; Ctrl-C during the imports.  After each: the previous file intact (or
the new one whole), no temporary left in the output's folder nor in TMPDIR.

A run is paused at a chosen point by a child script (CHILD) that wraps one
function the write goes through (numpy's ``write_array``, ``json.dump``,
the safetensors writer's ``write_bytes``, onnx's ``_save_bytes``, the spill
file's writes), then runs the command as ``python -m quantcore`` does
(runpy); the test waits for the pause, then signals.  The fast cases run in
``make test``; the ``slow`` ones (a real full tmpfs, onnx models) in
``make fault-test`` (--runslow).  README.md "Reliability" lists the cases.
"""
import json
import os
import resource
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import quantcore as qc
from quantcore.checkpoints import SafetensorsWriter

#: wraps one write function (sys.argv[1]), then runs sys.argv[3:] as the
#: quantcore command (or ``--code`` CODE as Python); sys.argv[2]: the file
#: touched when the pause begins
CHILD = r'''
import os, runpy, signal, sys, time
hook, ready, rest = sys.argv[1], sys.argv[2], sys.argv[3:]


def pause():
    open(ready, "w").close()
    time.sleep(120)


if hook == "npz":        # after numpy wrote the first array of the file
    import numpy.lib.format as fmt
    real = fmt.write_array
    n = [0]

    def write_array(fp, array, *a, **k):
        real(fp, array, *a, **k)
        n[0] += 1
        if n[0] == 1:
            pause()
    fmt.write_array = write_array
elif hook.split(":")[0] in ("lead", "follow"):   # two writers of one file, interleaved
    import numpy.lib.format as fmt
    real, peer = fmt.write_array, hook.split(":", 1)[1]
    n = [0]

    def wait_for(path):
        t = time.time()
        while not os.path.exists(path) and time.time() - t < 60:
            time.sleep(0.01)

    def write_array(fp, array, *a, **k):
        if hook.startswith("follow") and n[0] == 0:   # opened once the lead wrote one
            wait_for(peer)
        real(fp, array, *a, **k)
        n[0] += 1
        if hook.startswith("lead") and n[0] == 1:     # the lead ends after the follower
            open(ready, "w").close()
            wait_for(peer)
        if hook.startswith("follow") and n[0] == 2:
            open(ready, "w").close()
    fmt.write_array = write_array
elif hook == "json":     # half of the JSON text written
    import json
    def dump(obj, fp, *a, **k):
        text = json.dumps(obj, *a, **k)
        fp.write(text[:len(text) // 2])
        fp.flush()
        pause()
    json.dump = dump
elif hook == "safetensors":   # after the first tensor
    from quantcore import checkpoints
    real = checkpoints.SafetensorsWriter.write_bytes

    def write_bytes(self, name, data):
        real(self, name, data)
        self._fh.flush()
        pause()
    checkpoints.SafetensorsWriter.write_bytes = write_bytes
elif hook == "onnx":     # half of the model's bytes written
    import onnx

    def save_bytes(content, f):
        with open(f, "wb") as fh:
            fh.write(content[:len(content) // 2])
        pause()
    onnx._save_bytes = save_bytes
elif hook in ("spill", "spool"):   # the spill / spool file begun
    from quantcore.onnx import calibration, readers
    calibration.BUFFER_BYTES = 0
    method = "write_parts" if hook == "spill" else "write"
    real = getattr(readers._Spill, method)

    def write(self, *a):
        real(self, *a)
        self.file.flush()
        pause()
    setattr(readers._Spill, method, write)
elif hook.startswith("fsize:"):   # a disk that is full past this many bytes
    import resource
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    limit = int(hook.split(":", 1)[1])
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
if rest[:1] == ["--code"]:
    exec(rest[1])
else:
    sys.argv = ["quantcore"] + rest
    runpy.run_module("quantcore", run_name="__main__", alter_sys=True)
'''


def _env(tmp_path):
    env = dict(os.environ, TMPDIR=str(tmp_path / "tmp"), PYTHONDONTWRITEBYTECODE="1")
    os.makedirs(env["TMPDIR"], exist_ok=True)
    return env


def _interactive_signals():
    """preexec_fn: SIGINT at its default action in the child, as a terminal
    gives it (a shell starts background jobs, CI's included, with SIGINT
    ignored, and Python then installs no KeyboardInterrupt handler)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _child(tmp_path, hook, args, ready=None, **kw):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    ready = ready or tmp_path / "ready.child"
    proc = subprocess.Popen([sys.executable, str(script), hook, str(ready), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(tmp_path), preexec_fn=_interactive_signals, **kw)
    return proc, ready


def _wait(proc, ready, timeout=120):
    t = time.monotonic()
    while not ready.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the child ended (status {proc.returncode}) before its "
                                 f"pause:\n{out}\n{err}")
        assert time.monotonic() - t < timeout, "the child never reached its pause"
        time.sleep(0.02)


def _interrupt(tmp_path, hook, args, sig):
    """Run the command until its pause, send ``sig``; (status, stderr)."""
    proc, ready = _child(tmp_path, hook, args)
    _wait(proc, ready)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def _left(folder, keep):
    """Files in ``folder`` (and TMPDIR) other than ``keep`` (and ORT's
    telemetry id file TMPDIR/.ses, kept by ORT on purpose)."""
    out = sorted(set(os.listdir(folder)) - set(keep) - {"child.py", "tmp"})
    tmp = os.path.join(folder, "tmp")
    return [f for f in out if not f.startswith("ready.")] + \
        sorted(set(os.listdir(tmp) if os.path.isdir(tmp) else []) - {".ses"})


@pytest.fixture
def inputs(tmp_path):
    """A .npz input of two tensors, qparams for both, and a previous good
    output of each kind."""
    rng = np.random.default_rng(0)
    x = {"a": rng.standard_normal(200_000).astype(np.float32),
         "b": rng.standard_normal(300_000).astype(np.float32)}
    np.savez(tmp_path / "in.npz", **x)
    qp = {k: {"scale": 0.01, "zero_point": 0, "quant_min": -128, "quant_max": 127}
          for k in x}
    (tmp_path / "qp.json").write_text(json.dumps(qp))
    prev = {}
    for name in ("out.npz", "out.safetensors", "out.json"):
        p = tmp_path / name
        if name.endswith(".npz"):
            np.savez(p, old=np.arange(3.0))
        elif name.endswith(".json"):
            p.write_text('{"old": 1}')
        else:
            with SafetensorsWriter(p, [("old", np.float32, (3,))]) as w:
                w.write("old", np.arange(3, dtype=np.float32))
        prev[name] = p.read_bytes()
    return tmp_path, prev


KEEP = ("in.npz", "qp.json", "out.npz", "out.safetensors", "out.json")


def _fake_quant(tmp, out):
    return ["fake-quant", str(tmp / "in.npz"), "--qparams", str(tmp / "qp.json"), "-o",
            str(tmp / out)]


@pytest.mark.parametrize("hook, out, sig, status", [
    ("npz", "out.npz", signal.SIGKILL, -signal.SIGKILL),
    ("npz", "out.npz", signal.SIGINT, 130),
    ("npz", "out.npz", signal.SIGTERM, 143),
    ("safetensors", "out.safetensors", signal.SIGTERM, 143),
    ("safetensors", "out.safetensors", signal.SIGKILL, -signal.SIGKILL),
])
def test_a_killed_fake_quant_keeps_the_previous_output(inputs, hook, out, sig, status):
    tmp, prev = inputs
    code, err = _interrupt(tmp, hook, _fake_quant(tmp, out), sig)
    assert code == status, err
    if status > 0:
        assert err.strip() == {130: "quantcore: interrupted",
                               143: "quantcore: terminated"}[status], err
    assert (tmp / out).read_bytes() == prev[out]
    assert _left(tmp, KEEP) == []


def test_a_killed_calibrate_keeps_the_previous_qparams(inputs):
    tmp, prev = inputs
    code, err = _interrupt(tmp, "json", ["calibrate", str(tmp / "in.npz"), "-o",
                                         str(tmp / "out.json")], signal.SIGKILL)
    assert code == -signal.SIGKILL, err
    assert (tmp / "out.json").read_bytes() == prev["out.json"]
    assert _left(tmp, KEEP) == []


@pytest.mark.parametrize("ext", [".json", ".npz"])
def test_a_killed_save_state_keeps_the_previous_state(tmp_path, ext):
    path = tmp_path / f"state{ext}"
    code = (f"import numpy as np, quantcore as qc\n"
            f"o = qc.MinMaxObserver(); o(np.arange(5.0, dtype=np.float32))\n"
            f"qc.save_state(o, {str(path)!r})\n")
    subprocess.run([sys.executable, "-c", code], check=True, env=_env(tmp_path))
    good = path.read_bytes()
    code = code.replace("np.arange(5.0", "np.arange(9.0")
    status, err = _interrupt(tmp_path, "json" if ext == ".json" else "npz",
                             ["--code", code], signal.SIGKILL)
    assert status == -signal.SIGKILL, err
    assert path.read_bytes() == good
    assert _left(tmp_path, [path.name]) == []


def test_a_full_disk_leaves_the_previous_output_and_no_temporary(inputs):
    """A write that fails (the file size limit: EFBIG, as ENOSPC) fails the
    command with one line; the previous output and the folder as before."""
    tmp, prev = inputs
    for out in ("out.safetensors", "out.npz"):
        proc, _ = _child(tmp, "fsize:400000", _fake_quant(tmp, out))
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 2 and "cannot write" in err, err
        assert (tmp / out).read_bytes() == prev[out]
        assert _left(tmp, KEEP) == []


def test_two_writers_of_one_output_never_mix(inputs):
    """Two runs write the same -o at once (the second opens it once the
    first wrote one array, and writes it whole before the first goes on):
    the result is one run's output, whole."""
    tmp, _ = inputs
    qp2 = json.loads((tmp / "qp.json").read_text())
    for v in qp2.values():
        v["scale"] = 0.5
    (tmp / "qp2.json").write_text(json.dumps(qp2))
    procs = []
    for me, other, qp in (("lead", "follow", "qp.json"), ("follow", "lead", "qp2.json")):
        args = _fake_quant(tmp, "out.npz")
        args[3] = str(tmp / qp)
        procs.append(_child(tmp, f"{me}:{tmp / f'ready.{other}'}", args,
                            ready=tmp / f"ready.{me}")[0])
    for p in procs:
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
    with np.load(tmp / "out.npz") as z:
        got = {k: z[k] for k in z.files}
    runs = []
    for qp in ("qp.json", "qp2.json"):
        s = json.loads((tmp / qp).read_text())["a"]["scale"]
        with np.load(tmp / "in.npz") as z:
            runs.append({k: qc.fake_quant(z[k], s, 0, -128, 127) for k in z.files})
    assert any(all(np.array_equal(got[k], r[k]) for k in r) and set(got) == set(r)
               for r in runs)


def _st_input(path, n=300_000):
    with SafetensorsWriter(path, [("w", np.float32, (n // 100, 100))]) as w:
        w.write("w", np.linspace(-1, 1, n, dtype=np.float32).reshape(n // 100, 100))


def test_an_output_that_is_the_input_is_refused(tmp_path, capsys):
    """Through a symlinked folder or a hard link: refused, the input
    untouched (quantize, dequantize, fake-quant, fake-quant to .safetensors)."""
    from quantcore.cli import main
    _st_input(tmp_path / "m.safetensors")
    os.symlink(tmp_path, tmp_path / "link")
    os.link(tmp_path / "m.safetensors", tmp_path / "hard.safetensors")
    assert main(["quantize", str(tmp_path / "m.safetensors"), "--format", "int8", "-o",
                 str(tmp_path / "q.safetensors")]) == 0
    np.savez(tmp_path / "x.npz", w=np.ones(8, np.float32))
    (tmp_path / "qp.json").write_text(json.dumps(
        {"w": {"scale": 0.1, "zero_point": 0, "quant_min": -8, "quant_max": 7}}))
    before = {f: (tmp_path / f).read_bytes() for f in ("m.safetensors", "q.safetensors",
                                                        "x.npz")}
    capsys.readouterr()
    cases = [
        ["quantize", str(tmp_path / "m.safetensors"), "--format", "int8", "-o",
         str(tmp_path / "link" / "m.safetensors")],
        ["quantize", str(tmp_path / "m.safetensors"), "--format", "int8", "-o",
         str(tmp_path / "hard.safetensors")],
        ["dequantize", str(tmp_path / "q.safetensors"), "-o",
         str(tmp_path / "link" / "q.safetensors")],
        ["fake-quant", str(tmp_path / "x.npz"), "--qparams", str(tmp_path / "qp.json"), "-o",
         str(tmp_path / "link" / "x.npz")],
        ["fake-quant", str(tmp_path / "m.safetensors"), "--qparams",
         str(tmp_path / "qp.json"), "-o", str(tmp_path / "hard.safetensors")],
    ]
    for argv in cases:
        assert main(argv) == 2, argv
        assert "is the input file" in capsys.readouterr().err, argv
    for f, data in before.items():
        assert (tmp_path / f).read_bytes() == data, f


def test_a_file_truncated_under_the_reader_is_an_error_not_sigbus(tmp_path):
    """The reader maps the file: reading pages past a truncated end would be
    SIGBUS.  The size is checked (and float32 reads with pread): a
    ValueError / OSError naming the file.  In a child: SIGBUS would kill
    pytest itself."""
    path = tmp_path / "m.safetensors"
    _st_input(path)
    code = (f"import os\nfrom quantcore.checkpoints import SafetensorsReader\n"
            f"r = SafetensorsReader({str(path)!r})\n"
            f"os.truncate({str(path)!r}, 4096)\n"
            f"for read in (lambda: r.float32('w'), lambda: r.float32('w', slice(0, 3000)),\n"
            f"             lambda: r['w'].sum(), lambda: r.raw('w').sum()):\n"
            f"    try:\n        read()\n"
            f"    except (ValueError, OSError) as e:\n        print('error:', e)\n"
            f"    else:\n        print('read')\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=_env(tmp_path), timeout=120)
    assert res.returncode == 0, (res.returncode, res.stderr)
    lines = res.stdout.splitlines()
    assert len(lines) == 4 and all(ln.startswith("error:") for ln in lines), lines
    assert "changed while it was read" in lines[0] and str(path) in lines[0]


def test_ctrl_c_during_the_imports_is_one_line_and_130(tmp_path):
    """Ctrl-C while ``python -m quantcore`` imports its package (paused there
    by an import hook): 'quantcore: interrupted', status 130, no traceback."""
    site = tmp_path / "site"
    site.mkdir()
    ready = tmp_path / "ready.imports"
    (site / "sitecustomize.py").write_text(
        "import sys, time\n"
        "class Slow:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'quantcore._arrays':\n"
        f"            open({str(ready)!r}, 'w').close()\n"
        "            time.sleep(60)\n"
        "        return None\n"
        "sys.meta_path.insert(0, Slow())\n")
    env = dict(_env(tmp_path), PYTHONPATH=str(site))
    proc = subprocess.Popen([sys.executable, "-m", "quantcore", "info"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_interactive_signals)
    _wait(proc, ready)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.strip() == "quantcore: interrupted", \
        (proc.returncode, err)


def test_atomic_write_unlinks_before_a_failing_close(tmp_path, monkeypatch):
    """On a full disk the close fails again (the buffer's flush): the
    temporary is dropped first, whatever the close does."""
    from quantcore import _files
    monkeypatch.setattr(_files, "_open_unnamed", lambda folder: None)   # a named temporary
    (tmp_path / "o.bin").write_bytes(b"old")
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, hard))
        with pytest.raises(OSError):
            with _files.atomic_write(tmp_path / "o.bin") as fh:
                fh.write(b"x" * 100)
                fh.write(b"y" * 5000)   # (buffered: the failure comes at the flush)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)
    assert os.listdir(tmp_path) == ["o.bin"]
    assert (tmp_path / "o.bin").read_bytes() == b"old"


def test_a_dead_writers_named_temporary_is_removed_by_the_next_write(tmp_path):
    from quantcore import _files
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    (tmp_path / f".o.bin.{dead}.abc.tmp").write_bytes(b"half")
    (tmp_path / f".o.bin.{os.getppid()}.abc.tmp").write_bytes(b"alive")   # (a live pid)
    with _files.atomic_write(tmp_path / "o.bin") as fh:
        fh.write(b"new")
    assert sorted(os.listdir(tmp_path)) == [f".o.bin.{os.getppid()}.abc.tmp", "o.bin"]


# ---------------------------------------------------------------- slow
def _onnx_files(tmp_path):
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 512)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 512])],
        [numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=8)
    onnx.save(model, str(tmp_path / "m.onnx"))
    np.savez(tmp_path / "d.npz", x=rng.standard_normal((64, 64)).astype(np.float32))
    (tmp_path / "q.onnx").write_bytes(b"previous model")
    (tmp_path / "rd.py").write_text(
        "import numpy as np\n"
        "def make():\n"
        "    rng = np.random.default_rng(1)\n"
        "    return [{'x': rng.standard_normal((8, 64)).astype(np.float32)} for _ in range(8)]\n")
    return ["onnx", "quantize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "q.onnx"),
            "-q"]


ONNX_KEEP = ("m.onnx", "d.npz", "q.onnx", "rd.py")


@pytest.mark.slow
@pytest.mark.parametrize("hook, extra, sig, status", [
    ("onnx", ["--data", "d.npz"], signal.SIGKILL, -signal.SIGKILL),
    ("onnx", ["--data", "d.npz"], signal.SIGTERM, 143),
    ("spill", ["--data", "d.npz", "--method", "percentile", "--replay", "spill",
               "--batch-size", "8"], signal.SIGKILL, -signal.SIGKILL),
    ("spool", ["--reader", "rd.py:make"], signal.SIGINT, 130),
    ("spool", ["--reader", "rd.py:make"], signal.SIGKILL, -signal.SIGKILL),
])
def test_a_killed_onnx_quantize_keeps_the_previous_model(tmp_path, hook, extra, sig, status):
    args = _onnx_files(tmp_path) + extra   # (relative paths: run in tmp_path)
    proc, ready = _child(tmp_path, hook, args, cwd=str(tmp_path))
    _wait(proc, ready, timeout=300)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == status, err
    assert (tmp_path / "q.onnx").read_bytes() == b"previous model"
    left = _left(tmp_path, ONNX_KEEP)
    if hook == "onnx" and sig == signal.SIGKILL:
        # ORT writes to a path: its folder beside q.onnx survives SIGKILL (the
        # next write of q.onnx removes it); ORT's own TMPDIR/ort.quant.* too
        assert [f for f in left if not f.startswith("ort.quant.")] == \
            [f for f in os.listdir(tmp_path) if f.startswith(".q.onnx.")] != []
        proc, _ = _child(tmp_path, "none", args, cwd=str(tmp_path))
        assert proc.wait(timeout=300) == 0
        left = [f for f in _left(tmp_path, ONNX_KEEP) if not f.startswith("ort.quant.")]
    assert left == []


@pytest.mark.slow
def test_an_onnx_output_that_is_the_model_is_refused(tmp_path, capsys):
    from quantcore.cli import main
    args = _onnx_files(tmp_path)
    os.symlink(tmp_path, tmp_path / "link")
    model = (tmp_path / "m.onnx").read_bytes()
    args[4] = str(tmp_path / "link" / "m.onnx")
    assert main(args + ["--data", str(tmp_path / "d.npz")]) == 2
    assert "is the input file" in capsys.readouterr().err
    assert (tmp_path / "m.onnx").read_bytes() == model


@pytest.mark.slow
def test_a_real_full_tmpfs(tmp_path):
    """ENOSPC itself: a 256 KiB tmpfs (needs root to mount; skipped
    otherwise)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k",
                                            "tmpfs", str(mnt)],
                                           capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs (not root)")
    try:
        from quantcore.cli import main
        np.savez(mnt / "out.npz", old=np.arange(3.0))
        prev = (mnt / "out.npz").read_bytes()
        np.savez(tmp_path / "in.npz", a=np.ones(200_000, np.float32))
        (tmp_path / "qp.json").write_text(json.dumps(
            {"a": {"scale": 0.1, "zero_point": 0, "quant_min": -8, "quant_max": 7}}))
        for out in ("out.npz", "out.safetensors"):
            assert main(["fake-quant", str(tmp_path / "in.npz"), "--qparams",
                         str(tmp_path / "qp.json"), "-o", str(mnt / out)]) == 2
        assert sorted(os.listdir(mnt)) == ["out.npz"]
        assert (mnt / "out.npz").read_bytes() == prev
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
