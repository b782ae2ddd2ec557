"""Markdown rendering with highlighted code blocks, copy actions, and the stats line.

Bad inputs tried: an unclosed fence (an answer still streaming), an unknown fence language, raw HTML in
the answer (shown as text, not rendered), a fence with more backticks closed by fewer (not closed).
"""

from __future__ import annotations

from PySide6.QtCore import QObject, Qt, QUrl, Slot
from PySide6.QtGui import QDesktopServices, QGuiApplication
from PySide6.QtWidgets import QApplication, QTabWidget, QWidget
from shiboken6 import delete

from app.ui.message_view import RENDER_INTERVAL_MS, MessageWidget, format_stats
from app.ui.rich_text import code_blocks, markdown_to_html, split_fences

ANSWER = """Here is **the** function:

```python
def add(a, b):
    return a + b
```

And a shell line:

~~~bash
echo hi
~~~
"""


def test_split_fences():
    segments = split_fences(ANSWER)
    assert [(s.kind, s.language) for s in segments] == [
        ("prose", ""),
        ("code", "python"),
        ("prose", ""),
        ("code", "bash"),
    ]
    assert segments[1].text == "def add(a, b):\n    return a + b"
    assert code_blocks("text\n```\nstill streaming") == ["still streaming"]  # unclosed: code to the end
    assert code_blocks("````\na\n```\nb\n````") == ["a\n```\nb"]  # a shorter fence does not close it


def test_html_highlights_code_and_escapes_raw_html():
    html = markdown_to_html(ANSWER)
    assert "copy-code:0" in html and "copy-code:1" in html
    assert "font-weight:" in html or "font-weight: bold" in html  # **the** and keyword styling
    assert '<span style="color: #008000; font-weight: bold">def</span>' in html  # pygments' keyword colour
    raw = markdown_to_html("<b>not bold</b> <img src='file:///etc/passwd'>")
    assert "&lt;b&gt;" in raw and "<img" not in raw
    unknown = markdown_to_html("```klingon\nqapla'\n```")
    assert "qapla" in unknown and "copy-code:0" in unknown


def test_message_widget_renders_and_copies(qtbot):
    widget = MessageWidget(1, "assistant", ANSWER, stats={"new_tokens": 5, "stopped": True})
    qtbot.addWidget(widget)
    widget.resize(600, 400)
    widget.show()
    assert "def add" in widget.body.toPlainText() and "**" not in widget.body.toPlainText()
    assert widget.body.height() > 40  # sized to its text, not a scrolling box
    widget.body.anchorClicked.emit(QUrl("copy-code:0"))
    assert QGuiApplication.clipboard().text() == "def add(a, b):\n    return a + b"
    widget.body.anchorClicked.emit(QUrl("copy-code:1"))
    assert QGuiApplication.clipboard().text() == "echo hi"
    widget.copy_button.click()
    assert QGuiApplication.clipboard().text() == ANSWER
    assert widget.stats_label.text() == "5 tokens · stopped"


def test_user_text_is_shown_as_typed(qtbot):
    widget = MessageWidget(2, "user", "**not bold** <i>x</i>")
    qtbot.addWidget(widget)
    assert widget.body.toPlainText() == "**not bold** <i>x</i>"
    assert widget.edit_button.isVisibleTo(widget) and not widget.regenerate_button.isVisibleTo(widget)


def test_making_a_message_does_not_steal_the_active_window(qtbot):
    # regression: a button shown before it had a parent opened as its own window and took activation
    owner = QWidget()
    qtbot.addWidget(owner)
    owner.show()
    owner.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is owner, timeout=2000)
    widget = MessageWidget(4, "user", "hello")
    qtbot.addWidget(widget)
    qtbot.wait(20)
    assert QApplication.activeWindow() is owner
    assert not [w for w in QApplication.topLevelWidgets() if w.isVisible() and w is not owner]


def test_streaming_render_is_coalesced(qtbot):
    widget = MessageWidget(3, "assistant", "")
    qtbot.addWidget(widget)
    widget.set_streaming(True)
    widget.set_text("Hello")
    widget.set_text("Hello **world**")
    assert widget.text == "Hello **world**"
    qtbot.waitUntil(lambda: "world" in widget.body.toPlainText(), timeout=2000)
    assert "**" not in widget.body.toPlainText()
    assert not widget.copy_button.isEnabled()
    widget.set_streaming(False)
    assert widget.copy_button.isEnabled()


def test_format_stats():
    stats = {
        "new_tokens": 24,
        "prompt_tokens": 30,
        "cached_tokens": 16,
        "tokens_per_second": 123.456,
        "time_to_first_token": 0.0421,
    }
    assert format_stats(stats) == "24 tokens · 123.5 tok/s · first token 42 ms · 16 of 30 prompt tokens cached"
    assert format_stats({}) == ""
    assert format_stats({"new_tokens": 3, "stopped": False, "error": "boom"}) == "3 tokens · failed: boom"


