"""Welcome: what an empty chat shows in place of its (empty) message view.

It names the loaded model and what it can do (whether it sees images), offers three example prompts that
send at a click, and for a vision model says a picture can be dropped here. A vision model's examples are
questions about a picture (describe, count, name a colour: what the bundled demo vision model was trained on);
the tab asks for the picture before sending one. It reads the tab's backend only
through the Backend protocol (name, is_loaded, can_see_images), so a remote server's model is welcomed the
same way.

    Chat with <model name>
    It reads and writes text; it sees images (or: it does not see images).
    [example 1] [example 2] [example 3]
    Drop a picture here (or attach one) and ask about it.     <- vision models only
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QLabel, QPushButton, QVBoxLayout, QWidget

from app.service.backend import Backend
from app.ui import theme

# Short, answerable even by a small model, and different in kind: a story, an explanation, a list.
EXAMPLE_PROMPTS = (
    "Write a four-line poem about the sea.",
    "Explain in two sentences why the sky is blue.",
    "Give me three ideas for a rainy Sunday.",
)
# Questions about a picture, as the demo vision model learnt them (tools/demo_vision/shapes.py).
VISION_PROMPTS = (
    "Describe this image.",
    "How many shapes are there?",
    "What colour is the circle?",
)
DROP_HINT = "Drop a picture here (or use Attach image…) and ask about it."


class Welcome(QWidget):
    """The empty chat's first screen. `prompt_chosen(text)` fires when an example is clicked; `show_for` fills
    it for a backend and says whether it should be seen at all."""

    prompt_chosen = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("welcome")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(24, 24, 24, 24)
        layout.addStretch(1)
        self.title_label = QLabel()
        self.title_label.setObjectName("welcomeTitle")
        self.title_label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.title_label.setWordWrap(True)
        font = self.title_label.font()
        font.setPointSizeF(font.pointSizeF() * 1.4)
        font.setBold(True)
        self.title_label.setFont(font)
        layout.addWidget(self.title_label)
        self.abilities_label = QLabel()
        self.abilities_label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.abilities_label.setWordWrap(True)
        theme.mark(self.abilities_label, "muted")
        layout.addWidget(self.abilities_label)
        layout.addSpacing(12)
        self.example_buttons: list[QPushButton] = []
        for text in EXAMPLE_PROMPTS:
            button = QPushButton(text)
            button.setToolTip("Send this as your first message")
            # Bind the button now: a lambda over the loop variable would send the last example from every button.
            button.clicked.connect(lambda _checked=False, button=button: self.prompt_chosen.emit(button.text()))
            layout.addWidget(button, 0, Qt.AlignmentFlag.AlignHCenter)
            self.example_buttons.append(button)
        layout.addSpacing(12)
        self.drop_hint = QLabel(DROP_HINT)
        self.drop_hint.setObjectName("dropHint")
        self.drop_hint.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.drop_hint.setWordWrap(True)
        layout.addWidget(self.drop_hint)
        layout.addStretch(2)

    def show_for(self, backend: Backend, has_messages: bool) -> bool:
        """Describe `backend`'s model; visible only while the chat is empty. Returns whether it is shown."""
        loaded = backend.is_loaded
        if loaded:
            self.title_label.setText(f"Chat with {backend.name or 'the loaded model'}")
            sees = backend.can_see_images
            self.abilities_label.setText(
                "It reads and writes text, and sees images."
                if sees
                else "It reads and writes text; it does not see images (load a vision model for that)."
            )
        else:
            sees = False
            self.title_label.setText("No model is loaded yet")
            self.abilities_label.setText("Wait for it to load, or open one from the Model menu.")
        for button, text in zip(self.example_buttons, VISION_PROMPTS if sees else EXAMPLE_PROMPTS):
            button.setText(text)
            button.setToolTip("Ask this about a picture you attach" if sees else "Send this as your first message")
            button.setEnabled(loaded)  # with no model a click could only be refused
        self.drop_hint.setVisible(sees)
        self.setVisible(not has_messages)
        return not has_messages
