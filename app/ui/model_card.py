"""The model manager's card for the selected model: what it is (read from its headers, engine.model_info), the
context to load it with, and the memory that takes against what is free, so a model that will not fit says so
before the user presses Load.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFormLayout, QGroupBox, QLabel, QSpinBox, QWidget

from app.service.catalog import ModelInfo
from app.service.memory_plan import CONTEXT_STEP, MemoryNeed, NotEnoughMemoryError, format_bytes
from app.ui.theme import mark

FIELDS = ("Architecture", "Parameters", "Quantization", "Size on disk", "Context", "Images")
MAX_CONTEXT = 1 << 20  # the spin box's bound for a model that does not say its context


def format_count(n: int) -> str:
    """Parameter counts as model names write them: 135M, 1.07B, 48.2K."""
    for scale, suffix, digits in ((1e9, "B", 2), (1e6, "M", 1), (1e3, "K", 1)):
        if n >= scale:
            return f"{n / scale:.{digits}f}".rstrip("0").rstrip(".") + suffix
    return str(n)


def summary(info: ModelInfo) -> str:
    """One line for the model list: architecture, quantization, format, size, parameters, images."""
    parts = [p for p in (info.architecture, info.quantization, info.format) if p]
    parts.append(format_bytes(info.size_bytes))
    if info.num_parameters:
        parts.append(f"{format_count(info.num_parameters)} parameters")
    if info.can_see_images:
        parts.append("sees images")
    if not info.supported:
        parts.append("architecture not supported yet")
    return ", ".join(parts)


class ModelCard(QGroupBox):
    """Facts about one model, a context spin box and the memory line; `show_model(info)` fills it.

    The memory line comes from the service (`check_fit`), so it counts the dtype and weight layout the
    service will load with and the free memory it will check against.
    """

    context_edited = Signal(int)  # the user changed the context (not a change made by show_model)

    def __init__(self, service, parent: QWidget | None = None):
        super().__init__("About this model", parent)
        self.service = service
        self.info: ModelInfo | None = None
        self._values: dict[str, QLabel] = {}
        form = QFormLayout(self)
        for field in FIELDS:
            label = QLabel()
            label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            self._values[field] = label
            form.addRow(f"{field}:", label)
        self.context_spin = QSpinBox()
        self.context_spin.setSuffix(" tokens")
        self.context_spin.setGroupSeparatorShown(True)
        self.context_spin.setSingleStep(1024)
        self.context_spin.setToolTip("Tokens one chat may hold; a longer context needs more memory for its cache")
        self.context_spin.valueChanged.connect(self._context_changed)
        form.addRow("Load with:", self.context_spin)
        self.memory_label = QLabel()
        self.memory_label.setWordWrap(True)
        self.memory_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        form.addRow("Memory:", self.memory_label)
        self.note_label = QLabel()
        self.note_label.setWordWrap(True)
        form.addRow(self.note_label)
        self.show_model(None)
        self.setMinimumWidth(320)

    def show_model(self, info: ModelInfo | None, context: int = 0, note: str = "") -> None:
        """Show `info` (None: nothing selected, or `note` says why it cannot be read) with `context` tokens in
        the spin box (at most the model's own)."""
        self.info = info
        self.note_label.setText(note)
        self.note_label.setVisible(bool(note))
        for label in self._values.values():
            label.clear()
        self.context_spin.setEnabled(info is not None)
        if info is None:
            self.memory_label.clear()
            return
        values = self._values
        values["Architecture"].setText(info.architecture + ("" if info.supported else " (not supported yet)"))
        if info.num_parameters:
            values["Parameters"].setText(format_count(info.num_parameters))
            values["Parameters"].setToolTip(f"{info.num_parameters:,} parameters")
        values["Quantization"].setText(info.quantization or "unknown")
        values["Size on disk"].setText(format_bytes(info.size_bytes))
        values["Context"].setText(f"{info.context_length:,} tokens" if info.context_length else "unknown")
        values["Images"].setText("sees images" if info.can_see_images else "text only")
        top = info.context_length or MAX_CONTEXT
        self.context_spin.blockSignals(True)  # clamping to this model's range is not the user's edit
        self.context_spin.setRange(min(CONTEXT_STEP, top), top)
        self.context_spin.setValue(min(context or top, top))
        self.context_spin.blockSignals(False)
        self.update_memory()

    def value(self, field: str) -> str:
        """The text shown for `field` (one of FIELDS)."""
        return self._values[field].text()

    def context_tokens(self) -> int:
        return self.context_spin.value()

    def set_context(self, tokens: int) -> None:
        """Put `tokens` in the spin box as if the user had typed it."""
        self.context_spin.setValue(tokens)

    def fits(self) -> bool | None:
        """Whether the shown model fits at the shown context (None: no model)."""
        if self.info is None:
            return None
        try:
            self.service.check_fit(self.info, self.context_tokens())
        except NotEnoughMemoryError:
            return False
        return True

    def update_memory(self) -> None:
        """Measure the free memory again and redo the memory line."""
        if self.info is None:
            return
        try:
            need = self.service.check_fit(self.info, self.context_tokens())
        except NotEnoughMemoryError as e:  # the short form of the load's refusal: the card is narrow
            fitting = f" Up to {e.fitting_context:,} tokens fit." if e.fitting_context else " No context fits."
            self.memory_label.setText(
                f"Does not fit: needs about {format_bytes(e.need.total_bytes)} at {e.need.context_tokens:,} tokens, "
                f"{format_bytes(e.free_bytes)} is free.{fitting}"
            )
            mark(self.memory_label, "warning")  # the sheet's colour for it, light or dark
            return
        free = self.service.free_memory()
        self.memory_label.setText(_need_text(need) + (f"; {format_bytes(free)} free now." if free else "."))
        mark(self.memory_label, None)

    def _context_changed(self, tokens: int) -> None:
        self.update_memory()
        self.context_edited.emit(tokens)


def _need_text(need: MemoryNeed) -> str:
    return (
        f"about {format_bytes(need.total_bytes)} at {need.context_tokens:,} tokens (weights "
        f"{format_bytes(need.weights_bytes)}, cache {format_bytes(need.kv_bytes)}, working memory "
        f"{format_bytes(need.overhead_bytes)})"
    )
