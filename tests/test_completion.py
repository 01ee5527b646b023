"""Shell completion (issue 35): ``stayer --show-completion`` prints a script for the shell it
runs in, and that script completes stayer's commands and options (Typer's own machinery)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from stayer.cli import app

ROOT = Path(__file__).resolve().parent.parent


def test_help_lists_install_and_show_completion() -> None:
    out = CliRunner().invoke(app, ["--help"]).output
    assert "--install-completion" in out and "--show-completion" in out


def test_show_completion_in_bash_prints_a_script_that_completes(tmp_path: Path) -> None:
    # `stayer` on PATH as an installed console script would be; bash is the shell it runs in.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "stayer").write_text(f'#!/bin/sh\nexec {sys.executable} -m stayer.cli "$@"\n')
    (bin_dir / "stayer").chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT),
        "STAYER_HOME": str(tmp_path / "home"),
    }

    def bash(script: str) -> str:
        # Two commands, so that bash does not exec stayer in its own place: bash stays its parent.
        p = subprocess.run(
            ["bash", "-c", f"{script}; exit $?"], capture_output=True, text=True, env=env
        )
        assert p.returncode == 0, p.stderr
        return p.stdout

    script = bash("stayer --show-completion")
    assert "_STAYER_COMPLETE=complete_bash" in script
    assert "complete -o default -F _stayer_completion stayer" in script
    assert bash("stayer --show-completion bash") == script

    def complete(*words: str) -> list[str]:
        return bash(
            f"source <(stayer --show-completion); COMP_WORDS=({' '.join(words)}); "
            f"COMP_CWORD={len(words) - 1}; _stayer_completion stayer; "
            'printf "%s\\n" "${COMPREPLY[@]}"'
        ).split()

    assert complete("stayer", "ru") == ["run", "runs"]
    assert complete("stayer", "runs", "--sta") == ["--status"]
    assert complete("stayer", "sandbox", "ex") == ["exec"]
