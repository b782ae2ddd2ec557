"""Describing images in a chat tab on the real engine: a dropped picture goes into the prompt of a vision
model, the next turn reuses the image's cached pages, and bad images give a notice while the app goes on.

The plumbing runs on the tiny random LLaVA (always); the same flow on the bundled demo vision model checks
the answer names what the picture shows (skipped until assets/demo-vision exists).
Bad inputs tried: a truncated PNG dropped on the chat, a stored attachment whose file was overwritten
with garbage, and then deleted, before the next send.
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
import sys
from pathlib import Path

import pytest
import torch
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent

from app.service import EngineService
from app.service.catalog import demo_vision_path
from app.ui import model_list, model_manager
from engine.vision.prompt import user_message

ROOT = Path(__file__).resolve().parents[3]
DESCRIBE = "Describe this image."
COUNT = "How many shapes are there?"


def load_shapes():
    """tools/demo_vision/shapes.py (a development tool, not a package), loaded by path once."""
    if "demo_vision_shapes" not in sys.modules:
        spec = importlib.util.spec_from_file_location("demo_vision_shapes", ROOT / "tools/demo_vision/shapes.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
        spec.loader.exec_module(module)
    return sys.modules["demo_vision_shapes"]


def shapes_png(folder: Path, name: str, objects: list[tuple[str, str]], seed: int = 0) -> Path:
    path = folder / name
    load_shapes().render_objects(objects, seed=seed).save(path, "PNG")
    return path


def vision_service(qloop, path: Path, name: str) -> EngineService:
    # Pages of 16 tokens: the tiny prompts fill whole pages, so the second turn's reuse is visible.
    service = EngineService(dtype=torch.float32, page_size=16, max_cache_tokens=4096)

    async def load():
        service.load_model(path, name)
        return await service.wait_loaded()

    assert qloop.run_until_complete(load())
    return service


@pytest.fixture(scope="module")
def tiny_vision(qloop, tiny_llava_folder):
    service = vision_service(qloop, tiny_llava_folder, "tiny-llava")
    yield service
    qloop.run_until_complete(service.close())


@pytest.fixture(scope="module")
def demo_vision(qloop):
    if not (demo_vision_path() / "config.json").is_file():
        pytest.skip(f"the demo vision model is not trained yet ({demo_vision_path()} has no config.json)")
    service = vision_service(qloop, demo_vision_path(), "Demo vision model")
    yield service
    qloop.run_until_complete(service.close())


@pytest.fixture
def open_window(app_store, run, ui):
    windows = []

    def open_(service):
        windows.append(ui.open_window(app_store, service))
        return windows[-1]

    yield open_
    for win in windows:
        run(ui.close_window(win))


def drop(tab, paths: list[Path]) -> QMimeData:
    """What dropping files from a file manager onto the chat does; returns the mime data (keep it alive)."""
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    buttons, keys = Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier
    tab.dropEvent(QDropEvent(QPointF(10, 10), Qt.DropAction.CopyAction, mime, buttons, keys))
    return mime


def image_end(run, service, sha_path: Path, question: str) -> int:
    """Tokens of the first turn's prompt up to the end of its image: what a second turn must find cached."""
    (embedding,) = run(service.embed_images([sha_path]))  # from the service's cache: no new encode
    prompt = service.encode_chat([user_message(question, 1)], images=[embedding])[0].tolist()
    return prompt.index(embedding.last_id) + 1


async def describe_then_count(tab, window, ui, images: list[Path]) -> None:
    """Drop `images`, ask for a description, then ask a follow-up without attaching anything."""
    mime = drop(tab, images)
    await ui.wait_for(lambda: len(tab.strip.attachments()) == len(images), what="the dropped images")
    del mime
    tab.input.setPlainText(DESCRIBE)
    assert tab.send()
    assert tab.is_streaming and not tab.send_button.isEnabled()  # embedding counts as answering
    await ui.wait_idle(window)
    assert tab.notice_text() == ""
    tab.input.setPlainText(COUNT)
    assert tab.send()
    await ui.wait_idle(window)
    assert tab.notice_text() == ""


