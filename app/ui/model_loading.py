"""The model manager's side of a load (a ModelManager mixin): the context a model loads with, the progress bar
and status line while it loads, what a failure says, and the offer of a context that fits when memory was
short."""

from __future__ import annotations

from app.service.catalog import model_info
from app.ui.download_box import PROGRESS_STEPS
from app.ui.model_list import same_path

CONTEXT_SETTING = "model_context_tokens"  # the context models are loaded with (each capped at its own)


class LoadProgress:
    """Mixed into ModelManager: its service, store, card, labels, progress bar and fit button."""

    def _context_for(self, path: str) -> int:
        """The context `path` loads with: the card's setting, at most the model's own."""
        try:
            own = model_info(path).context_length
        except Exception:  # the load will say what is wrong with the file
            own = None
        return min(self.context_setting(), own) if own else self.context_setting()

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
