"""What the chat front door refuses; each caller words it for its users (the app's window, the server's 400)."""

from __future__ import annotations


class ContextOverflow(ValueError):
    """The prompt leaves no room for the answer in the context (or less room than was asked for)."""

    def __init__(self, num_prompt: int, context_length: int, max_new_tokens: int | None):
        self.num_prompt = num_prompt
        self.context_length = context_length
        self.max_new_tokens = max_new_tokens  # what was asked for; None when the answer could take any room
        asked = f" and {max_new_tokens} new tokens" if max_new_tokens else ""
        super().__init__(
            f"The prompt ({num_prompt} tokens){asked} does not fit the context of {context_length} tokens. "
            "Shorten the conversation or ask for fewer new tokens."
        )


class NoVisionError(ValueError):
    """The conversation holds images but the model has no vision tower."""
