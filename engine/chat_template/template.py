"""ChatTemplate: a model's chat template, compiled once in the sandbox (sandbox.py), that turns a list of messages
into prompt text; ChatML when the model ships none.

Everything the template sees is rebuilt from plain JSON-like values first (`_plain`), and whatever goes wrong
inside it (syntax, a `raise_exception`, undefined names, a sandbox breach, a limit) surfaces as a
`ChatTemplateError` naming the cause.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from jinja2 import TemplateSyntaxError
from jinja2.exceptions import SecurityError

from engine.chat_template.find import nonblank, pick_template
from engine.chat_template.limits import RENDER_SECONDS, TemplateLimitError, render_limits
from engine.chat_template.sandbox import TemplateRaised, environment
from engine.errors import ChatTemplateError

# Used when a model ships no template: ChatML is what most small instruct models were tuned on.
CHATML_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- set content = message['content'] -%}"
    "{%- if content is string -%}{{ content }}"
    "{%- elif content is iterable and content is not mapping -%}"
    # Only the text parts: image parts need model-specific placeholders, which a ChatML model has none of.
    "{%- for part in content if part is mapping and part['type'] == 'text' -%}{{ part['text'] }}{%- endfor -%}"
    "{%- endif -%}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)

# Names a message's reasoning may arrive under; templates (Qwen3, gpt-oss) read the first two.
_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplate:
    """A model's chat template, compiled once, that turns a list of messages into prompt text.

    `source` is the Jinja text (None: fall back to ChatML). `bos_token`, `eos_token` and any other
    `**special` tokens (unk_token, pad_token, ...) are visible to the template under those names.
    Raises ChatTemplateError when the template has a syntax error. Rendering is bounded: see `render`.
    """

    def __init__(self, source: str | None, bos_token: str | None = None, eos_token: str | None = None, **special: Any):
        self._has_own = nonblank(source) is not None
        self.source: str = source if self._has_own else CHATML_TEMPLATE
        tokens = {"bos_token": bos_token, "eos_token": eos_token, **special}
        # Unset tokens stay undefined (render as ""), as in transformers, rather than rendering "None".
        self.special_tokens: dict[str, Any] = {k: _plain(v) for k, v in tokens.items() if v is not None}
        try:
            self._template = environment().from_string(self.source)
        except TemplateSyntaxError as e:
            raise ChatTemplateError(
                f"The chat template has a syntax error at line {e.lineno}: {e.message}. "
                "Fix the model's chat template or load the model without it."
            ) from e
        except TemplateLimitError as e:
            raise ChatTemplateError(str(e)) from e
        except Exception as e:  # anything else the compiler raises on untrusted text
            raise ChatTemplateError(f"The chat template cannot be compiled ({type(e).__name__}: {e}).") from e

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> ChatTemplate:
        """Build from an object with `chat_template`, `bos_token` and `eos_token` attributes."""
        source = pick_template(getattr(tokenizer, "chat_template", None), type(tokenizer).__name__)
        extra = {}
        for name in ("unk_token", "pad_token"):
            value = getattr(tokenizer, name, None)
            if isinstance(value, str):
                extra[name] = value
        return cls(
            source,
            bos_token=_str_or_none(getattr(tokenizer, "bos_token", None)),
            eos_token=_str_or_none(getattr(tokenizer, "eos_token", None)),
            **extra,
        )

    @property
    def has_own_template(self) -> bool:
        """False when the model had no template and ChatML is used instead."""
        return self._has_own

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        **extra: Any,
    ) -> str:
        """Render `messages` (dicts with "role" and "content") to the prompt text.

        Content is a string or a list of parts ({"type": "text", "text": ...}, {"type": "image"}).
        `tools` are JSON schemas, `documents` dicts; `extra` become template variables (e.g.
        enable_thinking). Tool calls and results come in transformers' shape: an assistant message's
        `tool_calls` ({"id", "type": "function", "function": {"name", "arguments": {...}}}) and `tool`
        messages with `tool_call_id` (engine.tools.messages makes them from OpenAI's). Raises ChatTemplateError
        for any failure inside the template, TypeError when messages, tools or documents are not lists of dicts.

        A render is bounded: past RENDER_SECONDS (2 s) of work, or past MAX_OUTPUT_CHARS (4 MB) of text, or
        when one step would build more than that (a huge format width, `'a' * 10**9`), it stops with a
        ChatTemplateError naming the limit. Normal templates take about a millisecond. The thread that calls
        this is busy until then: an app should render off its GUI thread.
        """
        context = {
            **self.special_tokens,
            **_plain(extra),
            "messages": _prepare_messages(messages),
            "tools": _plain(_dict_list(tools, "tools")),
            "documents": _plain(_dict_list(documents, "documents")),
            "add_generation_prompt": bool(add_generation_prompt),
        }
        try:
            with render_limits(RENDER_SECONDS):
                return self._template.render(context)
        except TemplateRaised as e:
            raise ChatTemplateError(
                f"The chat template rejected the conversation: {e.message} "
                "(the model expects its messages in another order or shape)."
            ) from e
        except TemplateLimitError as e:
            raise ChatTemplateError(str(e)) from e
        except SecurityError as e:
            raise ChatTemplateError(
                f"The chat template did something its sandbox forbids and was stopped ({e}). "
                "Do not trust this model's template; use another model or replace the template."
            ) from e
        except Exception as e:  # TemplateError, UndefinedError, TypeError, RecursionError, ...
            raise ChatTemplateError(
                f"The chat template failed ({type(e).__name__}: {e}). Check that the messages have the "
                "roles and keys this model expects, or replace its template."
            ) from e


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else (None if value is None else str(value))


def _dict_list(items: Sequence[Mapping[str, Any]] | None, what: str) -> list[Mapping[str, Any]] | None:
    if items is None:
        return None
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Sequence):
        raise TypeError(f"{what} should be a list of dicts, got {type(items).__name__}.")
    for item in items:
        if not isinstance(item, Mapping):
            raise TypeError(f"each of the {what} should be a dict, got {type(item).__name__}: {item!r:.80}.")
    return list(items)


def _prepare_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    prepared = []
    for message in _dict_list(messages, "messages") or []:
        # Keys set to None (OpenAI-style content=None) are dropped: templates test for a missing key.
        plain = {k: v for k, v in _plain(message).items() if v is not None}
        reasoning = next((plain[k] for k in _REASONING_KEYS if k in plain), None)
        if reasoning is not None:
            plain = {"thinking": reasoning, **plain, "reasoning_content": reasoning}
        prepared.append(plain)
    return prepared


def _plain(value: Any) -> Any:
    """A copy of `value` made only of JSON-like types, so the template can neither mutate the caller's
    data nor call methods of rich objects (images, paths, tensors), which become "<TypeName>" text."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return f"<{type(value).__name__}>"
