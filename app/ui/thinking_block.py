"""A reasoning model's thinking, shown apart from its answer: a collapsible "Thinking" block above it.

    ▸ Thought for 12.3 s                (collapsed once the answer begins; click to open)
    ▾ Thinking…                         (open while the model thinks, the text streaming in)
      The user wants three colours ...

The text comes from engine.reasoning's parser (the one the server uses too), so the tags never show and a
block opened by the prompt's template (the R1 distills) is found as well as one the model opens itself.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QLabel, QToolButton, QVBoxLayout, QWidget


class ThinkingBlock(QFrame):
    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("thinkingBlock")
        self.toggle = QToolButton()
        self.toggle.setObjectName("thinkingToggle")
        self.toggle.setCheckable(True)
        self.toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.toggle.setAutoRaise(True)
        self.toggle.toggled.connect(self._show_text)
        self.text = QLabel()
        self.text.setObjectName("thinkingText")
        self.text.setWordWrap(True)
        self.text.setTextFormat(Qt.TextFormat.PlainText)
        self.text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 4)
        layout.setSpacing(2)
        layout.addWidget(self.toggle, 0, Qt.AlignmentFlag.AlignLeft)
        layout.addWidget(self.text)
        self._thinking = False
        self._seconds: float | None = None
        self.set_reasoning("", thinking=False)

    def set_reasoning(self, text: str, thinking: bool, seconds: float | None = None) -> None:
        """Show `text`; `thinking` while the block is still open (the model has not answered yet), then
        `seconds` is how long it thought. A block with no text hides itself."""
        self.text.setText(text.strip())
        if thinking != self._thinking or seconds != self._seconds:
            self._thinking, self._seconds = thinking, seconds
            # Open while thinking (the user watches it come); closed once the answer starts, as LM Studio does.
            self.toggle.setChecked(thinking)
        self._update_title()
        self.setVisible(bool(text.strip()) or thinking)

    @property
    def is_open(self) -> bool:
        return self.toggle.isChecked()

    def _update_title(self) -> None:
        arrow = "▾" if self.toggle.isChecked() else "▸"
        if self._thinking:
            title = "Thinking…"
        elif self._seconds is not None:
            title = f"Thought for {self._seconds:.1f} s"
        else:
            title = "Thinking"
        self.toggle.setText(f"{arrow} {title}")

    def _show_text(self, shown: bool) -> None:
        self.text.setVisible(shown)
        self._update_title()
