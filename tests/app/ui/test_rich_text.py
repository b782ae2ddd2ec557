"""Text as written: single line breaks kept, and Markdown's tables, nested lists, code and links still render.

Rendered through a real QTextDocument (what the message view shows) and read back as structure: lines,
tables, list levels, fonts and anchors. Bad inputs tried: a pipe-less table (its header row must not get a
line break), a line ending in a backslash (Markdown's own break, not doubled), a quote holding a poem.
"""

from __future__ import annotations

from PySide6.QtGui import QTextDocument

from app.ui.rich_text import block_html, keep_line_breaks, markdown_blocks, markdown_to_html

POEM = "Roses are red,\nviolets are blue,\nsugar is sweet."


def rendered(markdown: str) -> QTextDocument:
    doc = QTextDocument()
    doc.setHtml(markdown_to_html(markdown))
    return doc


def lines(doc: QTextDocument) -> list[str]:
    # A kept line break is U+2028 inside one paragraph; toPlainText shows it as a newline. Stripped: Qt's
    # own Markdown reader leaves the joining space at the start of the next line, its HTML reader does not.
    return [line.strip() for line in doc.toPlainText().split("\n") if line.strip()]


def test_a_poem_keeps_its_lines_in_one_paragraph():
    doc = rendered(POEM)
    assert lines(doc) == ["Roses are red,", "violets are blue,", "sugar is sweet."]
    assert doc.blockCount() == 1  # one paragraph with line breaks, not three paragraphs' spacing
    assert "<br />violets" in markdown_to_html(POEM)  # no space left at the start of the next line


def test_line_breaks_inside_lists_and_quotes_but_not_between_blocks():
    assert lines(rendered("- first line\n  second line\n- next item")) == ["first line", "second line", "next item"]
    assert lines(rendered("> one\n> two")) == ["one", "two"]
    assert keep_line_breaks("# Title\ntext") == "# Title\ntext"  # a heading is its own line already
    assert keep_line_breaks("text\n- item") == "text\n- item"  # so is a list item
    assert keep_line_breaks("a | b\n--|--\nc | d") == "a | b\n--|--\nc | d"  # a table stays a table
    assert keep_line_breaks("ends in a backslash\\\nnext") == "ends in a backslash\\\nnext"
    assert keep_line_breaks("Title\n===") == "Title\n==="  # a setext heading stays a heading
    assert lines(rendered("**bold**\n`code`")) == ["bold", "code"]


def test_tables_render_as_tables():
    for table in ("| Name | Size |\n|---|---:|\n| `q4` | 4.5 |\n| q8 | 8.5 |", "Name | Size\n--|--\nq4 | 4.5"):
        doc = rendered(table)
        frames = doc.rootFrame().childFrames()
        assert len(frames) == 1, table
        grid = frames[0]
        assert grid.rows() >= 2 and grid.columns() == 2
        assert grid.cellAt(1, 0).firstCursorPosition().block().text() == "q4"


def test_nested_lists_keep_their_levels():
    doc = rendered("1. one\n   - inner\n     - innermost\n2. two")
    levels = {}
    block = doc.begin()
    while block.isValid():
        if block.textList() is not None:
            levels[block.text().strip()] = block.textList().format().indent()
        block = block.next()
    assert levels == {"one": 1, "inner": 2, "innermost": 3, "two": 1}


def test_inline_code_is_monospace_and_links_are_anchors():
    doc = rendered("Call `generate()` or read [the docs](https://example.org/docs).")
    found = doc.find("generate()")
    assert found.charFormat().fontFixedPitch() or "monospace" in found.charFormat().fontFamilies()
    link = doc.find("the docs")
    assert link.charFormat().isAnchor() and link.charFormat().anchorHref() == "https://example.org/docs"
    assert doc.find("https://example.org/docs").isNull()  # shown as its text, the address stays behind it


def test_blocks_render_alone_as_they_do_together():
    text = f"# Heading\n\n{POEM}\n\n- a\n\n- b\n\n| x | y |\n|---|---|\n| 1 | 2 |\n\n```python\nx = 1\n```\nAfter."
    blocks = markdown_blocks(text)
    assert [b.kind for b in blocks] == ["prose", "prose", "prose", "code", "prose"]
    assert blocks[1].text.endswith("sugar is sweet.\n\n- a\n\n- b")  # not cut before a list item
    prose = text.split("```")[0]
    whole = QTextDocument()
    whole.setMarkdown(keep_line_breaks(prose))  # the prose read in one piece, as Markdown means it
    assert lines(rendered(prose)) == lines(whole)
    assert lines(whole)[:3] == ["Heading", "Roses are red,", "violets are blue,"]
    # the cache answers for settled blocks while the last one grows
    markdown_to_html(text)
    before = block_html.cache_info()
    markdown_to_html(text + " More")
    after = block_html.cache_info()
    assert after.hits - before.hits == 4 and after.misses - before.misses == 1
