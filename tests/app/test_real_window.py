"""The real `tandem` in a real X window (Xvfb, Qt's xcb plugin), not offscreen: the demo vision model answers
a question about a picture. This is what catches a system library the window needs before a user does.

CI installs Xvfb and the README's packages (.ci/run); elsewhere the test is skipped where Xvfb is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_the_demo_model_answers_about_a_picture_in_a_real_window(tmp_path, shapes_png):
    if shutil.which("xvfb-run") is None:
        if os.environ.get("CI"):
            pytest.fail("CI must install xvfb (see .ci/run): the real-window test cannot run without it")
        pytest.skip("xvfb-run is not installed (Debian: apt-get install xvfb xauth)")
    env = {**os.environ, "QT_QPA_PLATFORM": "xcb", "TANDEM_DATA_DIR": str(tmp_path / "data")}
    env.pop("WAYLAND_DISPLAY", None)
    command = [sys.executable, "-m", "app.main", "--model", "demo", "--image", str(shapes_png)]
    command += ["--prompt", "Describe this image.", "--quit-after-answer", "-v"]
    done = subprocess.run(
        ["xvfb-run", "--auto-servernum", "--server-args=-screen 0 1280x800x24", *command],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answer = done.stdout.strip().lower()
    assert "red circle" in answer and "blue square" in answer, answer
    assert "window shown" in done.stderr  # the window really opened on the X server
    assert "qt.qpa" not in done.stderr, done.stderr[-3000:]  # no platform plugin complaints
