"""The model manager's card for the selected model: what it is (read from its headers, engine.model_info), the
context and KV cache format to load it with, and the memory those take against what is free, so a model that
will not fit says so before the user presses Load.

The context starts at the largest that fits in the memory free now (weights + cache + working memory, at most
the model's own) for the chosen format, until the user picks one; "Largest that fits" goes back to that. A
cache format lists the memory its cache takes at the shown context; formats the model's heads cannot take are
listed disabled, their tooltip saying why.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QComboBox, QFormLayout, QGroupBox, QHBoxLayout, QLabel, QPushButton, QSpinBox, QWidget

from app.service.catalog import ModelInfo
from app.service.memory_plan import (
    CONTEXT_STEP,
    DEFAULT_CONTEXT_TOKENS,
    MemoryNeed,
    NotEnoughMemoryError,
    format_bytes,
    kv_format_problem,
)
from app.ui.theme import mark

FIELDS = ("Architecture", "Parameters", "Quantization", "Size on disk", "Context", "Images")
MAX_CONTEXT = 1 << 20  # the spin box's bound for a model that does not say its context

# The KV cache formats (engine.cache.KV_FORMATS) as the card lists them; "bf16" is the model's own dtype.
KV_FORMAT_NAMES = {"bf16": "Full precision", "q8": "Q8", "q6": "Q6", "q4": "Q4"}
RECOMMENDED_FORMAT = "q8"  # half the memory of full precision at a loss too small to notice: long chats
_FORMAT_TIPS = {
    "bf16": "Keys and values as the model computes them: no loss, the most memory",
    "q8": "8 bits a value (a scale per 32): about half the memory of full precision, with a loss too small to "
    "notice; recommended for long chats",
    "q6": "6 bits a value: about 0.41x the memory of full precision, with a small loss",
    "q4": "4 bits a value: about 0.28x the memory of full precision, for the longest contexts; some loss in quality",
}


def kv_format_name(kv_format: str | None) -> str:
    """A cache format as the app names it: "q8" -> "Q8", "bf16" -> "Full precision"."""
    return KV_FORMAT_NAMES.get(kv_format or "bf16", str(kv_format))


def usable_format(info: ModelInfo | None, kv_format: str) -> str:
    """`kv_format` when `info`'s model can keep its cache in it, else full precision ("bf16")."""
    if kv_format not in KV_FORMAT_NAMES:
        return "bf16"
    head_dim = info.head_dim if info is not None else None
    return kv_format if kv_format_problem(head_dim, kv_format) is None else "bf16"


