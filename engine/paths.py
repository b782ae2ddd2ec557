"""Where Tandem keeps user data: platformdirs' user data folder, overridable for tests and portable installs."""

from __future__ import annotations

import os
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
