"""Markdown to Qt rich text: prose through Qt's own Markdown reader, fenced code blocks through pygments.

    text  --split_fences-->  [prose, code(lang), prose, ...]
    prose --QTextDocument.setMarkdown (raw HTML shown as text)--> body HTML
    code  --pygments (inline styles)--> a shaded table cell, preceded by a "Copy code" link `copy-code:<n>`

An unclosed fence (an answer still streaming) counts as code up to the end of the text.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from functools import lru_cache

from PySide6.QtGui import QTextDocument

COPY_CODE_SCHEME = "copy-code"

# A fence opens with 3+ backticks or tildes (up to 3 spaces of indent) and closes with the same character,
# at least as many times, alone on its line (CommonMark).
_FENCE_OPEN = re.compile(r"^ {0,3}(`{3,}|~{3,})[ \t]*([^\s`]*)[^\n]*$")
_BODY = re.compile(r"<body[^>]*>(.*)</body>", re.S)
_MARKDOWN_FEATURES = QTextDocument.MarkdownFeature(
    QTextDocument.MarkdownFeature.MarkdownDialectGitHub.value | QTextDocument.MarkdownFeature.MarkdownNoHTML.value
)


@dataclass(frozen=True)
class Segment:
    """A run of the message: prose (Markdown) or one fenced code block."""

    kind: str  # "prose" or "code"
    text: str
    language: str = ""


def split_fences(text: str) -> list[Segment]:
    """Split Markdown into prose and fenced code blocks, in order."""
    segments: list[Segment] = []
    prose: list[str] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        match = _FENCE_OPEN.match(lines[i])
        if match is None:
            prose.append(lines[i])
            i += 1
            continue
        fence, language = match.group(1), match.group(2)
        close = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            j += 1
        if prose:
            segments.append(Segment("prose", "\n".join(prose)))
            prose = []
        segments.append(Segment("code", "\n".join(lines[i + 1 : j]), language.lower()))
        i = j + 1
    if prose:
        segments.append(Segment("prose", "\n".join(prose)))
    return [s for s in segments if s.kind == "code" or s.text.strip()]


def code_blocks(text: str) -> list[str]:
    """The fenced code blocks of `text`, in order (what the `copy-code:<n>` links copy)."""
    return [s.text for s in split_fences(text) if s.kind == "code"]


def markdown_to_html(text: str, *, dark: bool = False) -> str:
    """Rich text for a QTextBrowser: Markdown prose plus highlighted code blocks with copy links."""
    parts: list[str] = []
    num_code = 0
    for segment in split_fences(text):
        if segment.kind == "prose":
            parts.append(_prose_html(segment.text))
        else:
            parts.append(_code_html(segment.text, segment.language, num_code, dark))
            num_code += 1
    return "".join(parts)


def _prose_html(text: str) -> str:
    doc = QTextDocument()
    doc.setMarkdown(text, _MARKDOWN_FEATURES)
    match = _BODY.search(doc.toHtml())
    return match.group(1) if match else html.escape(text)


def _code_html(code: str, language: str, index: int, dark: bool) -> str:
    background, link = ("#272822", "#8ab4f8") if dark else ("#f4f5f7", "#1a5fb4")
    label = html.escape(language) if language else "code"
    header = (
        f'<table width="100%" cellspacing="0" cellpadding="0"><tr><td><small>{label}</small></td>'
        f'<td align="right"><a href="{COPY_CODE_SCHEME}:{index}" style="color:{link}">'
        f"<small>Copy code</small></a></td></tr></table>"
    )
    body = _highlight(code, language, dark)
    return (
        f'{header}<table width="100%" cellspacing="0" cellpadding="8" bgcolor="{background}">'
        f'<tr><td><pre style="font-family: monospace">{body}</pre></td></tr></table>'
    )


def _highlight(code: str, language: str, dark: bool) -> str:
    lexer = _lexer(language)
    if lexer is None:
        return html.escape(code)
    from pygments import highlight

    return highlight(code, lexer, _formatter(dark)).rstrip("\n")


@lru_cache(maxsize=64)
def _lexer(language: str):
    """A pygments lexer for a fence's language tag, or None (unknown tag, or no tag: shown plain)."""
    if not language:
        return None
    from pygments.lexers import get_lexer_by_name
    from pygments.util import ClassNotFound

    try:
        return get_lexer_by_name(language, stripnl=False, ensurenl=False)
    except ClassNotFound:
        return None


@lru_cache(maxsize=2)
def _formatter(dark: bool):
    from pygments.formatters import HtmlFormatter

    # Inline styles because Qt's rich text has no stylesheet classes; nowrap: we supply our own <pre>.
    return HtmlFormatter(noclasses=True, nowrap=True, style="monokai" if dark else "default")
