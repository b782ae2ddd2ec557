"""A gpt-oss-style (harmony) model in a chat: the reasoning effort box shows for a template that reads
`reasoning_effort`, the chosen effort is saved with the chat and reaches the template (local) and the request
(remote), and the analysis channel streams into the Thinking block apart from the final answer, with no
harmony marker shown, kept with the answer and left out of the next turn's history.

The model is a tiny Llama made to write one harmony reply (tests/harmony_models.py); its vocabulary spells
"high" in fewer tokens than "low", so the answer's prompt_tokens tell which effort the template was given.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from app.service import EngineService
from app.service.generation import GenerationSettings, with_chat_switches
from app.service.reasoning import answer_only
from app.service.remote import RemoteBackend
from app.ui.chat_answer import conversation
from app.ui.message_view import MessageWidget
from engine.reasoning import HarmonyFormat

_spec = importlib.util.spec_from_file_location("harmony_models", Path(__file__).parents[2] / "harmony_models.py")
harmony_models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(harmony_models)

THINKING, ANSWER = harmony_models.THINKING, harmony_models.ANSWER


@pytest.fixture
def harmony_service(tmp_path, run):
    folder = tmp_path / "harmony"
    folder.mkdir()
    harmony_models.save_harmony_llama(folder)
    service = EngineService(dtype=torch.float32)

    async def load():
        service.load_model(folder, "tiny-harmony")
        return await service.wait_loaded()

    assert run(load())
    yield service
    run(service.close())


def test_the_effort_reaches_the_template_and_the_channels_stream_apart(harmony_service, app_store, run, ui):
    assert harmony_service.reasoning_format == HarmonyFormat(effort=True)
    window = ui.open_window(app_store, harmony_service)
    try:
        tab = window.current_tab()
        run(ui.wait_for(lambda: tab.effort_box.isVisible(), what="the effort box for a template with the variable"))
        assert not tab.thinking_box.isVisible()  # the template has no enable_thinking switch
        assert tab.reasoning_effort is None and tab.effort_box.currentData() == ""  # the model's default
        tab.effort_box.setCurrentIndex(tab.effort_box.findData("high"))
        assert tab.reasoning_effort == "high"
        assert app_store.get_chat(tab.chat_id).settings["reasoning_effort"] == "high"
        tab.set_settings(ui.greedy_settings(harmony_service, 64, allow_eos=True))  # a preset keeps the effort
        assert tab.reasoning_effort == "high"
        settings = GenerationSettings.from_dict(app_store.get_chat(tab.chat_id).settings)
        assert settings.reasoning_effort == "high" and settings.template_options() == {"reasoning_effort": "high"}
        assert RemoteBackend("http://h/v1", model="m").request_body([], settings)["reasoning_effort"] == "high"
        tab.input.setPlainText("Colours?")

        async def send():
            assert tab.send()
            await ui.wait_idle(window)

        run(send())
        answer = app_store.messages(tab.chat_id)[-1]
        question = [{"role": "user", "content": "Colours?"}]
        system = tab.chat.system_prompt
        high, low = (
            int(harmony_service.encode_chat(question, system, None, {"reasoning_effort": e}).shape[-1])
            for e in ("high", "low")
        )
        assert answer.stats["prompt_tokens"] == high != low  # the template was given the chat's effort
        assert answer.complete and answer.stats["eos_reason"] == "stop_token"  # at <|return|>
        assert answer.text == harmony_models.REPLY_TEXT  # stored as the model wrote it, markers included
        assert answer.stats["reasoning"]["kind"] == "harmony"
        widget = tab.message_widgets()[-1]
        assert widget.thinking.isVisible() and widget.thinking.text.text() == THINKING
        assert widget.answer_text == ANSWER and "<|" not in widget.body.toPlainText()
        messages, _ = conversation(app_store, tab.chat_id, see_images=False)
        assert messages[-1] == {"role": "assistant", "content": ANSWER}  # the analysis is not sent again
        assert answer_only(answer.text, answer.stats) == ANSWER

        reopened = MessageWidget(answer.id, "assistant", answer.text, stats=answer.stats)
        assert reopened.thinking.text.text() == THINKING and reopened.answer_text == ANSWER
        reopened.deleteLater()
        tab.set_reasoning_effort(None)
        assert tab.effort_box.currentData() == "" and "reasoning_effort" not in tab.chat.settings
    finally:
        run(ui.close_window(window))


def test_models_without_the_variable_hide_the_effort_box(window):
    assert not window.current_tab().effort_box.isVisible()  # the tiny Llama's ChatML reads no reasoning_effort


def test_the_chat_keeps_its_own_switches_over_a_preset():
    chat = {"temperature": 0.5, "json_mode": True, "thinking": False, "reasoning_effort": "low", "overflow": "stop"}
    kept = with_chat_switches({"temperature": 0.9, "reasoning_effort": "high", "thinking": True}, chat)
    assert kept == {
        "temperature": 0.9,
        "json_mode": True,
        "thinking": False,
        "overflow": "stop",
        "reasoning_effort": "low",
    }
    assert "reasoning_effort" not in with_chat_switches({"reasoning_effort": "high"}, {})
    with pytest.raises(ValueError, match="reasoning_effort must be one of"):
        GenerationSettings(reasoning_effort="extreme")
    assert GenerationSettings.from_dict({"reasoning_effort": "extreme"}).reasoning_effort is None  # a stored typo
    assert GenerationSettings(reasoning_effort="low").to_dict()["reasoning_effort"] == "low"
    assert "reasoning_effort" not in RemoteBackend("http://h/v1", model="m").request_body([], GenerationSettings())
