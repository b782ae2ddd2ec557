"""app/qt_platform.py: `tandem` says which system libraries the window needs instead of Qt's abort.

Bad inputs tried: an xcb plugin linked against a library the system lacks (a real shared library built here,
loaded through QT_QPA_PLATFORM_PLUGIN_PATH as Qt would), no DISPLAY, QT_QPA_PLATFORM naming another
platform or carrying options, a Wayland session.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from app.qt_platform import DEBIAN_PACKAGES, install_hint, missing_libraries, wants_xcb, window_problem, xcb_plugin

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def broken_plugin_folder(tmp_path) -> Path:
    """A folder holding a libqxcb.so that needs libtandem-gone.so.1, which was deleted after linking."""
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        pytest.skip("no C compiler to build a shared library with")
    gone = tmp_path / "libtandem-gone.so.1"
    (tmp_path / "gone.c").write_text("int tandem_gone(void) { return 1; }\n")
    (tmp_path / "plugin.c").write_text("int tandem_gone(void);\nint tandem_plugin(void) { return tandem_gone(); }\n")
    subprocess.run(
        [cc, "-shared", "-fPIC", "-Wl,-soname,libtandem-gone.so.1", "-o", gone, tmp_path / "gone.c"], check=True
    )
    folder = tmp_path / "platforms"
    folder.mkdir()
    subprocess.run([cc, "-shared", "-fPIC", "-o", folder / "libqxcb.so", tmp_path / "plugin.c", str(gone)], check=True)
    gone.unlink()
    return folder


def test_a_missing_library_is_named_with_its_install_command(broken_plugin_folder):
    env = {"QT_QPA_PLATFORM": "xcb", "QT_QPA_PLATFORM_PLUGIN_PATH": str(broken_plugin_folder), "DISPLAY": ":0"}
    assert xcb_plugin(env) == broken_plugin_folder / "libqxcb.so"
    assert missing_libraries(broken_plugin_folder / "libqxcb.so") == ["libtandem-gone.so.1"]
    problem = window_problem(env)
    assert problem and "libtandem-gone.so.1" in problem and "the packages that provide" in problem


def test_tandem_exits_with_one_clear_line_instead_of_qts_abort(broken_plugin_folder, tmp_path):
    # Without the check Qt itself loads this plugin, fails, prints its libxcb-cursor0 hint and aborts (134).
    env = {
        **os.environ,
        "QT_QPA_PLATFORM": "xcb",
        "QT_QPA_PLATFORM_PLUGIN_PATH": str(broken_plugin_folder),
        "DISPLAY": ":0",
        "TANDEM_DATA_DIR": str(tmp_path / "data"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "app.main", "--model", "demo"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tandem: cannot open a window:"), done.stderr
    assert "libtandem-gone.so.1" in lines[0] and "xcb-cursor0" not in lines[0]
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").iterdir())  # nothing was started


def test_the_install_command_names_debian_packages():
    hint = install_hint(["libxcb-icccm.so.4", "libxcb-keysyms.so.1"])
    assert hint == "sudo apt-get install libxcb-icccm4 libxcb-keysyms1"


def test_no_display_is_said_before_qt_aborts(monkeypatch):
    plugin = xcb_plugin({})
    if plugin is not None and missing_libraries(plugin):
        pytest.skip("this machine lacks the window's libraries; that message comes first")
    problem = window_problem({"QT_QPA_PLATFORM": "xcb"})
    assert problem and "DISPLAY is not set" in problem and "xvfb-run" in problem


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"QT_QPA_PLATFORM": "xcb"}, True),
        ({"QT_QPA_PLATFORM": "xcb:dpi=96"}, True),
        ({"QT_QPA_PLATFORM": "offscreen"}, False),
        ({"QT_QPA_PLATFORM": "wayland"}, False),
        ({}, True),
        ({"WAYLAND_DISPLAY": "wayland-0"}, False),
        ({"XDG_SESSION_TYPE": "wayland"}, False),
    ],
)
def test_only_xcb_is_checked(environ, expected):
    assert wants_xcb(environ) is expected
    if not expected:
        assert window_problem(environ) is None


def readme_packages() -> list[str]:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    line = re.search(r"^sudo apt-get install (?:-y )?(.+)$", readme, re.MULTILINE)
    assert line, "the README's apt-get line for the window's packages is missing"
    return line.group(1).split()


def test_the_readme_lists_a_package_for_every_library_the_check_knows():
    listed = set(readme_packages())
    assert {"libxcb-icccm4", "libxcb-keysyms1", "libxcb-cursor0"} <= listed
    assert listed <= set(DEBIAN_PACKAGES.values()) | {"libgl1", "libegl1"}


def test_with_the_readmes_packages_the_real_plugin_loads():
    """CI installs the README's packages (.ci/run), so the wheel's own plugin must find every library."""
    plugin = xcb_plugin({})
    assert plugin is not None
    if not os.environ.get("CI") and missing_libraries(plugin):
        pytest.skip("the README's packages are not installed on this machine (CI installs them)")
    assert missing_libraries(plugin) == []