def largest_fitting_context(service, info: ModelInfo, kv_format: str) -> int:
    """The context a load defaults to: the largest (whole pages, at most the model's own) that fits in the
    memory free now with a cache in `kv_format`. A model that does not say its context, or memory the platform
    does not report, gets DEFAULT_CONTEXT_TOKENS at most; when nothing fits, that default too (the load then
    says what to change)."""
    own = info.context_length
    fallback = min(DEFAULT_CONTEXT_TOKENS, own) if own else DEFAULT_CONTEXT_TOKENS
    top = own if own and service.free_memory() is not None else fallback
    try:
        service.check_fit(info, top, kv_format)
    except NotEnoughMemoryError as e:
        return e.fitting_context or fallback
    return top


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
    """Facts about one model, the context and cache format to load it with, and the memory lines;
    `show_model(info)` fills it.

    The memory figures come from the service (`check_fit`), so they count the dtype and weight layout the
    service will load with and the free memory it will check against.
    """

    context_edited = Signal(int)  # the user changed the context (0: back to the largest that fits)
    kv_format_edited = Signal(str)  # the user chose a cache format (not a change made by show_model)

    def __init__(self, service, parent: QWidget | None = None):
        super().__init__("About this model", parent)
        self.service = service
        self.info: ModelInfo | None = None
        self._largest = False  # the context shown is the largest that fits (no context chosen)
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
        self.largest_button = QPushButton("Largest that fits")
        self.largest_button.setToolTip("The longest context that fits in the memory free now, in this cache format")
        self.largest_button.clicked.connect(self.use_largest_context)
        context_row = QHBoxLayout()
        context_row.addWidget(self.context_spin, 1)
        context_row.addWidget(self.largest_button)
        form.addRow("Load with:", context_row)
        self.format_combo = QComboBox()
        # The items carry their memory figures: the closed box shows what fits, the open list shows them whole.
        self.format_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.format_combo.setMinimumContentsLength(16)
        self.format_combo.setToolTip(
            "How the cache keeps each token's keys and values: fewer bits hold a longer context in the same memory"
        )
        for kv_format, name in KV_FORMAT_NAMES.items():
            self.format_combo.addItem(name, kv_format)
        self.format_combo.currentIndexChanged.connect(self._format_changed)
        form.addRow("Cache format:", self.format_combo)
        self.cache_label = QLabel()
        self.cache_label.setWordWrap(True)
        self.cache_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        form.addRow("Cache:", self.cache_label)
        self.memory_label = QLabel()
        self.memory_label.setWordWrap(True)
        self.memory_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        form.addRow("Memory:", self.memory_label)
        self.note_label = QLabel()
        self.note_label.setWordWrap(True)
        form.addRow(self.note_label)
        self.show_model(None)
        self.setMinimumWidth(320)

    def show_model(self, info: ModelInfo | None, context: int = 0, note: str = "", kv_format: str = "bf16") -> None:
        """Show `info` (None: nothing selected, or `note` says why it cannot be read) with `context` tokens (at
        most the model's own; 0: the largest that fits) and a cache in `kv_format` (full precision when the
        model cannot take it)."""
        self.info = info
        self.note_label.setText(note)
        self.note_label.setVisible(bool(note))
        for label in self._values.values():
            label.clear()
        for widget in (self.context_spin, self.largest_button, self.format_combo):
            widget.setEnabled(info is not None)
        self._enable_formats(info)
        self._put_format(usable_format(info, kv_format))
        if info is None:
            self.memory_label.clear()
            self.cache_label.clear()
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
        self.context_spin.blockSignals(False)
        self._largest = not context
        self._put_context(
            min(context, top) if context else largest_fitting_context(self.service, info, self.kv_format())
        )

    def value(self, field: str) -> str:
        """The text shown for `field` (one of FIELDS)."""
        return self._values[field].text()

    def context_tokens(self) -> int:
        return self.context_spin.value()

    def set_context(self, tokens: int) -> None:
        """Put `tokens` in the spin box as if the user had typed it."""
        self.context_spin.setValue(tokens)

    def kv_format(self) -> str:
        """The cache format shown ("bf16", "q8", "q6", "q4")."""
        return self.format_combo.currentData() or "bf16"

    def set_kv_format(self, kv_format: str) -> None:
        """Choose `kv_format` as if the user had picked it (a format the model cannot take is not chosen)."""
        index = self.format_combo.findData(kv_format)
        if index >= 0 and self.format_combo.model().item(index).isEnabled():
            self.format_combo.setCurrentIndex(index)

    def is_largest_context(self) -> bool:
        """Whether the context shown is the largest that fits (none chosen)."""
        return self._largest

    def use_largest_context(self) -> None:
        """Show the largest context that fits in this format from now on, as a user's choice."""
        self._largest = True
        if self.info is not None:
            self._put_context(largest_fitting_context(self.service, self.info, self.kv_format()))
        self.context_edited.emit(0)

    def fits(self) -> bool | None:
        """Whether the shown model fits at the shown context and format (None: no model)."""
        if self.info is None:
            return None
        try:
            self.service.check_fit(self.info, self.context_tokens(), self.kv_format())
        except NotEnoughMemoryError:
            return False
        return True

    def update_memory(self) -> None:
        """Measure the free memory again and redo the memory lines: each format's cache, the chosen one, and
        the whole need against what is free."""
        if self.info is None:
            return
        tokens, chosen = self.context_tokens(), self.kv_format()
        for index in range(self.format_combo.count()):
            kv_format = self.format_combo.itemData(index)
            text = KV_FORMAT_NAMES[kv_format]
            if self.format_combo.model().item(index).isEnabled():
                text += f" · {_cache_text(self._need(tokens, kv_format))}"
            if kv_format == RECOMMENDED_FORMAT:  # after the figure: a narrow closed box still shows it
                text += " (recommended)"  # why: the item's tooltip
            self.format_combo.setItemText(index, text)
        try:
            need = self.service.check_fit(self.info, tokens, chosen)
        except NotEnoughMemoryError as e:  # the short form of the load's refusal: the card is narrow
            self._show_cache(e.need, fits=False)
            fitting = f" Up to {e.fitting_context:,} tokens fit." if e.fitting_context else " No context fits."
            self.memory_label.setText(
                f"Does not fit: needs about {format_bytes(e.need.total_bytes)} at {e.need.context_tokens:,} tokens, "
                f"{format_bytes(e.free_bytes)} is free.{fitting}"
            )
            mark(self.memory_label, "warning")  # the sheet's colour for it, light or dark
            return
        self._show_cache(need, fits=True)
        free = self.service.free_memory()
        self.memory_label.setText(_need_text(need) + (f"; {format_bytes(free)} free now." if free else "."))
        mark(self.memory_label, None)

    def _need(self, tokens: int, kv_format: str) -> MemoryNeed:
        try:
            return self.service.check_fit(self.info, tokens, kv_format)
        except NotEnoughMemoryError as e:
            return e.need

    def _show_cache(self, need: MemoryNeed, fits: bool) -> None:
        """The chosen context and format with their cache's memory: "32,768 tokens · Q8 · 1.1 GB"."""
        largest = " (the largest that fits)" if self._largest and fits else ""
        self.cache_label.setText(
            f"{need.context_tokens:,} tokens · {kv_format_name(need.kv_format)} · {_cache_text(need)}{largest}"
        )

    def _enable_formats(self, info: ModelInfo | None) -> None:
        """Disable the formats `info`'s heads cannot take, the tooltip saying why."""
        model = self.format_combo.model()
        for index in range(self.format_combo.count()):
            kv_format = self.format_combo.itemData(index)
            problem = kv_format_problem(info.head_dim if info is not None else None, kv_format)
            model.item(index).setEnabled(problem is None)
            tip = _FORMAT_TIPS[kv_format] if problem is None else f"Not for this model: {problem}."
            self.format_combo.setItemData(index, tip, Qt.ItemDataRole.ToolTipRole)

    def _put_format(self, kv_format: str) -> None:
        self.format_combo.blockSignals(True)  # showing a model is not the user's choice
        self.format_combo.setCurrentIndex(max(0, self.format_combo.findData(kv_format)))
        self.format_combo.blockSignals(False)

    def _put_context(self, tokens: int) -> None:
        self.context_spin.blockSignals(True)
        self.context_spin.setValue(tokens)
        self.context_spin.blockSignals(False)
        self.update_memory()

    def _context_changed(self, tokens: int) -> None:
        self._largest = False
        self.update_memory()
        self.context_edited.emit(tokens)

    def _format_changed(self, _index: int) -> None:
        if self._largest and self.info is not None:  # the largest context that fits grows as the format shrinks
            self._put_context(largest_fitting_context(self.service, self.info, self.kv_format()))
        else:
            self.update_memory()
        self.kv_format_edited.emit(self.kv_format())


def _cache_text(need: MemoryNeed) -> str:
    return format_bytes(need.kv_bytes) if need.kv_bytes else "size unknown"


def _need_text(need: MemoryNeed) -> str:
    return (
        f"about {format_bytes(need.total_bytes)} at {need.context_tokens:,} tokens (weights "
        f"{format_bytes(need.weights_bytes)}, cache {format_bytes(need.kv_bytes)}, working memory "
        f"{format_bytes(need.overhead_bytes)})"
    )
