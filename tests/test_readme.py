"""Every code block of the README runs.

``python`` blocks run in order in one namespace, in a temporary folder.
``sh`` blocks: each ``quantcore ...`` line runs through the CLI entry point
(on a ``weights.npz`` made here); the ``make`` lines are the README's own
set-up commands, which CI runs around this test suite, so they are checked
to be the documented ones rather than run recursively.
"""
import re
import shlex
from pathlib import Path

import numpy as np
import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_the_two_setup_commands_first():
    lang, code = BLOCKS[0]
    lines = [ln.split("#")[0].strip() for ln in code.strip().splitlines()]
    assert lang == "sh" and lines == ["make demo", "make test"]


def test_python_blocks_run(tmp_path, monkeypatch):
    pytest.importorskip("dask")
    monkeypatch.chdir(tmp_path)
    namespace = {}
    blocks = [code for lang, code in BLOCKS if lang == "python"]
    assert len(blocks) >= 2
    for code in blocks:
        exec(compile(code, str(README), "exec"), namespace)  # noqa: S102 - our own README


def test_shell_blocks_run(tmp_path, monkeypatch, capsys):
    from quantcore.cli import main
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    np.savez("weights.npz", conv=rng.normal(size=(8, 4, 3, 3)).astype(np.float32))
    ran = 0
    for lang, code in BLOCKS:
        if lang != "sh":
            continue
        for line in code.strip().splitlines():
            line = line.split("#")[0].strip()
            if line.startswith("quantcore "):
                assert main(shlex.split(line)[1:]) == 0, line
                ran += 1
            else:
                assert line in ("make demo", "make test"), f"unexpected README command {line!r}"
    assert ran >= 2
