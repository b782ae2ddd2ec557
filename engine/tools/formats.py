"""Which tool-call syntax a model writes, read from its chat template's source (the markers it renders), not
guessed from the model's name:

    harmony's <|channel|>                 Harmony        gpt-oss
    <|tool_call>call:name{...}            Gemma          Gemma 4
    <|tool_call|> ... <|/tool_call|>      Phi            Phi-4-mini
    <tool_call> ... </tool_call>          Hermes         Qwen2.5, Qwen3, Hermes 2/3, SmolLM3
    [TOOL_CALLS] with [ARGS]              MistralArgs    Mistral Small 3.2, Magistral, Devstral
    [TOOL_CALLS]                          Mistral        Mistral 7B v0.3, Nemo, Small 3.1
    <|python_tag|>, or Llama 3 headers    Llama3         Llama 3.1 to 3.3
    and with "parameters" in the text

A template with none of them gets the Hermes syntax, written by engine.tools.messages (tool definitions in a
system message, calls and results as text): small instruct models follow it well enough, and the grammar makes
whatever they write parse. A template that names a syntax but never reads `tools` (Phi-4-mini's own) is treated
the same way, with its syntax.
"""

from __future__ import annotations

import re
from typing import Any

from engine.harmony import is_harmony
from engine.tools.family import ToolFamily
from engine.tools.gemma import Gemma
from engine.tools.harmony_calls import Harmony
from engine.tools.hermes import Hermes, Phi
from engine.tools.llama3 import PYTHON_TAG, Llama3
from engine.tools.mistral import ARGS, TOOL_CALLS, Mistral, MistralArgs

# The template variable itself, not a message's key (Phi-4-mini's own template reads message['tools']).
_READS_TOOLS = re.compile(r"(?<![\w.'\"])tools\b")
_READS_XML_TOOLS = re.compile(r"(?<![\w.'\"])xml_tools\b")  # SmolLM3's name for the list


def tool_format(template_source: str | None, vocabulary: Any = ()) -> ToolFamily:
    """The tool-call syntax of a model with this chat template (and vocabulary: token strings, for harmony's
    markers); the generic Hermes syntax when the template has none."""
    source = template_source or ""
    family: type[ToolFamily]
    if is_harmony(source, vocabulary):
        family = Harmony
    elif "<|tool_call>" in source and "call:" in source:
        family = Gemma
    elif "<|tool_call|>" in source:
        family = Phi
    elif "<tool_call>" in source:
        family = Hermes
    elif TOOL_CALLS in source:
        family = MistralArgs if ARGS in source else Mistral
    elif PYTHON_TAG in source or ("<|start_header_id|>" in source and '"parameters"' in source):
        family = Llama3
    else:
        return Hermes(native=False)
    if _READS_XML_TOOLS.search(source) and not _READS_TOOLS.search(source):
        return family(variable="xml_tools")
    return family(native=bool(_READS_TOOLS.search(source)))


def tool_format_of(template: Any, tokenizer: Any = None) -> ToolFamily:
    """tool_format from a ChatTemplate (its `source`, None: ChatML without tools) and a Tokenizer (its added
    tokens)."""
    added = getattr(getattr(tokenizer, "backend", None), "get_added_tokens_decoder", None)
    pieces = [t.content for t in added().values()] if callable(added) else []
    has_own = getattr(template, "has_own_template", True)
    return tool_format(getattr(template, "source", None) if has_own else None, pieces)
