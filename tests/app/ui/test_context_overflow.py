"""A chat longer than a 512-token context keeps answering under truncate-middle (real engine, tiny model): the
divider marks where the model's view begins, nothing is deleted, and an answer the context's end cuts is written
on in the same message once the policy frees room. Under `stop` the same chat is refused, as before.

Bad inputs tried: a chat past the context under `stop` (a notice, no answer), an answer longer than the context
itself (written on until nothing more fits, then a notice).
"""

from __future__ import annotations

import pytest
import torch

from app.service import EngineService
from app.ui.chat_answer import conversation
from app.ui.context_divider import DIVIDER_TEXT
from engine.chat.overflow import OverflowPolicy
from engine.chat.request import AnswerOptions

CONTEXT = 512
QUESTION = "Tell me about apples and pears number {}, and then about plums and cherries too."


@pytest.fixture(scope="module")
def service_512(qloop, tiny_folder):
    service = EngineService(dtype=torch.float32)

    async def load():
        service.load_model(tiny_folder, "tiny", context_length=CONTEXT)
        return await service.wait_loaded()

    assert qloop.run_until_complete(load())
    assert service.context_length == CONTEXT
    yield service
    qloop.run_until_complete(service.close())


@pytest.fixture
def tab_512(app_store, service_512, run, ui):
    window = ui.open_window(app_store, service_512)
    yield window.current_tab()
    run(ui.close_window(window))


def settled(tab):
    """Idle, with no Continue of a context-cut answer still to come."""
    return not tab.is_streaming and not tab.answer.filled_context


def ask(tab, run, ui, text: str) -> str:
    """Send `text` and wait for the answer; the notice the tab shows then ("" for none)."""

    async def go():
        tab.input.setPlainText(text)
        assert tab.send(), tab.notice_text()
        await ui.wait_for(lambda: settled(tab), what="the answer (and its continuations) to finish")
        return tab.notice_text()

    return run(go())


def test_a_long_chat_keeps_answering_and_shows_where_the_models_view_begins(tab_512, service_512, app_store, run, ui):
    tab = tab_512
    tab.set_settings(ui.greedy_settings(service_512, 40))
    tab.set_overflow("truncate-middle")
    turns = 9
    for t in range(turns):
        notice = ask(tab, run, ui, QUESTION.format(t))
        assert not notice, notice
    messages = app_store.messages(tab.chat_id)
    assert len(messages) == 2 * turns, "nothing is deleted from the history"
    assert all(m.complete and m.stats["new_tokens"] == 40 for m in messages if m.role == "assistant")
    # Nine turns of ~90 tokens do not fit 512: the oldest turns after the first exchange were left out.
    total = service_512.count_tokens([{"role": m.role, "content": m.text} for m in messages])
    assert total > CONTEXT
    divider = tab.view.divider
    assert divider is not None and divider.isVisible() and divider.label.text() == DIVIDER_TEXT
    first_seen = tab.view.divider_before()
    ids = [m.id for m in messages]
    assert first_seen in ids and ids.index(first_seen) >= 2  # the first exchange is still seen
    assert app_store.messages(tab.chat_id)[ids.index(first_seen)].role == "user"
    assert len(tab.message_widgets()) == 2 * turns
    assert messages[-1].stats["prompt_tokens"] + 40 <= CONTEXT


def letters_only(service, settings: dict) -> dict:
    """`settings` that let the model write only single letters, so its text encodes back to no more tokens
    than it wrote (random weights otherwise write pieces that re-encode longer, and Continue re-encodes)."""
    letters = {service.tokenizer.piece_to_id(c) for c in "abcdefgh"}
    return {**settings, "disallowed_tokens": sorted(set(range(service.model.config.vocab_size)) - letters)}


def test_an_answer_cut_by_the_context_is_written_on_in_the_same_message(tab_512, service_512, app_store, run, ui):
    tab = tab_512
    tab.set_settings(ui.greedy_settings(service_512, 40))
    tab.set_overflow("truncate-middle")
    for t in range(3):
        ask(tab, run, ui, QUESTION.format(t))
    # More than half the context: the policy reserves half, so the context's end cuts the answer first.
    tab.set_settings(letters_only(service_512, ui.greedy_settings(service_512, 300)))
    before = conversation(app_store, tab.chat_id, False)[0] + [{"role": "user", "content": QUESTION.format(3)}]
    first = service_512.local_backend.prompt(
        before, "", None, {}, OverflowPolicy.TRUNCATE_MIDDLE, AnswerOptions(max_new_tokens=300)
    )
    first_room = CONTEXT - int(first.ids.shape[-1])
    assert first_room < 300
    ask(tab, run, ui, QUESTION.format(3))
    messages = app_store.messages(tab.chat_id)
    assert len(messages) == 8 and messages[-1].role == "assistant"
    answer = messages[-1]
    assert answer.stats["new_tokens"] > first_room, "the answer stopped where the context ended"
    # The last part's prompt held the answer written so far, after the policy dropped turns to make room.
    assert answer.stats["prompt_tokens"] > first_room
    assert tab.message_widgets()[-1].text == answer.text and len(tab.message_widgets()) == 8


def test_stop_refuses_the_chat_that_outgrew_the_context(tab_512, service_512, app_store, run, ui):
    tab = tab_512
    tab.set_settings(ui.greedy_settings(service_512, 40))
    tab.set_overflow("stop")
    for t in range(9):
        if "fills the model's context" in ask(tab, run, ui, QUESTION.format(t)):
            break
    else:
        raise AssertionError("a chat past 512 tokens should be refused under stop")
    assert tab.view.divider is None


def test_the_panel_sets_this_chats_policy_and_shows_each_chats_own(app_store, service_512, run, ui):
    window = ui.open_window(app_store, service_512)
    try:
        panel, first = window.sampler_panel, window.current_tab()
        assert first.overflow is None and panel.overflow is None  # the app's default
        panel.overflow_combo.setCurrentIndex(panel.overflow_combo.findData("rolling-window"))
        panel.overflow_combo.activated.emit(panel.overflow_combo.currentIndex())
        assert first.overflow == "rolling-window"
        assert app_store.get_chat(first.chat_id).settings["overflow"] == "rolling-window"
        first.set_settings(ui.greedy_settings(service_512, 8))  # a preset's fields keep the chat's policy
        assert first.overflow == "rolling-window"
        second = window.new_chat()
        assert window.current_tab() is second and panel.overflow == second.overflow
        window.tabs.setCurrentWidget(first)
        assert panel.overflow == "rolling-window"
    finally:
        run(ui.close_window(window))
