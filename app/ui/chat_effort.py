"""A chat's reasoning effort: how long a reasoning model whose chat template reads `reasoning_effort` (gpt-oss)
thinks before it answers. Saved in the chat's settings dict (app.service.generation), passed to the template by
the local backend and sent as OpenAI's `reasoning_effort` by a remote one; the box shows only where the loaded
model's template reads it (its ReasoningFormat's `effort`)."""

from __future__ import annotations

from typing import Any

from PySide6.QtWidgets import QComboBox

from app.service.generation import effort_of, with_effort

# (label, effort): "" is the model's own default (gpt-oss's template: medium).
EFFORT_CHOICES = (
    ("Effort: default", ""),
    ("Effort: low", "low"),
    ("Effort: medium", "medium"),
    ("Effort: high", "high"),
)


def build_effort_box(tab: Any) -> QComboBox:
    """The tab's effort box, set to the chat's effort and connected to it."""
    box = QComboBox()
    box.setObjectName("reasoningEffort")
    for label, effort in EFFORT_CHOICES:
        box.addItem(label, effort)
    box.setToolTip(
        "How long the model thinks before it answers: low is quickest, high thinks longest. Only for models "
        "whose chat template takes a reasoning effort (gpt-oss). Saved with the chat."
    )
    box.setCurrentIndex(box.findData(tab.reasoning_effort or ""))
    box.currentIndexChanged.connect(lambda index: tab.set_reasoning_effort(box.itemData(index) or None))
    return box


class ChoosingEffort:
    """Mixed into ChatTab: uses its `store`, `chat_id`, `chat`, `backend` and `effort_box` (build_effort_box)."""

    @property
    def reasoning_effort(self) -> str | None:
        """This chat's reasoning effort ("low", "medium", "high"; None: the model's default)."""
        return effort_of(self.chat.settings)

    def set_reasoning_effort(self, effort: str | None) -> None:
        """Ask a reasoning model for `effort` in this chat's next answers (None: its default); saved. Raises
        ValueError for an effort that is none of app.service.generation's."""
        if effort != self.reasoning_effort:
            self.store.update_chat(self.chat_id, settings=with_effort(self.chat.settings, effort))
            self.chat = self.store.get_chat(self.chat_id)
        at = self.effort_box.findData(effort or "")
        if self.effort_box.currentIndex() != at:
            self.effort_box.setCurrentIndex(at)  # called from code: keep the box in step

    def _update_effort_box(self) -> None:
        fmt = getattr(self.backend, "reasoning_format", None)
        self.effort_box.setVisible(bool(fmt is not None and fmt.effort))  # only where the template reads it
