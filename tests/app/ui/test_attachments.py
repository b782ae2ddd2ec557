"""Image attachments: Pillow checks, the thumbnail strip, paste/drop/pick, refusal for a text-only model.

Bad inputs tried: a text file named .png, a PNG cut in half, a JPEG cut in half, an empty file, a PNG whose
header claims 20000x20000 pixels, an 8000x8100 image (over the engine's 64 MP limit, real pixels), a TIFF (a real
image of a format we do not attach), a file that does not exist, an empty clipboard image.
"""

from __future__ import annotations

import io
import struct
import zlib

import pytest
from PIL import Image
from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QUrl
from PySide6.QtGui import QColor, QDragEnterEvent, QDropEvent, QImage

from app.service.image_files import AttachmentError, check_image_bytes, load_image_file
from engine.errors import ImageError
from engine.vision.image import decode_image


def png_bytes(width=64, height=48, color=(200, 30, 30)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, "PNG")
    return out.getvalue()


def noisy(fmt: str) -> bytes:
    out = io.BytesIO()
    Image.effect_noise((256, 256), 60).convert("RGB").save(out, fmt)
    return out.getvalue()


def huge_png_header(width=20000, height=20000) -> bytes:
    """A PNG claiming width x height pixels: a few hundred bytes, so the test never allocates the image."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")
    )


@pytest.fixture
def bad_files(tmp_path):
    files = {
        "notes.png": b"this is text, not a picture\n",
        "half.png": noisy("PNG")[: len(noisy("PNG")) // 2],
        "half.jpg": noisy("JPEG")[: len(noisy("JPEG")) // 2],
        "empty.png": b"",
        "huge.png": huge_png_header(),
    }
    paths = {}
    for name, data in files.items():
        paths[name] = tmp_path / name
        paths[name].write_bytes(data)
    return paths


def test_good_images_pass_with_a_thumbnail():
    for fmt, suffix in (("PNG", "png"), ("JPEG", "jpg"), ("WEBP", "webp"), ("GIF", "gif"), ("BMP", "bmp")):
        attachment = check_image_bytes(noisy(fmt), f"ok.{suffix}")
        assert (attachment.suffix, attachment.width, attachment.height) == (suffix, 256, 256)
        with Image.open(io.BytesIO(attachment.thumbnail_png)) as thumb:
            assert max(thumb.size) <= 192


def test_bad_files_raise_clear_errors(bad_files, tmp_path):
    expected = {
        "notes.png": "not an image",
        "half.png": "corrupt or truncated",
        "half.jpg": "corrupt or truncated",
        "empty.png": "not an image",
        "huge.png": "too large",
    }
    for name, words in expected.items():
        with pytest.raises(AttachmentError, match=words) as info:
            load_image_file(bad_files[name])
        assert name in str(info.value)
    with pytest.raises(AttachmentError, match="Cannot read"):
        load_image_file(tmp_path / "nowhere.png")
    big = io.BytesIO()
    # 64.8 MP of real pixels, a small file. The app's own check refused 42 MP; the one limit is the engine's 64 MP.
    Image.new("1", (8000, 8100)).save(big, "PNG")
    with pytest.raises(AttachmentError, match=r"big.png is too large.*8000x8100 \(64800000 pixels\)"):
        check_image_bytes(big.getvalue(), "big.png")
    tiff = io.BytesIO()
    Image.new("RGB", (8, 8)).save(tiff, "TIFF")
    with pytest.raises(AttachmentError, match="TIFF image"):
        check_image_bytes(tiff.getvalue(), "scan.tiff")


def test_the_attachment_check_is_the_engines():
    # One limit and one wording: a picture the engine refuses, the window refuses with the engine's words.
    for width, height in ((8193, 10), (8000, 8001)):
        data = huge_png_header(width, height)
        with pytest.raises(ImageError) as engine_says:
            decode_image(data, name="wide.png")
        with pytest.raises(AttachmentError) as app_says:
            check_image_bytes(data, "wide.png")
        assert "too large" in str(app_says.value) and str(app_says.value) == str(engine_says.value)
    # At the limit the declared size passes (and decoding finds the header's missing pixels).
    with pytest.raises(AttachmentError, match="edge.png is corrupt or truncated"):
        check_image_bytes(huge_png_header(8000, 8000), "edge.png")


def test_bad_attachments_show_a_message_and_the_app_keeps_working(
    window, engine_service, app_store, run, ui, bad_files
):
    tab = window.current_tab()
    tab.set_settings(ui.greedy_settings(engine_service, 4))

    async def go():
        await tab.attach_files([str(p) for p in bad_files.values()])
        notice = tab.notice_text()
        for name in bad_files:
            assert name in notice
        assert tab.notice.isVisible()
        assert tab.strip.attachments() == []
        tab.input.setPlainText("Still working?")
        assert tab.send()
        await ui.wait_idle(window)

    run(go())
    assert [m.role for m in app_store.messages(tab.chat_id)] == ["user", "assistant"]
    assert tab.notice_text() == ""  # a successful send clears the old message


def test_thumbnails_remove_and_refusal_for_a_text_only_model(window, engine_service, app_store, run, ui, tmp_path):
    tab = window.current_tab()
    for i, color in enumerate(((255, 0, 0), (0, 0, 255))):
        (tmp_path / f"img{i}.png").write_bytes(png_bytes(color=color))

    async def go():
        await tab.attach_files([str(tmp_path / "img0.png"), str(tmp_path / "img1.png")])
        assert [a.name for a in tab.strip.attachments()] == ["img0.png", "img1.png"]
        assert tab.strip.isVisible()
        tab.strip._items[0][1].remove_button.click()  # the ✕ on the first thumbnail
        assert [a.name for a in tab.strip.attachments()] == ["img1.png"]
        await tab.attach_files([str(tmp_path / "img0.png")])

        tab.input.setPlainText("What is in these pictures?")
        assert not engine_service.can_see_images
        assert not tab.send()
        notice = tab.notice_text()
        assert "cannot see images" in notice and "tiny" in notice and "demo vision model" in notice
        assert "issue [D]" not in notice
        assert app_store.messages(tab.chat_id) == []  # nothing was sent or stored
        assert tab.input.toPlainText() == "What is in these pictures?" and len(tab.strip.attachments()) == 2

        tab.strip.remove_at(0)
        tab.strip.remove_at(0)
        assert not tab.strip.isVisible()
        tab.set_settings(ui.greedy_settings(engine_service, 4))
        assert tab.send()  # the text alone goes through
        await ui.wait_idle(window)

    run(go())
    assert [m.images for m in app_store.messages(tab.chat_id)] == [[], []]


def test_paste_and_drop_become_attachments(window, run, ui, tmp_path):
    tab = window.current_tab()
    (tmp_path / "dropped.png").write_bytes(png_bytes())

    async def go():
        image = QImage(40, 30, QImage.Format.Format_RGB32)
        image.fill(QColor("green"))
        pasted = QMimeData()
        pasted.setImageData(image)
        assert tab.input.canInsertFromMimeData(pasted)
        tab.input.insertFromMimeData(pasted)  # what Ctrl+V does
        dropped = QMimeData()
        dropped.setUrls([QUrl.fromLocalFile(str(tmp_path / "dropped.png"))])
        tab.input.insertFromMimeData(dropped)  # what a drop onto the input does
        text = QMimeData()
        text.setText("plain words")
        tab.input.insertFromMimeData(text)
        await ui.wait_for(lambda: len(tab.strip.attachments()) == 2, what="two attachments")
        await tab.attach_image(QImage())  # an empty clipboard image

    run(go())
    names = sorted(a.name for a in tab.strip.attachments())
    assert names == ["dropped.png", "pasted image"]
    pasted = next(a for a in tab.strip.attachments() if a.name == "pasted image")
    assert (pasted.width, pasted.height, pasted.suffix) == (40, 30, "png")
    assert tab.input.toPlainText() == "plain words"  # text still pastes as text
    assert "clipboard image is empty" in tab.notice_text()


def test_history_shows_thumbnails(window, app_store):
    sha = app_store.add_attachment(png_bytes(), "png")
    chat = app_store.create_chat("With a picture")
    app_store.add_message(chat.id, "user", "Look", images=[sha, sha])
    tab = window.open_chat(chat.id)
    widget = tab.message_widgets()[0]
    assert widget.num_images == 2
    labels = [widget.images.itemAt(i).widget() for i in range(widget.images.count())]
    pixmaps = [label.pixmap() for label in labels if label is not None]
    assert len(pixmaps) == 2 and all(not p.isNull() and p.width() <= 160 for p in pixmaps)


def test_dropping_files_on_the_chat(window, run, ui, tmp_path):
    tab = window.current_tab()
    (tmp_path / "photo.png").write_bytes(png_bytes())
    (tmp_path / "notes.xyz").write_text("not a picture")  # (a .txt is a document: test_documents_chat.py)
    mime = QMimeData()  # kept alive here: the events only point at it
    mime.setUrls([QUrl.fromLocalFile(str(tmp_path / name)) for name in ("photo.png", "notes.xyz")])
    buttons, keys = Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier

    async def go():
        enter = QDragEnterEvent(QPoint(10, 10), Qt.DropAction.CopyAction, mime, buttons, keys)
        tab.dragEnterEvent(enter)
        assert enter.isAccepted()
        tab.dropEvent(QDropEvent(QPointF(10, 10), Qt.DropAction.CopyAction, mime, buttons, keys))
        await ui.wait_for(lambda: tab.strip.attachments() and tab.notice_text(), what="the checks")

    run(go())
    assert [a.name for a in tab.strip.attachments()] == ["photo.png"]
    assert "notes.xyz is not a file Tandem can attach" in tab.notice_text()


def test_a_refusal_clears_once_a_good_image_is_attached(window, run, tmp_path):
    # "not an image" must not stay on screen once the user attaches a good picture instead
    tab = window.current_tab()
    (tmp_path / "notes.png").write_bytes(b"this is text, not a picture\n")
    (tmp_path / "good.png").write_bytes(png_bytes())

    async def go():
        await tab.attach_files([str(tmp_path / "notes.png")])
        assert "notes.png" in tab.notice_text()
        await tab.attach_files([str(tmp_path / "good.png")])

    run(go())
    assert tab.notice_text() == "" and [a.name for a in tab.strip.attachments()] == ["good.png"]
