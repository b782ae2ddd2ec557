"""Can Qt open a window here? Asked before the QApplication exists, because Qt's own answer is an abort.

When Qt's xcb platform plugin cannot load, Qt prints that libxcb-cursor0 may be needed (even when it is
installed and another library is the gap) and aborts the process (exit status 134). The plugin that ships in
PySide6's wheel links against a dozen X libraries that a fresh Debian or Ubuntu may lack, so before starting
Qt we ask the system's loader (`ldd`) which of them are missing and say so in one line with the command that
installs them.

Only the case we can diagnose is checked: the xcb plugin on Linux, chosen by QT_QPA_PLATFORM=xcb or by
default outside a Wayland session. Any other platform (offscreen, wayland, ...) is left to Qt.

A run that shows nothing (`tandem --prompt ... --quit-after-answer`) needs no window system at all: it takes
Qt's offscreen platform, so it works over ssh and in CI without a display.
"""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

# Every library that PySide6 6.12's libqxcb.so and the Qt libraries under it need and a minimal Debian 12
# lacks, with its Debian/Ubuntu package: read off `ldd` in a debootstrap'ed bookworm (minbase + python3),
# each path's package from `dpkg -S`. The README's apt-get line installs them all.
DEBIAN_PACKAGES = {
    "libxcb-icccm.so.4": "libxcb-icccm4",
    "libxcb-keysyms.so.1": "libxcb-keysyms1",
    "libxcb-cursor.so.0": "libxcb-cursor0",
    "libxcb-image.so.0": "libxcb-image0",
    "libxcb-render-util.so.0": "libxcb-render-util0",
    "libxcb-randr.so.0": "libxcb-randr0",
    "libxcb-shape.so.0": "libxcb-shape0",
    "libxcb-xfixes.so.0": "libxcb-xfixes0",
    "libxcb-xkb.so.1": "libxcb-xkb1",
    "libxcb-sync.so.1": "libxcb-sync1",
    "libxcb-shm.so.0": "libxcb-shm0",
    "libxcb-render.so.0": "libxcb-render0",
    "libxcb-util.so.1": "libxcb-util1",
    "libxcb.so.1": "libxcb1",
    "libX11-xcb.so.1": "libx11-xcb1",
    "libX11.so.6": "libx11-6",
    "libxkbcommon-x11.so.0": "libxkbcommon-x11-0",
    "libxkbcommon.so.0": "libxkbcommon0",
    "libEGL.so.1": "libegl1",
    "libGL.so.1": "libgl1",
    "libfontconfig.so.1": "libfontconfig1",
    "libfreetype.so.6": "libfreetype6",
    "libdbus-1.so.3": "libdbus-1-3",
    "libglib-2.0.so.0": "libglib2.0-0",
    "libgthread-2.0.so.0": "libglib2.0-0",
}

HEADLESS_PLATFORM = "offscreen"
# What Qt's offscreen platform says about window calls it cannot honour: noise to a command-line user.
QT_NOISE = ("propagateSizeHints",)
_message_handler = None  # kept referenced: Qt holds only a pointer to the handler installed

_NOT_FOUND = re.compile(r"^\s*(\S+)\s+=>\s+not found", re.MULTILINE)
_LOADER_ERROR = re.compile(r"(\S+\.so[.\d]*): cannot open shared object file")


def wants_xcb(environ: Mapping[str, str]) -> bool:
    """True where Qt will try xcb and nothing else: QT_QPA_PLATFORM=xcb, or unset outside a Wayland session
    (Qt 6 then tries wayland first and falls back to xcb, so a missing xcb library is not fatal there)."""
    if not sys.platform.startswith("linux"):
        return False
    chosen = environ.get("QT_QPA_PLATFORM", "").split(":")[0].strip()  # "xcb:option=value" takes options
    if chosen:
        return chosen == "xcb"
    return not environ.get("WAYLAND_DISPLAY") and environ.get("XDG_SESSION_TYPE", "") != "wayland"


def xcb_plugin(environ: Mapping[str, str]) -> Path | None:
    """The libqxcb.so Qt will load: from QT_QPA_PLATFORM_PLUGIN_PATH when set (Qt looks there first), else
    the one in PySide6's own plugin folder. None where there is none to check."""
    folders = [Path(environ["QT_QPA_PLATFORM_PLUGIN_PATH"])] if environ.get("QT_QPA_PLATFORM_PLUGIN_PATH") else []
    try:
        import PySide6

        folders.append(Path(PySide6.__file__).parent / "Qt" / "plugins" / "platforms")
    except ImportError:
        pass
    return next((f / "libqxcb.so" for f in folders if (f / "libqxcb.so").is_file()), None)


def missing_libraries(library: Path) -> list[str]:
    """The shared libraries `library` needs that the system's loader cannot find, in ldd's order.

    `ldd` lists every one; without it, loading the library names the first (the loader stops there)."""
    try:
        listing = subprocess.run(["ldd", str(library)], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        listing = None
    if listing is not None:
        return list(dict.fromkeys(_NOT_FOUND.findall(listing)))
    try:
        ctypes.CDLL(str(library))
    except OSError as exc:
        return _LOADER_ERROR.findall(str(exc))[:1] or [f"(unknown: {exc})"]
    return []


def install_hint(names: list[str]) -> str:
    packages = [DEBIAN_PACKAGES[n] for n in names if n in DEBIAN_PACKAGES]
    unknown = [n for n in names if n not in DEBIAN_PACKAGES]
    hint = f"sudo apt-get install {' '.join(packages)}" if packages else ""
    if unknown:
        hint += (" and " if hint else "") + f"the packages that provide {', '.join(unknown)}"
    return hint


def window_problem(environ: Mapping[str, str] | None = None) -> str | None:
    """One line saying why Qt cannot open a window here and what to do, or None where we see no problem."""
    environ = os.environ if environ is None else environ
    if not wants_xcb(environ):
        return None
    plugin = xcb_plugin(environ)
    if plugin is not None:
        missing = missing_libraries(plugin)
        if missing:
            return (
                f"cannot open a window: Qt's xcb platform plugin ({plugin}) needs {', '.join(missing)}, "
                f"which this system lacks. On Debian or Ubuntu install them with: {install_hint(missing)} "
                "(the README lists every package the window needs)."
            )
    if not environ.get("DISPLAY"):
        return (
            "cannot open a window: no X display (DISPLAY is not set). Start Tandem from a desktop session, "
            "or under a virtual screen with `xvfb-run tandem`."
        )
    return None


def platform_arguments(headless: bool, environ: Mapping[str, str] | None = None) -> list[str]:
    """QApplication arguments choosing the platform: the offscreen one for a run that shows nothing, unless
    QT_QPA_PLATFORM names a platform (the user's choice wins); none otherwise (Qt's own choice)."""
    environ = os.environ if environ is None else environ
    if headless and not environ.get("QT_QPA_PLATFORM"):
        return ["-platform", HEADLESS_PLATFORM]
    return []


def quiet_qt_noise() -> None:
    """Drop Qt's messages in QT_NOISE; every other message goes on to stderr as Qt writes it."""
    global _message_handler
    from PySide6.QtCore import qInstallMessageHandler

    if _message_handler is not None:
        return
    previous = None

    def handler(mode, context, message: str) -> None:
        if any(noise in message for noise in QT_NOISE):
            return
        if previous is not None:
            previous(mode, context, message)
        else:
            print(message, file=sys.stderr, flush=True)

    _message_handler = handler
    previous = qInstallMessageHandler(handler)
