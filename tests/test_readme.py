"""Every code block of the README runs pasted alone.

Each ``python`` block runs by itself in a fresh interpreter, in a temporary
folder.  Each ``sh`` block runs by itself in bash (``set -e``) in a
temporary folder, with this interpreter's ``bin`` first on PATH (where
``make`` / ``pip`` put ``python`` and ``quantcore``); its set-up lines
(``make ...``, ``pip install ...``, activating ``.venv``) are what CI runs
around this suite, so they are checked to be the documented ones (the
extras they name exist) rather than run recursively.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", README, flags=re.S)
#: lines that set up or build rather than use (not run here: make test runs in this
#: venv; `make wheel`'s package data is checked by tests/test_build.py)
SETUP = ("make demo", "make test", "make wheel", ". .venv/bin/activate", "pip install ")


def _extras():
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[project.optional-dependencies]")[1].split("\n[")[0]
    return set(re.findall(r"^([\w-]+) = \[", section, flags=re.M))


def _lines(code):
    return [ln.split("  #")[0].strip() for ln in code.strip().splitlines()]


def test_readme_has_the_two_setup_commands_first():
    lang, code = BLOCKS[0]
    assert lang == "sh" and _lines(code) == ["make demo", "make test"]


def test_readme_states_the_measured_times_and_the_path():
    text = " ".join(README.split())
    assert re.search(r"`make demo` took (\d+ min )?\d+ s", text)
    assert re.search(r"`make test` took (\d+ min )?\d+ s", text)
    assert ". .venv/bin/activate" in README and ".venv/bin/quantcore" in README
    assert "quantcore-fakequant" in README and "do not `pip install quantcore`" in README


def test_pip_lines_name_existing_extras():
    extras = _extras()
    pip_lines = [ln for lang, code in BLOCKS if lang == "sh" for ln in _lines(code)
                 if ln.startswith("pip install ")]
    assert pip_lines
    for line in pip_lines:
        for name in re.findall(r"\.\[([\w,-]+)\]", line):
            assert set(name.split(",")) <= extras, line
    for name in re.findall(r'pip install "\.\[([\w-]+)\]"', README):
        assert name in extras


@pytest.mark.parametrize("index", [k for k, (lang, _) in enumerate(BLOCKS) if lang == "python"])
def test_python_block_runs_alone(index, tmp_path):
    code = BLOCKS[index][1]
    if "dask" in code:
        pytest.importorskip("dask")
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]


@pytest.mark.parametrize("index", [k for k, (lang, _) in enumerate(BLOCKS) if lang == "sh"])
def test_shell_block_runs_alone(index, tmp_path):
    lines = _lines(BLOCKS[index][1])
    commands = [ln for ln in lines if not ln.startswith(SETUP)]
    for line in set(lines) - set(commands):
        assert line in ("make demo", "make test", "make wheel", ". .venv/bin/activate") or \
            line.startswith("pip install "), f"unexpected set-up line {line!r}"
    if not commands:
        return
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep
               + os.environ.get("PATH", ""))
    env.pop("QUANTCORE_DEBUG", None)
    res = subprocess.run(["bash", "-e", "-c", "\n".join(commands)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    if any(c.startswith("quantcore calibrate") for c in commands):
        assert "SQNR dB" in res.stdout and res.stderr == ""   # no progress bar in a pipe
        assert (tmp_path / "qparams.json").exists() and (tmp_path / "weights_fq.npz").exists()
        assert (tmp_path / "methods.png").exists()
        assert not (tmp_path / "methods_2.png").exists()     # one file per path
    if any(c.startswith("quantcore quantize") for c in commands):
        assert "bits per weight" in res.stdout and "copied 1 tensor(s)" in res.stdout
        assert (tmp_path / "q.safetensors").exists() and (tmp_path / "back.safetensors").exists()
