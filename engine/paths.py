"""Where Tandem keeps user data (platformdirs' user data folder, overridable for tests and portable installs) and
where its read-only assets are (beside the packages, or in a PyInstaller bundle's data folder)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

APP_NAME = "Tandem"


def user_data_dir() -> Path:
    """The data folder; `TANDEM_DATA_DIR` (read at call time, never at import) overrides it."""
    override = os.environ.get("TANDEM_DATA_DIR")
    if override:
        path = Path(override).expanduser()
    else:
        import platformdirs

        path = platformdirs.user_data_path(APP_NAME, appauthor=False)
    path.mkdir(parents=True, exist_ok=True)
    return path


def models_dir() -> Path:
    path = user_data_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def assets_dir() -> Path:
    """The `assets/` folder: beside the packages in a checkout or an installed tree; in a PyInstaller bundle,
    which has no real folder beside its packages, in the data folder the bootloader names in `sys._MEIPASS`."""
    if getattr(sys, "frozen", False):
        # A frozen app without _MEIPASS would be another freezer; its data usually sits beside the executable.
        base = getattr(sys, "_MEIPASS", None)
        return (Path(base) if base else Path(sys.executable).resolve().parent) / "assets"
    return Path(__file__).resolve().parent.parent / "assets"
