"""A chat's JSON mode on the real engine (tiny model) and a real SQLite store: the check box saves it with the
chat, it survives the sampler panel's edits and a restart, and answers in JSON mode parse as JSON objects.

Bad inputs tried: a sampler-panel edit (a settings dict without "json_mode") while JSON mode is on; turning
it off again (the key leaves the stored settings); the box toggled from code (set_json_mode) stays in step.
"""

from __future__ import annotations

import json

from PySide6.QtCore import Qt

from app.service.generation import complete_settings
from app.store import Store
from app.ui.chat_tab import ChatTab


def send(tab, text: str) -> bool:
    tab.input.setPlainText(text)
    return tab.send()


def json_friendly_settings(service) -> dict:
    """Sampled settings favouring '"', so the random tiny model closes its strings and its object."""
    (quote,) = service.tokenizer.encode_ids('"')
    return complete_settings({"token_bias": {quote: 5.0}, "seed": 5, "max_new_tokens": 200})


def test_json_mode_persists_and_answers_parse(qtbot, window, engine_service, app_store, run, ui):
    tab = window.current_tab()
    tab.set_settings(json_friendly_settings(engine_service))
    assert not tab.json_mode_box.isChecked() and not tab.json_mode
    qtbot.mouseClick(tab.json_mode_box, Qt.MouseButton.LeftButton)
    assert tab.json_mode and app_store.get_chat(tab.chat_id).settings["json_mode"] is True

    # An edit in the sampler panel replaces the sampler settings, not the chat's JSON mode.
    window.sampler_panel.set_settings(tab.settings())  # what the window shows for this tab
    window.sampler_panel.control("temperature").setValue(0.9)
    stored = app_store.get_chat(tab.chat_id).settings
    assert stored["temperature"] == 0.9 and stored["json_mode"] is True
    assert stored["seed"] == 5 and stored["token_bias"] == {str(q): 5.0 for q in tab.settings()["token_bias"]}
    assert "json_mode" not in tab.settings()  # the sampler's dict (and new chats made from it) stay without it

    async def go(text: str):
        assert send(tab, text)
        await ui.wait_idle(window)

    run(go("Describe the fox as JSON"))
    answer = app_store.messages(tab.chat_id)[-1]
    assert isinstance(json.loads(answer.text), dict), answer.text
    assert answer.stats["json_mode"] is True and answer.stats["eos_reason"] == "end_filter"
    assert answer.settings["json_mode"] is True
    assert "JSON complete" in tab.message_widgets()[-1].stats_label.text()

    # A restart: a new Store on the same file, a new tab for the chat.
    with Store() as again:
        reopened = ChatTab(again, engine_service, tab.chat_id)
        qtbot.addWidget(reopened)
        assert reopened.json_mode and reopened.json_mode_box.isChecked()

    tab.set_json_mode(False)  # from code: the box follows
    assert not tab.json_mode_box.isChecked() and "json_mode" not in app_store.get_chat(tab.chat_id).settings
    tab.set_settings(ui.greedy_settings(engine_service, 12))
    run(go("And now without"))
    answer = app_store.messages(tab.chat_id)[-1]
    assert "json_mode" not in answer.stats and "json_mode" not in answer.settings
    assert "JSON" not in tab.message_widgets()[-1].stats_label.text()