def check_turns(run, store, service, chat_id: int, num_images: int) -> tuple[list, int | None]:
    messages = store.messages(chat_id)
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant"]
    first, answer, second, follow_up = messages
    assert first.text == DESCRIBE and len(first.images) == num_images and second.images == []
    assert answer.complete and follow_up.complete
    # The first prompt held every image's tokens; the second turn found the image's pages in the cache.
    per_image = service.model.tokens_per_image
    assert answer.stats["prompt_tokens"] > num_images * per_image
    assert follow_up.stats["prompt_tokens"] > answer.stats["prompt_tokens"]
    assert service.num_cached_images == len(set(first.images))  # the second turn encoded nothing new
    end = image_end(run, service, store.attachment_path(first.images[-1]), DESCRIBE) if num_images == 1 else None
    return messages, end


def test_describe_with_the_tiny_vision_model(open_window, tiny_vision, app_store, run, ui, tmp_path):
    window = open_window(tiny_vision)
    tab = window.current_tab()
    tab.set_settings(ui.greedy_settings(tiny_vision, 6))
    # Several images in one message: two shape pictures.
    pictures = [
        shapes_png(tmp_path, "shapes.png", [("red", "circle"), ("blue", "square")]),
        shapes_png(tmp_path, "star.png", [("green", "star")], seed=1),
    ]
    run(describe_then_count(tab, window, ui, pictures))
    messages, _ = check_turns(run, app_store, tiny_vision, tab.chat_id, num_images=2)
    first_prompt = tiny_vision.count_tokens([user_message(DESCRIBE, 2)])
    assert messages[1].stats["prompt_tokens"] == first_prompt
    assert messages[3].stats["cached_tokens"] >= first_prompt - 1  # the whole first prompt but its last token
    stats_line = tab.message_widgets()[-1].stats_label.text()
    assert f"{messages[3].stats['cached_tokens']} of {messages[3].stats['prompt_tokens']}" in stats_line
    # Sending the same chat again (regenerate) reuses the stored embeddings.

    async def again():
        assert tab.regenerate()
        await ui.wait_idle(window)

    run(again())
    assert tiny_vision.num_cached_images == 2 and app_store.messages(tab.chat_id)[-1].complete


def test_demo_model_describes_a_red_circle_and_a_blue_square(open_window, demo_vision, app_store, run, ui, tmp_path):
    window = open_window(demo_vision)
    tab = window.current_tab()
    tab.set_settings(ui.greedy_settings(demo_vision, 32, allow_eos=True))
    picture = shapes_png(tmp_path, "shapes.png", [("red", "circle"), ("blue", "square")])
    run(describe_then_count(tab, window, ui, [picture]))
    messages, end = check_turns(run, app_store, demo_vision, tab.chat_id, num_images=1)
    answer = messages[1].text.lower()
    assert "red circle" in answer and "blue square" in answer, messages[1].text
    assert messages[3].stats["cached_tokens"] >= end, (messages[3].stats, end)


def test_bad_images_in_a_vision_chat_give_a_notice(open_window, tiny_vision, app_store, run, ui, tmp_path):
    window = open_window(tiny_vision)
    tab = window.current_tab()
    tab.set_settings(ui.greedy_settings(tiny_vision, 4))
    picture = shapes_png(tmp_path, "shapes.png", [("red", "circle"), ("blue", "square")], seed=3)
    half = tmp_path / "half.png"
    half.write_bytes(picture.read_bytes()[:200])

    async def go():
        mime = drop(tab, [half, picture])
        await ui.wait_for(lambda: tab.strip.attachments() and tab.notice_text(), what="the checks")
        del mime
        assert "half.png" in tab.notice_text() and [a.name for a in tab.strip.attachments()] == ["shapes.png"]
        tab.input.setPlainText(DESCRIBE)
        assert tab.send()
        await ui.wait_idle(window)

        # The stored picture is damaged on disk: the next send keeps every message and says what is wrong.
        sha = app_store.messages(tab.chat_id)[0].images[0]
        stored = app_store.attachment_path(sha)
        good = stored.read_bytes()
        stored.write_bytes(b"not a picture any more")
        tab.input.setPlainText(COUNT)
        assert tab.send()
        await ui.wait_for(lambda: not tab.is_streaming and tab.notice_text(), what="the notice")
        assert stored.name in tab.notice_text() and "saved" in tab.notice_text()
        assert [m.role for m in app_store.messages(tab.chat_id)] == ["user", "assistant", "user"]
        assert tab.send_button.isEnabled() and window.isVisible()

        stored.unlink()  # gone altogether: still a notice
        tab.input.setPlainText("Anyone there?")
        assert tab.send()
        await ui.wait_for(lambda: not tab.is_streaming and "cannot read" in tab.notice_text(), what="notice")

        stored.write_bytes(good)  # the file is back: the chat carries on
        tab.input.setPlainText(COUNT)
        assert tab.send()
        await ui.wait_idle(window)

    run(go())
    roles = [m.role for m in app_store.messages(tab.chat_id)]
    assert roles == ["user", "assistant", "user", "user", "user", "assistant"]
    assert app_store.messages(tab.chat_id)[-1].complete and tab.notice_text() == ""


