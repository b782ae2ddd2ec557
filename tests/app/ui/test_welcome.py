"""The welcome an empty chat shows (app/ui/welcome.py), on the real engine: the loaded model's name and what it
can do, three example prompts that send at a click, the drop hint only for a model that sees images.

Bad inputs tried: an example clicked with no model loaded (its buttons are disabled, nothing is sent).
"""

from __future__ import annotations

import pytest
import torch
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest

from app.service import EngineService
from app.ui.welcome import DROP_HINT, EXAMPLE_PROMPTS, VISION_PROMPTS


def test_a_new_chat_welcomes_with_the_model_name_and_no_drop_hint(window, engine_service):
    tab = window.new_chat()
    welcome = tab.welcome
    assert welcome.isVisible() and not tab.view.isVisible()
    assert engine_service.name and engine_service.name in welcome.title_label.text()
    assert "does not see images" in welcome.abilities_label.text()
    assert [b.text() for b in welcome.example_buttons] == list(EXAMPLE_PROMPTS)
    assert all(b.isEnabled() for b in welcome.example_buttons)
    assert not welcome.drop_hint.isVisible()  # the tiny text model cannot see images


def test_clicking_an_example_sends_it_and_the_welcome_goes(window, engine_service, app_store, run, ui):
    tab = window.new_chat()
    tab.set_settings(ui.greedy_settings(engine_service, 4))

    async def go():  # a send starts its answer as a task: the click must happen with the loop running
        QTest.mouseClick(tab.welcome.example_buttons[1], Qt.MouseButton.LeftButton)
        assert not tab.welcome.isVisible() and tab.view.isVisible()
        await ui.wait_idle(window)

    run(go())
    messages = app_store.messages(tab.chat_id)
    assert [m.role for m in messages] == ["user", "assistant"]
    assert messages[0].text == EXAMPLE_PROMPTS[1]
    assert tab.input.toPlainText() == ""
    assert not tab.welcome.isVisible()


def test_a_chat_with_messages_shows_no_welcome(window, app_store):
    chat = app_store.create_chat("Earlier", settings={})
    app_store.add_message(chat.id, "user", "Hello")
    app_store.add_message(chat.id, "assistant", "Hi there")
    tab = window.open_chat(chat.id)
    assert not tab.welcome.isVisible()
    assert tab.view.isVisible() and len(tab.message_widgets()) == 2


def test_the_welcome_follows_the_backend_and_says_when_no_model_is_loaded(window, engine_service, run):
    tab = window.new_chat()
    empty = EngineService(dtype=torch.float32)  # a service that has loaded nothing (yet)
    try:
        tab.set_backend(empty)
        assert "No model is loaded" in tab.welcome.title_label.text()
        assert not any(b.isEnabled() for b in tab.welcome.example_buttons)
        tab.set_backend(engine_service)
        assert engine_service.name in tab.welcome.title_label.text()
        assert all(b.isEnabled() for b in tab.welcome.example_buttons)
    finally:
        run(empty.close())


@pytest.fixture
def tiny_vision(qloop, tiny_llava_folder):
    service = EngineService(dtype=torch.float32)

    async def load():
        service.load_model(tiny_llava_folder, "tiny-llava")
        return await service.wait_loaded()

    assert qloop.run_until_complete(load())
    yield service
    qloop.run_until_complete(service.close())


def test_a_vision_model_is_welcomed_with_the_drop_hint(window, tiny_vision):
    tab = window.new_chat()
    tab.set_backend(tiny_vision)
    assert "tiny-llava" in tab.welcome.title_label.text()
    assert "sees images" in tab.welcome.abilities_label.text()
    assert tab.welcome.drop_hint.isVisible() and tab.welcome.drop_hint.text() == DROP_HINT


def test_a_vision_models_examples_ask_about_a_picture_and_wait_for_one(
    window, tiny_vision, app_store, shapes_png, run, ui
):
    # a vision model was offered "Write a four-line poem about the sea": its examples are what it can do with a
    # picture (describe, count, name a colour), and clicked without one they wait in the input for it
    tab = window.new_chat()
    tab.set_backend(tiny_vision)
    assert [b.text() for b in tab.welcome.example_buttons] == list(VISION_PROMPTS)
    assert not set(VISION_PROMPTS) & set(EXAMPLE_PROMPTS)
    QTest.mouseClick(tab.welcome.example_buttons[1], Qt.MouseButton.LeftButton)
    assert tab.input.toPlainText() == VISION_PROMPTS[1] and "Attach a picture" in tab.notice_text()
    assert app_store.messages(tab.chat_id) == [] and not tab.is_streaming
    tab.set_settings(ui.greedy_settings(tiny_vision, 3))

    async def go():
        await tab.attach_files([str(shapes_png)])
        QTest.mouseClick(tab.welcome.example_buttons[0], Qt.MouseButton.LeftButton)  # a picture is there: sent
        await ui.wait_idle(window)

    run(go())
    user, _answer = app_store.messages(tab.chat_id)
    assert user.text == VISION_PROMPTS[0] and len(user.images) == 1
    tab.set_backend(window.service)  # back to the text model: its own examples again
    window.new_chat()
    assert [b.text() for b in window.current_tab().welcome.example_buttons] == list(EXAMPLE_PROMPTS)
