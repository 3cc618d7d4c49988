"""The public API: docs/library.md's example runs as written (load, expand, verify, fold from
Python), the library writes the same bytes as the CLI, verify's report judges, ``import growtool``
stays light, and the program answers help, the version and completion without torch."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import growtool

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "fixtures" / "llama-gated.safetensors"


def doc_example() -> str:
    text = (ROOT / "docs" / "library.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 1, "docs/library.md has one python example"
    return blocks[0]


def test_the_documented_example_runs(tmp_path, monkeypatch, capsys):
    shutil.copy(FIXTURE, tmp_path / "model.safetensors")
    monkeypatch.chdir(tmp_path)
    exec(compile(doc_example(), "docs/library.md", "exec"), {})
    out = capsys.readouterr().out
    assert "llama 64" in out and "random: gate 0," in out and "'expand', 'fold']" in out
    assert (tmp_path / "grown.safetensors").is_file() and (tmp_path / "plain.safetensors").is_file()


def sha(p) -> str:
    return hashlib.sha256(Path(p).read_bytes()).hexdigest()


def test_library_expand_and_fold_write_the_cli_bytes(tmp_path):
    lib = growtool.expand(FIXTURE, width=96, out=tmp_path / "lib.safetensors", recipe="srio")  # paths or strings
    assert lib == tmp_path / "lib.safetensors"
    cli = tmp_path / "cli.safetensors"
    subprocess.run(
        [sys.executable, "-m", "growtool.cli", "expand", str(FIXTURE), "--width", "96", "-o", str(cli), "-q"],
        check=True,
        capture_output=True,
    )
    assert sha(lib) == sha(cli)
    folded = growtool.fold(lib, alpha=0.5, out=str(tmp_path / "f.safetensors"), dtype="bfloat16")
    assert growtool.load(folded).main_dtype().__repr__() == "torch.bfloat16"


def test_verify_report_fails_a_different_model(tmp_path):
    other = growtool.expand(str(FIXTURE), width=96, out=str(tmp_path / "g.safetensors"), seed=1)
    ok = growtool.verify(str(FIXTURE), other)
    assert ok.passed and ok.logits_ok and ok.limit == 1e-4
    bad = growtool.verify(str(FIXTURE), other, alpha=1.0)  # the open gates change the function
    assert not bad.passed and bad.as_dict()["pass"] is False
    assert max(c.rel for _, c in bad.rows) > bad.limit


def test_bad_input_raises_the_cli_message(tmp_path):
    from growtool.nn.errors import GrowError

    with pytest.raises(GrowError, match="only one of SOURCE and GROWN"):
        growtool.verify("-", "-")
    with pytest.raises(GrowError, match="dtype"):
        growtool.expand(str(FIXTURE), width=96, out=str(tmp_path / "x.safetensors"), dtype="int8")
    assert not (tmp_path / "x.safetensors").exists()


def test_import_growtool_imports_no_torch():
    code = "import sys, growtool; assert 'torch' not in sys.modules; f = growtool.verify; import growtool.check; "
    code += "assert growtool.verify is f and callable(f); assert 'torch' in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


PROGRAM = """import gc, sys
sys.argv = ["growtool", *sys.argv[1:]]
from growtool import program
try:
    program.main()
finally:
    print("torch" in sys.modules, gc.get_freeze_count() > 0, file=sys.stderr)
"""


@pytest.mark.parametrize(
    "argv,help_text",
    [(["--help"], "Commands:"), (["--version"], "version"), (["expand", "--help"], "--width"), (["grwo"], "")],
)
def test_help_version_and_usage_errors_answer_without_torch(argv, help_text):
    """The commands import the library in their bodies: help, the version and a usage error never
    import torch (2 s of a 2-core machine's start, for a screen of text)."""
    r = subprocess.run([sys.executable, "-c", PROGRAM, *argv], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == (2 if argv == ["grwo"] else 0), r.stderr
    assert help_text in r.stdout and r.stderr.splitlines()[-1] == "False False", r.stderr


def test_a_command_imports_torch_with_the_collector_off_then_frozen():
    """``program.import_library`` before a command: torch and the library imported, what they made frozen."""
    r = subprocess.run([sys.executable, "-c", PROGRAM, "inspect", str(FIXTURE)], capture_output=True, text=True)
    assert r.returncode == 0 and "llama" in r.stderr, r.stderr
    assert r.stderr.splitlines()[-1] == "True True", r.stderr


def test_the_command_lines_dtypes_are_the_librarys():
    from growtool import cli, surgery

    assert list(cli.DTYPES) == list(surgery.DTYPES)


def test_tab_completion_answers_without_torch():
    env = {**os.environ, "_GROWTOOL_COMPLETE": "bash_complete", "COMP_WORDS": "growtool expand --wi", "COMP_CWORD": "2"}
    r = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, cwd=ROOT, env=env)
    assert r.returncode == 0 and "plain,--width" in r.stdout.splitlines(), (r.stdout, r.stderr)
    assert r.stderr.splitlines()[-1] == "False False", r.stderr
