"""Markdown to Qt rich text: prose through Qt's own Markdown reader, fenced code blocks through pygments.

    text  --markdown_blocks-->  [prose, prose, code(lang), prose, ...]   (split_fences, then blank lines)
    prose --keep_line_breaks, QTextDocument.setMarkdown (raw HTML shown as text)--> body HTML
    code  --pygments (inline styles)--> a shaded table cell, preceded by a "Copy code" link `copy-code:<n>`

An unclosed fence (an answer still streaming) counts as code up to the end of the text. Each block's HTML
is cached by its text, so while an answer streams only its last, growing block is converted again.
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
# Where prose can be cut into blocks that render alone exactly as they do together: after a blank line, before
# an unindented line that is not a list item (so it ends any list, quote, table or indented code before it).
# A line starting with a digit may be an ordered item: not cut there (rendering whole is always right).
_BLOCK_BREAK = re.compile(r"\n(?:[ \t]*\n)+(?=[^\s\-*+\d])")
# A line that begins its own block (list item, heading, quote, table row, fence, rule, setext underline):
# no line break is added before it, Markdown already starts it on a new line.
_BLOCK_START = re.compile(r"^\s*(?:[-*+](?:\s|$)|\d{1,9}[.)](?:\s|$)|#{1,6}(?:\s|$)|>|\||`{3}|~{3}|[-*_=\s]+$)")
_QUOTE = re.compile(r"^ {0,3}>[ ]?")
_LINE_SEPARATOR = "\u2028"  # Qt's own line break inside a paragraph (toHtml writes it as <br />)
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


def markdown_blocks(text: str) -> list[Segment]:
    """`split_fences`, with each prose run cut further at blank lines where Markdown starts afresh.

    Every block renders alone as it does within the whole text, so the HTML of all blocks but the last one
    of a streaming answer stays as it was. Two exceptions render differently cut: a reference-style link
    whose definition is in a later block, and an ordered list whose items are split by a paragraph.
    """
    blocks: list[Segment] = []
    for segment in split_fences(text):
        if segment.kind == "code":
            blocks.append(segment)
        else:
            blocks += [Segment("prose", part) for part in _BLOCK_BREAK.split(segment.text) if part.strip()]
    return blocks


def keep_line_breaks(prose: str) -> str:
    """Mark each single line break inside a paragraph as a line break to keep (Markdown would join the lines).

    A poem, an address or a list of steps written one per line stays that way. Lines that begin their own
    block (items, headings, table rows, quotes...) are left alone, and so is a line ending in a backslash
    (already a Markdown line break). Inside a quote the same rule applies to the text after the `>`.
    """
    lines = prose.split("\n")
    for i in range(len(lines) - 1):
        line, following = lines[i], lines[i + 1]
        while _QUOTE.match(line) and _QUOTE.match(following):  # compare what the quote holds
            line, following = _QUOTE.sub("", line, count=1), _QUOTE.sub("", following, count=1)
        if not line.strip() or not following.strip() or line.endswith("\\"):
            continue
        if "|" in line or "|" in following or _BLOCK_START.match(following):
            continue  # a table (with or without outer pipes) or the start of a new block
        if re.match(r"^\s*#{1,6}(\s|$)|^\s*[-*_]{3,}\s*$", line):
            continue  # a heading or a rule is a block of one line
        lines[i] += _LINE_SEPARATOR
    return "\n".join(lines)


def markdown_to_html(text: str, *, dark: bool = False) -> str:
    """Rich text for a QTextBrowser: Markdown prose plus highlighted code blocks with copy links."""
    parts: list[str] = []
    num_code = 0
    for block in markdown_blocks(text):
        parts.append(block_html(block, num_code if block.kind == "code" else 0, dark))
        num_code += block.kind == "code"
    return "".join(parts)


@lru_cache(maxsize=1024)
def block_html(block: Segment, code_index: int = 0, dark: bool = False) -> str:
    """One block's HTML (cached: a streaming answer asks for the same settled blocks again and again).

    `code_index` numbers a code block's "Copy code" link; it is ignored for prose.
    """
    if block.kind == "code":
        return _code_html(block.text, block.language, code_index, dark)
    return _prose_html(block.text)


def _prose_html(text: str) -> str:
    doc = QTextDocument()
    doc.setMarkdown(keep_line_breaks(text), _MARKDOWN_FEATURES)
    match = _BODY.search(doc.toHtml())
    if match is None:
        return html.escape(text)
    # Qt writes the joining space after a kept line break; the next line starts without it.
    return match.group(1).replace("<br /> ", "<br />")


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


# Fence tags answers use most; their lexers are made ahead by warm_up.
_COMMON_LANGUAGES = ("python", "bash", "javascript", "typescript", "json", "c", "cpp", "rust", "go", "java", "sql")


def warm_up() -> None:
    """Import pygments and make the formatters and the common lexers now, for example on a worker thread.

    The first code block otherwise pays for them on the GUI thread while its answer streams (a visible
    stutter). Safe to call more than once and from any thread: the results are only cached.
    """
    for dark in (False, True):
        _formatter(dark)
    for language in _COMMON_LANGUAGES:
        _lexer(language)


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
