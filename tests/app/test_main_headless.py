"""`tandem --prompt ... --quit-after-answer` as a command-line tool: no display, no window system, no Qt noise.

Bad inputs tried: no DISPLAY, WAYLAND_DISPLAY or QT_QPA_PLATFORM at all (as over ssh or in CI), --show without
--quit-after-answer.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.main import main
from app.qt_platform import platform_arguments

REPO = Path(__file__).resolve().parents[2]


def test_quit_after_answer_runs_without_a_display_and_prints_only_the_answer(tiny_folder, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    env.update(TANDEM_DATA_DIR=str(tmp_path / "data"), XDG_SESSION_TYPE="tty")
    done = subprocess.run(
        [sys.executable, "-m", "app.main", "--model", str(tiny_folder), "--prompt", "Hello", "--quit-after-answer"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip(), "no answer printed"
    assert "propagateSizeHints" not in done.stderr and "cannot open a window" not in done.stderr, done.stderr


def test_the_headless_platform_yields_to_the_users_choice():
    assert platform_arguments(headless=True, environ={}) == ["-platform", "offscreen"]
    assert platform_arguments(headless=True, environ={"QT_QPA_PLATFORM": "xcb"}) == []  # asked for: kept
    assert platform_arguments(headless=False, environ={}) == []


def test_show_needs_quit_after_answer(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--prompt", "hi", "--show"])
    assert info.value.code == 2 and "--show goes with --quit-after-answer" in capsys.readouterr().err
