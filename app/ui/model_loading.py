"""The model manager's side of a load (a ModelManager mixin): the context and cache format a model loads with,
the progress bar and status line while it loads, what a failure says, and the offer of a context that fits
when memory was short."""

from __future__ import annotations

from app.service.catalog import model_info
from app.service.memory_plan import DEFAULT_CONTEXT_TOKENS
from app.ui.download_box import PROGRESS_STEPS
from app.ui.model_card import largest_fitting_context, usable_format
from app.ui.model_list import same_path

# The context models are loaded with (each capped at its own); unset or null: the largest that fits.
CONTEXT_SETTING = "model_context_tokens"
KV_FORMAT_SETTING = "model_kv_format"  # the KV cache format models are loaded with, where a model can take it


def context_setting(store) -> int:
    """The context models are loaded with (each capped at its own): the last one chosen on the model card; 0
    when none is (each model then loads with the largest context that fits)."""
    value = store.get_setting(CONTEXT_SETTING)
    return value if isinstance(value, int) and value > 0 else 0


def kv_format_setting(store) -> str:
    """The KV cache format last chosen on the model card ("bf16": full precision, when none is)."""
    value = store.get_setting(KV_FORMAT_SETTING)
    return usable_format(None, value) if isinstance(value, str) else "bf16"


def chosen_context(store, service, path: str) -> int:
    """The context setting for `path` (0: the largest that fits), except that the model loaded now keeps the
    context it was loaded with: free memory, measured with it loaded, would undersell it."""
    chosen = context_setting(store)
    if not chosen and same_path(path, service.model_path):
        return service.context_request or service.context_length
    return chosen


def load_choice(store, service, path: str) -> tuple[int, str]:
    """(context, cache format) `path` loads with, wherever the load starts (the model manager, File → Open):
    the card's settings, the context at most the model's own (the largest that fits when none is chosen), the
    format full precision where the model cannot take it."""
    chosen, kv_format = chosen_context(store, service, path), kv_format_setting(store)
    try:
        info = model_info(path)
    except Exception:  # the load will say what is wrong with the file
        return chosen or DEFAULT_CONTEXT_TOKENS, kv_format
    kv_format = usable_format(info, kv_format)
    if not chosen:
        return largest_fitting_context(service, info, kv_format), kv_format
    return (min(chosen, info.context_length) if info.context_length else chosen), kv_format


class LoadProgress:
    """Mixed into ModelManager: its service, store, card, labels, progress bar and fit button."""

    def _on_memory_refused(self, path: str, fitting_context: int) -> None:
        self._fit_offer = (path, fitting_context) if fitting_context > 0 else None

    def _load_offered_context(self) -> None:
        """Load the refused model again with the longest context that fits (it becomes the chosen context)."""
        if self._fit_offer is None:
            return
        path, context = self._fit_offer
        self.store.set_setting(CONTEXT_SETTING, context)
        self.select_path(path)  # the card shows the model and its new context
        self.load(path, context)

    def _on_loading_started(self, name: str) -> None:
        self.fit_button.hide()
        self.progress_bar.show()
        self.progress_bar.setValue(0)
        self.load_button.setEnabled(False)
        self.status_label.setText(f"Loading {name}…")

    def _on_loading_progress(self, fraction: float) -> None:
        self.progress_bar.show()
        self.progress_bar.setValue(round(max(0.0, min(1.0, fraction)) * PROGRESS_STEPS))

    def _on_model_loaded(self, name: str) -> None:
        self._pending = None
        self.clear_error()  # an earlier failure (a load, a download) is old news once a model is in use
        self.download_box.clear_error()
        self.progress_bar.setValue(PROGRESS_STEPS)
        self.progress_bar.hide()
        # A GGUF whose projector could not be paired loads text-only: say why pictures will not be seen.
        reason = getattr(self.service.model, "vision_error", None)
        self.status_label.setText(f"Loaded: {name}" + (f". Images are off: {reason}" if reason else ""))
        self.refresh()
        self.speculation_box.show_speculation(self.service.speculation)

    def _on_load_failed(self, message: str) -> None:
        path = self._pending[0] if self._pending else None
        self._pending = None
        self.progress_bar.hide()
        self._update_buttons()
        # Name the file even when the message does not (the service's usually does).
        prefix = f"Could not load {path}:\n" if path and path not in message else ""
        kept = f"\nThe previous model, {self.service.model_name}, is still loaded." if self.service.is_loaded else ""
        self.show_error(prefix + message + kept)
        self.status_label.setText(f"Loaded: {self.service.model_name}" if self.service.is_loaded else "")
        offer, self._fit_offer = self._fit_offer, None
        if offer is not None and same_path(offer[0], path):
            self._fit_offer = offer
            self.fit_button.setText(f"Load with a {offer[1]:,}-token context")
            self.fit_button.show()
        self.card.update_memory()