def test_format_stats_reports_drafts_and_json_mode():
    spec = {"new_tokens": 20, "accepted_draft_tokens": 9, "rejected_draft_tokens": 27}
    assert format_stats(spec) == "20 tokens · 25% of drafted tokens accepted"
    assert format_stats({"new_tokens": 5, "accepted_draft_tokens": 0, "rejected_draft_tokens": 0}) == "5 tokens"
    done = {"new_tokens": 9, "json_mode": True, "eos_reason": "end_filter"}
    assert format_stats(done) == "9 tokens · JSON complete"
    cut = {**done, "eos_reason": "max_new_tokens"}
    assert format_stats(cut) == "9 tokens · JSON cut off at the token limit"
    # a plain answer cut by its limit ended mid-sentence with only "9 tokens" as a hint: it says why (Continue)
    assert format_stats({**cut, "json_mode": False}) == "9 tokens · stopped at the answer limit"


class _Browser(QObject):
    """Stands where the system browser would: QDesktopServices hands it the URLs it is asked to open."""

    def __init__(self):
        super().__init__()
        self.opened: list[str] = []

    @Slot(QUrl)
    def open(self, url: QUrl) -> None:
        self.opened.append(url.toString())


def test_a_link_opens_in_the_browser_only_when_clicked(qtbot):
    browser = _Browser()
    QDesktopServices.setUrlHandler("https", browser, "open")
    try:
        widget = MessageWidget(5, "assistant", "Read [the docs](https://example.org/docs) first.")
        qtbot.addWidget(widget)
        widget.resize(500, 200)
        widget.show()
        qtbot.waitExposed(widget)
        widget.set_text(widget.text)  # rendered again, still nothing opens on its own
        qtbot.wait(50)
        assert browser.opened == []
        cursor = widget.body.document().find("the docs")
        where = widget.body.cursorRect(cursor).center()
        qtbot.mouseClick(widget.body.viewport(), Qt.MouseButton.LeftButton, pos=where)
        assert browser.opened == ["https://example.org/docs"]
    finally:
        QDesktopServices.unsetUrlHandler("https")


def test_streaming_and_final_renders_go_through_the_queue(qtbot):
    widgets = [MessageWidget(10 + i, "assistant", "") for i in range(3)]
    for widget in widgets:
        qtbot.addWidget(widget)
        widget.show()
        widget.set_streaming(True)
        widget.set_text(f"answer {widget.message_id}: **bold**")
    qtbot.waitUntil(lambda: all("bold" in w.body.toPlainText() for w in widgets), timeout=2000)
    gone = MessageWidget(20, "assistant", "")
    gone.show()
    gone.set_streaming(True)
    gone.set_text("removed before its render")
    for widget in [gone, *widgets]:
        widget.set_text(widget.text + "\nline two")
        widget.set_streaming(False)  # the final render waits its turn too
    delete(gone)  # removed while it waits in the queue: skipped, not a crash
    assert not any("line two" in w.body.toPlainText() for w in widgets)
    qtbot.waitUntil(lambda: all("line two" in w.body.toPlainText() for w in widgets), timeout=2000)
    assert all(w.body.toPlainText().endswith("bold\nline two") for w in widgets)


def test_a_hidden_message_renders_when_shown(qtbot):
    # a chat in a background tab streams too; its renders wait until it is shown
    tabs = QTabWidget()
    qtbot.addWidget(tabs)
    front, back = MessageWidget(30, "assistant", ""), MessageWidget(31, "assistant", "")
    tabs.addTab(front, "front")
    tabs.addTab(back, "back")
    tabs.show()
    for widget in (front, back):
        widget.set_streaming(True)
        widget.set_text("**streamed** text")
    qtbot.waitUntil(lambda: front.body.toPlainText() == "streamed text", timeout=2000)
    qtbot.wait(3 * RENDER_INTERVAL_MS)
    assert back.body.toPlainText() != "streamed text" and back.text == "**streamed** text"
    back.set_streaming(False)
    qtbot.wait(50)
    assert back.body.toPlainText() != "streamed text"
    tabs.setCurrentWidget(back)
    assert back.body.toPlainText() == "streamed text"


def test_an_answer_waiting_for_a_long_prompt_says_how_much_is_read(qtbot):
    widget = MessageWidget(9, "assistant", "")
    qtbot.addWidget(widget)
    widget.set_streaming(True)
    assert "…" in widget.body.toPlainText()
    widget.set_prefill(1200, 7300)
    assert widget.body.toPlainText() == "Reading the conversation: 1,200 / 7,300 tokens"
    widget.set_text("Hello")
    widget.set_streaming(False)
    qtbot.waitUntil(lambda: widget.body.toPlainText() == "Hello")  # the last render takes its turn
    assert widget.progress_text == ""