def test_model_manager_lists_the_bundled_demo_second_and_loads_it_offline(
    qtbot, app_store, run, tiny_llava_folder, tmp_path, monkeypatch
):
    # The demo folder as the app finds it; a copy of the tiny LLaVA stands in where it is not trained yet.
    demo = demo_vision_path()
    if not (demo / "config.json").is_file():
        demo = tmp_path / "assets" / "demo-vision"
        shutil.copytree(tiny_llava_folder, demo)
        monkeypatch.setattr(model_manager, "demo_vision_path", lambda: demo)
        monkeypatch.setattr(model_list, "demo_vision_path", lambda: demo)  # the list's own lookup
    # No network: a Hub or package-index fetch would fail at once.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    service = EngineService(dtype=torch.float32)
    try:
        manager = model_manager.ModelManager(app_store, service)
        qtbot.addWidget(manager)
        assert manager.paths()[1] == str(demo)
        assert manager.model_list.item(1).text() == "Demo vision model (bundled, works offline)"
        assert manager.select_path(demo) and not manager.remove_button.isEnabled()  # bundled: cannot be removed

        async def press_load() -> bool:
            manager.load_button.click()
            return await service.wait_loaded()

        assert run(press_load()), manager.error_label.text()
        assert service.model_name == "Demo vision model" and service.can_see_images
        assert manager.model_list.item(1).text().startswith("● ")
        app_store.models.add(str(demo))  # remembered by hand too: still listed once
        manager.refresh()
        assert manager.paths().count(str(demo)) == 1

        # Absent (not trained into this checkout): simply not listed.
        monkeypatch.setattr(model_list, "demo_vision_path", lambda: tmp_path / "nowhere")
        manager.refresh()
        assert len(manager.paths()) == 2 and "Demo vision" not in manager.model_list.item(1).text()
    finally:
        run(service.close())


def test_a_dropped_picture_is_read_and_hashed_once_on_its_way_to_the_model(
    open_window, tiny_vision, app_store, run, ui, tmp_path, monkeypatch
):
    # Checked, stored and embedded, the picture's bytes are read from its file once and hashed once: the
    # check's digest names the stored file and keys the embedding. A later turn reads and hashes the
    # stored file again, which is what notices one damaged on disk (test_bad_images_in_a_vision_chat...).
    window = open_window(tiny_vision)
    tab = window.current_tab()
    tab.set_settings(ui.greedy_settings(tiny_vision, 3))
    picture = shapes_png(tmp_path, "once.png", [("yellow", "triangle"), ("green", "circle")], seed=7)
    data = picture.read_bytes()
    hashed, read = [], []
    real_sha256, real_read_bytes = hashlib.sha256, Path.read_bytes

    def sha256(*args, **kwargs):
        if args and bytes(args[0]) == data:
            hashed.append(1)
        return real_sha256(*args, **kwargs)

    def read_bytes(path):
        out = real_read_bytes(path)
        if out == data:
            read.append(path.name)
        return out

    monkeypatch.setattr(hashlib, "sha256", sha256)
    monkeypatch.setattr(Path, "read_bytes", read_bytes)

    async def go():
        mime = drop(tab, [picture])
        await ui.wait_for(lambda: tab.strip.attachments(), what="the dropped picture")
        del mime
        tab.input.setPlainText(DESCRIBE)
        assert tab.send()
        await ui.wait_idle(window)
        assert tab.notice_text() == "" and app_store.messages(tab.chat_id)[-1].complete
        first = (len(hashed), list(read))
        tab.input.setPlainText(COUNT)
        assert tab.send()
        await ui.wait_idle(window)
        return first

    (hashes, reads) = run(go())
    assert (hashes, reads) == (1, ["once.png"])
    stored = app_store.attachment_path(app_store.messages(tab.chat_id)[0].images[0]).name
    assert (len(hashed), read) == (2, ["once.png", stored])  # the next turn checks the stored file
