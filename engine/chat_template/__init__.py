"""Sandboxed Jinja rendering of Hugging Face and GGUF chat templates.

A chat template is Jinja code shipped with a model, so it is untrusted: it renders in jinja2's
ImmutableSandboxedEnvironment with the globals, filters and settings Hugging Face templates expect, bounded in
time and memory (2 s, 4 MB of output). Whatever goes wrong inside a template surfaces as a `ChatTemplateError`
naming the cause.

    find.py        where a model keeps its template (folder files, GGUF metadata)
    template.py    ChatTemplate: messages -> prompt text; the ChatML fallback
    sandbox.py     the jinja environment a template runs in, every step of its work counted
    limits.py      what one render may cost (time, text built) and the size checks
    methods.py     the methods of plain values a template may call, bounded
    formatting.py  %-format and str.format, bounded
    filters.py     jinja's filters, bounded
"""

from engine.chat_template.find import find_chat_template
from engine.chat_template.limits import MAX_OUTPUT_CHARS, RENDER_SECONDS
from engine.chat_template.template import CHATML_TEMPLATE, ChatTemplate

__all__ = ["CHATML_TEMPLATE", "MAX_OUTPUT_CHARS", "RENDER_SECONDS", "ChatTemplate", "find_chat_template"]
