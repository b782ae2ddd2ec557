"""The line above the first message the model still sees, once the chat's overflow policy dropped older turns.

Nothing above it is deleted: the messages stay stored and shown, only the model's prompt leaves them out.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QWidget

DIVIDER_TEXT = "Messages above this line are no longer seen by the model"


class ContextDivider(QFrame):
    """A labelled rule across the conversation (objectName "contextDivider" for the stylesheet)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("contextDivider")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 4, 0, 4)
        for side in ("left", "right"):
            rule = QFrame()
            rule.setFrameShape(QFrame.Shape.HLine)
            rule.setObjectName(f"contextDividerRule_{side}")
            layout.addWidget(rule, 1)
            if side == "left":
                self.label = QLabel(DIVIDER_TEXT)
                self.label.setObjectName("contextDividerLabel")
                self.label.setAlignment(Qt.AlignmentFlag.AlignCenter)
                self.label.setToolTip(
                    "The conversation outgrew the model's context, so its overflow policy left these older turns "
                    "out of the prompt. They stay in the chat."
                )
                layout.addWidget(self.label)
