"""A reasoning model in a chat: its thinking streams into the Thinking block apart from the answer, is kept
with the answer (format and duration in the stats) so a reopened chat shows it the same way, and stays out of
the history sent next turn.

A tiny random Qwen3 (float32) whose R1-style template opens the <think> block in the prompt, so everything
the random model writes is thinking (it never closes the block in 12 tokens): the engine's parser decides
that from the prompt, the chat tab learns it from the results. Stored answers with a closed block check the
split and the history.
"""

from __future__ import annotations

import pytest
import torch

from app.service import EngineService
from app.service.generation import GenerationSettings
from app.service.reasoning import answer_only
from app.service.remote import RemoteBackend
from app.ui.chat_answer import conversation
from app.ui.message_view import MessageWidget


def serve_tiny_qwen3(folder, template: str, name: str, reasoning_models, run):
    """An EngineService with a tiny random Qwen3 under `template` loaded as `name`; yields it, then closes it."""
    folder.mkdir()
    reasoning_models.tiny_qwen3(folder, template)
    service = EngineService(dtype=torch.float32)

    async def load():
        service.load_model(folder, name)
        return await service.wait_loaded()

    assert run(load())
    yield service
    run(service.close())


@pytest.fixture
def r1_service(tmp_path, reasoning_models, run):
    yield from serve_tiny_qwen3(tmp_path / "r1", reasoning_models.R1_STYLE, "tiny-r1", reasoning_models, run)


def test_thinking_streams_apart_and_stays_out_of_the_next_prompt(r1_service, app_store, run, ui):
    assert r1_service.reasoning_format is not None
    window = ui.open_window(app_store, r1_service)
    try:
        tab = window.current_tab()
        tab.set_settings(ui.greedy_settings(r1_service, 12))
        tab.input.setPlainText("Colours?")

        async def send():
            assert tab.send()
            await ui.wait_idle(window)

        run(send())
        answer = app_store.messages(tab.chat_id)[-1]
        assert answer.role == "assistant" and answer.text.strip()
        assert answer.stats["reasoning"] == {"start": "<think>", "end": "</think>", "inside": True}
        widget = tab.message_widgets()[-1]
        assert widget.thinking.isVisible() and widget.thinking.text.text() == answer.text.strip()
        assert widget.answer_text == ""  # all of it was thinking
        messages, _ = conversation(app_store, tab.chat_id, see_images=False)
        assert messages[-1] == {"role": "assistant", "content": ""}  # the thinking is not sent again

        reopened = MessageWidget(answer.id, "assistant", answer.text, stats=answer.stats)
        assert reopened.thinking.text.text() == answer.text.strip() and reopened.answer_text == ""
        reopened.deleteLater()
    finally:
        run(ui.close_window(window))


def test_a_closed_block_is_shown_apart_and_left_out_of_history(qtbot):
    text = "<think>\nThe user wants colours.\n</think>\n\nRed, green and blue."
    stats = {"reasoning": {"start": "<think>", "end": "</think>", "inside": False}, "thinking_seconds": 2.5}
    widget = MessageWidget(1, "assistant", text, stats=stats)
    qtbot.addWidget(widget)
    widget.show()
    assert widget.thinking.text.text() == "The user wants colours."
    assert widget.thinking.toggle.text() == "▸ Thought for 2.5 s" and not widget.thinking.is_open
    assert widget.answer_text == "Red, green and blue." and "Red, green and blue." in widget.body.toPlainText()
    assert "think" not in widget.body.toPlainText()
    assert answer_only(text, stats) == "Red, green and blue."
    assert answer_only(text, None) == "Red, green and blue."  # an answer kept without a format: <think> tags
    plain = MessageWidget(2, "assistant", "Just an answer.")
    qtbot.addWidget(plain)
    plain.show()
    assert not plain.thinking.isVisible() and plain.answer_text == "Just an answer."


@pytest.fixture
def qwen3_service(tmp_path, reasoning_models, run):
    yield from serve_tiny_qwen3(tmp_path / "qwen3", reasoning_models.QWEN3_STYLE, "tiny-qwen3", reasoning_models, run)


def test_the_think_switch_reaches_the_template_and_is_saved_with_the_chat(qwen3_service, app_store, run, ui):
    window = ui.open_window(app_store, qwen3_service)
    try:
        tab = window.current_tab()
        run(ui.wait_for(lambda: tab.thinking_box.isVisible(), what="the Think switch for a Qwen3-style template"))
        assert tab.thinking_box.isChecked() and tab.thinking is None  # the model's default: thinking on
        tab.thinking_box.setChecked(False)
        assert tab.thinking is False and app_store.get_chat(tab.chat_id).settings["thinking"] is False
        tab.set_settings(ui.greedy_settings(qwen3_service, 6))  # a preset keeps the chat's switch
        assert tab.thinking is False
        settings = GenerationSettings.from_dict(app_store.get_chat(tab.chat_id).settings)
        assert settings.thinking is False and settings.to_dict()["thinking"] is False
        ids = qwen3_service.encode_chat([{"role": "user", "content": "Hi"}], "", None, {"enable_thinking": False})
        assert qwen3_service.tokenizer.decode(ids, decode_special_tokens=True).endswith("<think>\n\n</think>\n\n")
        tab.input.setPlainText("Colours?")

        async def send():
            assert tab.send()
            await ui.wait_idle(window)

        run(send())
        answer = app_store.messages(tab.chat_id)[-1]
        assert answer.complete and "reasoning" not in answer.stats  # the template closed the block: no thinking
        assert RemoteBackend("http://h/v1", model="m").request_body([], settings)["chat_template_kwargs"] == {
            "enable_thinking": False
        }
    finally:
        run(ui.close_window(window))


def test_models_without_the_switch_hide_it(window):
    assert not window.current_tab().thinking_box.isVisible()  # the tiny Llama's ChatML has no reasoning
