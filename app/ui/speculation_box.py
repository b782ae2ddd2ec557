"""The model manager's speculation setting: off / n-gram / a self-speculation draft of the first k layers.

The setting is saved in the store and handed to the service, which rebuilds its generator over the loaded
model when it changes (answers in progress stop).
"""

from __future__ import annotations

import asyncio

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QComboBox, QGroupBox, QHBoxLayout, QLabel, QSpinBox, QVBoxLayout, QWidget

from app.service.speculation import MODE_LABELS, MODES, Speculation, num_layers, save_speculation
from app.ui.theme import mark

MAX_DRAFT_LAYERS = 256  # the spin box's bound before a model says how many layers it has
SPECULATION_DELAY_MS = 600  # spin-box changes settle this long before the generator is rebuilt
SPECULATION_HELP = (
    "Speculative decoding drafts a few tokens and lets the model check them in one step. Answers stay the "
    "same; only the speed changes. N-gram drafts copy what followed the same words earlier in the chat: it "
    "helps when answers repeat text (code, lists, quotes). A self-speculation draft runs only the model's first "
    "layers; models not trained for it agree with it rarely, so it is mostly slower. Changing this stops "
    "answers in progress."
)


class SpeculationBox(QGroupBox):
    """Shows and edits the service's speculation; edits are saved in `store` and applied by `service`."""

    def __init__(self, store, service, parent: QWidget | None = None):
        super().__init__("Speculative decoding", parent)
        self.store = store
        self.service = service
        self.combo = QComboBox()
        for mode in MODES:
            self.combo.addItem(MODE_LABELS[mode], mode)
        self.layers_spin = QSpinBox()
        self.layers_spin.setRange(1, MAX_DRAFT_LAYERS)
        self.layers_spin.setPrefix("first ")
        self.layers_spin.setSuffix(" layers")
        self.layers_spin.setToolTip("How many of the model's layers the draft runs (fewer: faster, less often right)")
        self.label = QLabel()
        self.label.setWordWrap(True)
        help_label = QLabel(SPECULATION_HELP)
        help_label.setWordWrap(True)
        mark(help_label, "muted")
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(SPECULATION_DELAY_MS)
        self._timer.timeout.connect(self._edited)
        self.show_speculation(service.speculation)
        self.combo.currentIndexChanged.connect(lambda _i: self._edited())
        self.layers_spin.valueChanged.connect(lambda _v: self._timer.start())
        row = QHBoxLayout()
        row.addWidget(self.combo, 1)
        row.addWidget(self.layers_spin)
        layout = QVBoxLayout(self)
        layout.addLayout(row)
        layout.addWidget(self.label)
        layout.addWidget(help_label)

    def speculation(self) -> Speculation:
        """The speculation the widgets show (the layer count is the service's unless a draft is chosen)."""
        mode = self.combo.currentData()
        # The spin box is bounded by the loaded model: only a chosen draft takes its value, so choosing
        # n-gram on a shallow model does not overwrite the layer count saved for deeper ones.
        layers = self.layers_spin.value() if mode == "draft" else self.service.speculation.draft_layers
        return Speculation(mode, layers)

    def set_speculation(self, speculation: Speculation) -> asyncio.Task[bool]:
        """Save `speculation`, show it, and have the service use it (returns the service's task)."""
        self._timer.stop()
        save_speculation(self.store, speculation)
        self.show_speculation(speculation)
        task = self.service.set_speculation(speculation)
        if self.service.is_loaded:
            self.label.setText("Applying…")
        task.add_done_callback(lambda _t: self.show_status())
        return task

    def _edited(self) -> None:
        wanted = self.speculation()
        if wanted != self.service.speculation:
            self.set_speculation(wanted)

    def show_speculation(self, speculation: Speculation) -> None:
        """Put `speculation` in the widgets without treating it as an edit."""
        model = self.service.model
        top = num_layers(model) - 1 if model is not None else MAX_DRAFT_LAYERS
        for widget in (self.combo, self.layers_spin):
            widget.blockSignals(True)
        self.combo.setCurrentIndex(MODES.index(speculation.mode))
        self.layers_spin.setRange(1, max(1, top))
        self.layers_spin.setValue(min(speculation.draft_layers, max(1, top)))
        self.layers_spin.setEnabled(speculation.mode == "draft" and top >= 1)
        for widget in (self.combo, self.layers_spin):
            widget.blockSignals(False)
        self.show_status()

    def show_status(self) -> None:
        status = self.service.speculation_status()
        where = f" for {self.service.model_name}." if self.service.is_loaded else "; applies when a model is loaded."
        try:
            self.label.setText(status[0].upper() + status[1:] + where)
        except RuntimeError:  # the dialog was deleted while the service applied the setting
            pass
