"""The ← 2/3 → switch on a message that has other versions (a regenerated answer, an edited question)."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QToolButton, QWidget


class VersionSwitch(QWidget):
    """Shows which version of a message is on screen and steps to the one before or after; hidden while the
    message has one version. `step` carries -1 (←) or +1 (→)."""

    step = Signal(int)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        self.back_button = self._button("←", "Show the previous version of this message (Alt+Left)", -1)
        self.label = QLabel()
        self.label.setObjectName("versionLabel")
        self.forward_button = self._button("→", "Show the next version of this message (Alt+Right)", +1)
        for widget in (self.back_button, self.label, self.forward_button):
            layout.addWidget(widget)
        self.index, self.count = 0, 1
        self.set_versions(0, 1)

    def _button(self, text: str, tip: str, step: int) -> QToolButton:
        button = QToolButton(text=text)
        button.setToolTip(tip)
        button.setAutoRaise(True)
        button.clicked.connect(lambda: self.step.emit(step))
        return button

    def set_versions(self, index: int, count: int, enabled: bool = True) -> None:
        """Version `index` (0-based) of `count` is shown; `enabled` False while the chat is answering."""
        self.index, self.count = index, count
        self.label.setText(f"{index + 1}/{count}")
        self.back_button.setEnabled(enabled and index > 0)
        self.forward_button.setEnabled(enabled and index < count - 1)
        self.setVisible(count > 1)
