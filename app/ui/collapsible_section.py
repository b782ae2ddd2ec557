"""CollapsibleSection: a titled section whose body opens and closes with a click on its title.

▸ Advanced          (closed: only the title shows)
▾ Advanced          (open: the body below it)
  ...
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QToolButton, QVBoxLayout, QWidget


class CollapsibleSection(QWidget):
    """Shows `body` under a title button; starts closed. Emits `toggled(bool)` when the user opens or closes it."""

    toggled = Signal(bool)

    def __init__(self, title: str, body: QWidget, parent: QWidget | None = None):
        super().__init__(parent)
        self._title = title
        self.body = body
        self.toggle = QToolButton()
        self.toggle.setObjectName("sectionToggle")
        self.toggle.setCheckable(True)
        self.toggle.setAutoRaise(True)
        self.toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextOnly)
        self.toggle.toggled.connect(self._show_body)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addWidget(self.toggle, 0, Qt.AlignmentFlag.AlignLeft)
        layout.addWidget(body)
        self._show_body(False)

    @property
    def is_open(self) -> bool:
        return self.toggle.isChecked()

    def set_title(self, title: str) -> None:
        """Change the title (the compare view's columns show a summary of their settings there)."""
        self._title = title
        self._show_title()

    def set_open(self, is_open: bool) -> None:
        """Open or close the section (as a click on the title does)."""
        self.toggle.setChecked(is_open)

    def _show_title(self) -> None:
        self.toggle.setText(f"{'▾' if self.is_open else '▸'} {self._title}")

    def _show_body(self, is_open: bool) -> None:
        self._show_title()
        self.body.setVisible(is_open)
        self.toggled.emit(is_open)
