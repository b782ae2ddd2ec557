"""Chat -> Export as Markdown through the window's own dialog: the images go into a folder beside the .md and
stay linked wherever the two are copied; the answers' statistics only when the dialog's box is ticked.

Bad inputs tried: an export folder moved away after writing (as when shared), the box left as it was last time.
"""

from __future__ import annotations

import io
import shutil

from PIL import Image
from PySide6.QtCore import QUrl
from PySide6.QtGui import QImage, QPixmap, QTextDocument
from PySide6.QtWidgets import QCheckBox


def _png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (6, 4), (0, 160, 0)).save(out, "PNG")
    return out.getvalue()


def _export(window, chat_id, path, tick: bool | None = None) -> bool:
    """Export through the dialog as a user does; returns whether the statistics box was ticked on opening."""
    dialog = window.ask_export_chat(chat_id, "markdown")
    (box,) = dialog.findChildren(QCheckBox)
    was_ticked = box.isChecked()
    if tick is not None:
        box.setChecked(tick)
    dialog.selectFile(str(path))
    dialog.accept()
    return was_ticked


def test_an_export_opened_from_another_folder_still_shows_its_image(window, app_store, tmp_path):
    chat = app_store.create_chat("Green things")
    sha = app_store.add_attachment(_png(), "png")
    app_store.add_message(chat.id, "user", "What colour is this?", images=[sha])
    app_store.add_message(chat.id, "assistant", "Green.", stats={"new_tokens": 2, "eos_reason": "stop_token"})
    written = tmp_path / "written"
    written.mkdir()

    assert not _export(window, chat.id, written / "green.md")  # unticked by default
    text = (written / "green.md").read_text(encoding="utf-8")
    assert "Green." in text and "new_tokens" not in text and "file:" not in text

    moved = tmp_path / "someone else" / "inbox"
    shutil.copytree(written, moved)
    shutil.rmtree(written)
    document = QTextDocument()
    document.setBaseUrl(QUrl.fromLocalFile(str(moved) + "/"))
    document.setMarkdown((moved / "green.md").read_text(encoding="utf-8"))
    links = [
        fmt.toImageFormat().name()
        for block in _blocks(document)
        for fmt in (f.charFormat() for f in _fragments(block))
        if fmt.isImageFormat()
    ]
    assert len(links) == 1
    loaded = document.resource(QTextDocument.ResourceType.ImageResource, QUrl(links[0]))  # as a viewer reads it
    image = loaded.toImage() if isinstance(loaded, QPixmap) else loaded
    assert isinstance(image, QImage) and image.size().toTuple() == (6, 4) and image.pixelColor(0, 0).green() == 160

    assert not _export(window, chat.id, moved / "with stats.md", tick=True)
    assert "*new_tokens: 2, eos_reason: stop_token*" in (moved / "with stats.md").read_text(encoding="utf-8")
    assert _export(window, chat.id, moved / "again.md")  # the box remembers the last choice


def _blocks(document):
    block = document.begin()
    while block.isValid():
        yield block
        block = block.next()


def _fragments(block):
    it = block.begin()
    while not it.atEnd():
        yield it.fragment()
        it += 1
