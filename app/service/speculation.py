"""The app's speculative-decoding setting: off, n-gram drafts, or a self-speculation draft (first k layers).

    Store setting "speculation" = {"mode": "off" | "ngram" | "draft", "draft_layers": k}
        -> Speculation (parsed leniently: a damaged value means "off", never a crash)
        -> generator_arguments(model, cache) -> DynamicGenerator keyword arguments

Speculation never changes what a greedy answer says, and sampled answers keep their distribution; it only
changes speed. A self-speculation draft shares the model's weights and adds a KV cache of k layers.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from engine import Cache, Model

log = logging.getLogger(__name__)

SETTING_KEY = "speculation"
MODES = ("off", "ngram", "draft")
MODE_LABELS = {"off": "Off", "ngram": "N-gram (repeats from the chat)", "draft": "Self-speculation draft"}
DEFAULT_DRAFT_LAYERS = 8
NUM_DRAFT_TOKENS = 4


@dataclasses.dataclass(frozen=True)
class Speculation:
    """How the generator drafts tokens: `mode` is "off", "ngram" or "draft" (the model's first `draft_layers`)."""

    mode: str = "off"
    draft_layers: int = DEFAULT_DRAFT_LAYERS

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"speculation mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if isinstance(self.draft_layers, bool) or not isinstance(self.draft_layers, int) or self.draft_layers < 1:
            raise ValueError(f"draft_layers must be a positive whole number of layers, got {self.draft_layers!r}")

    @classmethod
    def from_setting(cls, value: Any) -> Speculation:
        """Parse the stored setting; anything unreadable (an older or edited database) gives "off"."""
        if not isinstance(value, dict):
            return cls()
        try:
            return cls(str(value.get("mode", "off")), value.get("draft_layers", DEFAULT_DRAFT_LAYERS))
        except ValueError as e:
            log.warning("ignoring the saved speculation setting %r: %s", value, e)
            return cls()

    def to_setting(self) -> dict[str, Any]:
        return {"mode": self.mode, "draft_layers": self.draft_layers}

    def describe(self, model: Model | None = None) -> str:
        """A short line for the window, e.g. "self-speculation draft: first 8 of 30 layers"."""
        if self.mode == "off":
            return "speculation off"
        if self.mode == "ngram":
            return "n-gram speculation"
        if model is None:
            return f"self-speculation draft: first {self.draft_layers} layers"
        layers = draft_depth(self, model)
        if layers is None:
            return "speculation off (the model is too shallow for a draft)"
        return f"self-speculation draft: first {layers} of {num_layers(model)} layers"


def load_speculation(store: Any) -> Speculation:
    """The speculation saved in `store` (an app.store.Store); "off" when none or unreadable."""
    return Speculation.from_setting(store.get_setting(SETTING_KEY))


def save_speculation(store: Any, speculation: Speculation) -> None:
    store.set_setting(SETTING_KEY, speculation.to_setting())


def num_layers(model: Model) -> int:
    """The decoder layers of the model's language part."""
    text = getattr(model, "language_model", model)
    return int(text.config.num_hidden_layers)


def draft_depth(speculation: Speculation, model: Model) -> int | None:
    """The draft's layer count for `model`: the setting, at most all layers but one; None below 2 layers."""
    total = num_layers(model)
    if total < 2:
        return None
    return min(speculation.draft_layers, total - 1)


def generator_arguments(speculation: Speculation, model: Model, cache: Cache) -> dict[str, Any]:
    """DynamicGenerator keyword arguments for `speculation` over `model` and its `cache`.

    A draft gets its own cache with the main cache's page layout (the generator requires it); building it
    allocates memory, so call this off the GUI thread.
    """
    if speculation.mode == "ngram":
        return {"use_ngram_draft": True, "num_draft_tokens": NUM_DRAFT_TOKENS}
    if speculation.mode == "draft":
        depth = draft_depth(speculation, model)
        if depth is None:
            log.warning("%s has fewer than 2 layers: no self-speculation draft", type(model).__name__)
            return {}
        if depth != speculation.draft_layers:
            log.info("the model has %d layers: the draft keeps %d", num_layers(model), depth)
        from engine.models.layer_skip import truncated_draft

        try:
            draft = truncated_draft(model, depth)
        except ValueError as e:  # an architecture that keeps its layers elsewhere: still usable, plainly
            log.warning("no self-speculation draft for %s: %s", type(model).__name__, e)
            return {}
        draft_cache = Cache(
            draft, cache.max_seq_len, page_size=cache.page_size, dtype=cache.dtype, sliding_tokens=cache.max_seq_len
        )
        return {"draft_model": draft, "draft_cache": draft_cache, "num_draft_tokens": NUM_DRAFT_TOKENS}
    return {}
