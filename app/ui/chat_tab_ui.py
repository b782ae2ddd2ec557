"""The chat tab's widgets and their layout, built onto the tab (Qt's setupUi idiom): what each widget does is
the tab's (app/ui/chat_tab.py), where they sit is here.

    system prompt
    messages (MessageView), or while the chat is empty the welcome (app/ui/welcome.py) in its place
    notice (an error the user should read) [its action] [x]
    attachments strip
    input                                   [JSON mode / Think / Effort]  (Think, Effort: where the template has them)
    [Attach image…] [context meter.................] [Stop] [Send]
"""

from __future__ import annotations

from typing import Any

from PySide6.QtWidgets import (
    QCheckBox,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.ui.attachments import AttachmentStrip
from app.ui.chat_effort import build_effort_box
from app.ui.chat_input import ChatInput
from app.ui.context_meter import ContextMeter
from app.ui.message_view import MessageView
from app.ui.welcome import VISION_PROMPTS, Welcome


def build_chat_tab(tab: Any) -> None:
    """Create the tab's widgets as its attributes and connect them to its slots."""
    layout = QVBoxLayout(tab)
    layout.setContentsMargins(6, 6, 6, 6)
    tab.system_prompt_edit = QPlainTextEdit(tab.chat.system_prompt)
    tab.system_prompt_edit.setObjectName("systemPrompt")
    tab.system_prompt_edit.setPlaceholderText("System prompt for this chat (optional)")
    tab.system_prompt_edit.setFixedHeight(tab.fontMetrics().lineSpacing() * 2 + 14)
    tab.system_prompt_edit.textChanged.connect(tab._system_timer.start)
    layout.addWidget(tab.system_prompt_edit)

    tab.view = MessageView()
    layout.addWidget(tab.view, 1)
    tab.welcome = Welcome()
    tab.welcome.prompt_chosen.connect(lambda text: send_example(tab, text))
    layout.addWidget(tab.welcome, 1)

    tab.notice = QWidget()
    tab.notice.setObjectName("notice")
    notice_row = QHBoxLayout(tab.notice)
    notice_row.setContentsMargins(8, 4, 4, 4)
    tab.notice_label = QLabel()
    tab.notice_label.setObjectName("noticeLabel")
    tab.notice_label.setWordWrap(True)
    notice_row.addWidget(tab.notice_label, 1)
    tab.notice_button = QPushButton()  # what to do about it, when there is something (show_notice's action)
    tab.notice_button.setVisible(False)
    tab.notice_button.clicked.connect(tab._notice_action_clicked)
    notice_row.addWidget(tab.notice_button)
    close = QToolButton(text="✕")
    close.setAutoRaise(True)
    close.setToolTip("Dismiss")
    close.clicked.connect(tab.clear_notice)
    notice_row.addWidget(close)
    tab.notice.setVisible(False)
    layout.addWidget(tab.notice)

    tab.edit_bar = QWidget()
    edit_row = QHBoxLayout(tab.edit_bar)
    edit_row.setContentsMargins(8, 0, 4, 0)
    edit_row.addWidget(QLabel("Editing an earlier message: sending starts a new branch; the old one stays (←/→)."), 1)
    cancel_edit = QPushButton("Cancel edit")
    cancel_edit.clicked.connect(tab.cancel_edit)
    edit_row.addWidget(cancel_edit)
    tab.edit_bar.setVisible(False)
    layout.addWidget(tab.edit_bar)

    tab.strip = AttachmentStrip()
    layout.addWidget(tab.strip)

    tab.input = ChatInput()
    tab.input.setFixedHeight(tab.fontMetrics().lineSpacing() * 4 + 16)
    tab.input.send_requested.connect(tab.send)
    tab.input.image_pasted.connect(tab.attach_image)
    tab.input.files_dropped.connect(tab.attach_files)
    tab.input.textChanged.connect(tab._draft_edited)
    tab.strip.changed.connect(tab._draft_edited)
    tab.json_mode_box = QCheckBox("JSON mode")
    tab.json_mode_box.setObjectName("jsonMode")
    tab.json_mode_box.setToolTip(
        "Answers in this chat are one JSON object: the engine allows only tokens that keep the answer "
        "valid JSON, and ends it when the object closes. Ask for the fields you want in your message. "
        "Saved with the chat."
    )
    tab.json_mode_box.setChecked(tab.json_mode)
    tab.json_mode_box.toggled.connect(tab.set_json_mode)
    tab.thinking_box = QCheckBox("Think")
    tab.thinking_box.setObjectName("thinking")
    tab.thinking_box.setToolTip(
        "Let the model think before it answers (its thinking shows in a Thinking block). Off: it answers at "
        "once. Only for models whose chat template has the switch (Qwen3). Saved with the chat."
    )
    tab.thinking_box.setChecked(tab.thinking is not False)
    tab.thinking_box.toggled.connect(tab.set_thinking)
    tab.effort_box = build_effort_box(tab)
    # Beside the input rather than in the button row below, which sets the window's minimum width.
    toggles = QVBoxLayout()
    toggles.addWidget(tab.json_mode_box)
    toggles.addWidget(tab.thinking_box)
    toggles.addWidget(tab.effort_box)
    toggles.addStretch()
    input_row = QHBoxLayout()
    input_row.addWidget(tab.input, 1)
    input_row.addLayout(toggles)
    layout.addLayout(input_row)

    row = QHBoxLayout()
    tab.attach_button = QPushButton("Attach image…")
    tab.attach_button.clicked.connect(tab._pick_files)
    row.addWidget(tab.attach_button)
    tab.context_meter = ContextMeter()
    row.addWidget(tab.context_meter, 1)
    tab.stop_button = QPushButton("Stop")
    tab.stop_button.setToolTip("Stop the answer (Esc); what it wrote so far is kept")
    tab.stop_button.clicked.connect(tab.stop)
    tab.send_button = QPushButton("Send")
    tab.send_button.setDefault(True)
    tab.send_button.setToolTip("Send (Enter)")
    tab.send_button.clicked.connect(tab.send)
    row.addWidget(tab.stop_button)
    row.addWidget(tab.send_button)
    layout.addLayout(row)
    tab._update_controls()


def send_example(tab: Any, text: str) -> None:
    """A welcome example clicked: it goes through the input and send() like a typed message (same checks). A
    question about a picture waits in the input until one is attached: asked of no picture, it means nothing."""
    tab.input.setPlainText(text)
    if text in VISION_PROMPTS and not tab.strip.attachments():
        tab.input.setFocus()
        tab.show_notice("Attach a picture first (drop it here or use Attach image…), then press Enter to ask.")
        return
    tab.send()
