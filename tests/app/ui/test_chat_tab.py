"""Chat tabs on the real engine (tiny model): concurrent streaming, stop, regenerate, edit-and-resend, keys.

Bad inputs tried: Enter on an empty input (nothing sent), a send while the tab is streaming (refused with a
notice), Esc with nothing streaming (no effect), regenerate with no answer (refused).
"""

from __future__ import annotations

import asyncio
import time

from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication, QInputDialog

from app.store import Store
from app.ui.chat_tab import SAVE_INTERVAL_MS
from engine import Cache, DynamicGenerator, DynamicJob, SamplerSettings

NUM_TOKENS = 96


def run_alone(service, prompt: str, max_new_tokens: int) -> str:
    """The same prompt alone on a fresh engine.DynamicGenerator, greedy, SamplerSettings built by hand."""
    model = service.model
    generator = DynamicGenerator(model, Cache(model, 1024, page_size=256), service.tokenizer, max_seq_len=1024)
    eos = sorted(service.tokenizer.eos_token_ids)
    job = DynamicJob(
        service.encode_chat([{"role": "user", "content": prompt}]),
        max_new_tokens=max_new_tokens,
        gen_settings=SamplerSettings.greedy(disallowed_tokens=frozenset(eos)),
        stop_conditions=eos,
    )
    generator.enqueue(job)
    text = None
    while generator.num_remaining_jobs():
        for result in generator.iterate():
            if result["eos"]:
                text = result["full_completion"]
    return text


def send(tab, text: str) -> bool:
    tab.input.setPlainText(text)
    return tab.send()


def test_two_tabs_stream_at_once_and_each_matches_the_engine_alone(window, engine_service, app_store, run, ui):
    # long enough that the first answer is still running when the second send is enqueued, on a fast machine too
    settings = ui.greedy_settings(engine_service, NUM_TOKENS)
    tab_a = window.current_tab()
    tab_a.set_settings(settings)
    tab_b = window.new_chat()
    assert tab_b.settings() == settings  # a new chat starts from the current tab's settings
    chunks = {tab_a.chat_id: [], tab_b.chat_id: []}
    for tab in (tab_a, tab_b):
        tab.chunk_received.connect(lambda chat_id, _text: chunks[chat_id].append(time.perf_counter()))
    prompts = {tab_a.chat_id: "The quick brown fox", tab_b.chat_id: "One two three four"}

    async def go():
        assert send(tab_a, prompts[tab_a.chat_id])
        assert send(tab_b, prompts[tab_b.chat_id])
        assert tab_a.is_streaming and tab_b.is_streaming
        assert not send(tab_a, "again")  # one answer per tab at a time
        assert "still answering" in tab_a.notice_text()
        await ui.wait_idle(window)

    run(go())
    (a_first, a_last), (b_first, b_last) = ((c[0], c[-1]) for c in chunks.values())
    assert len(chunks[tab_a.chat_id]) > 3 and len(chunks[tab_b.chat_id]) > 3
    assert a_first < b_last and b_first < a_last, "the two answers did not stream at the same time"
    for tab in (tab_a, tab_b):
        user, answer = app_store.messages(tab.chat_id)
        assert (user.role, user.text, user.complete) == ("user", prompts[tab.chat_id], True)
        assert answer.role == "assistant" and answer.complete
        assert answer.stats["new_tokens"] == NUM_TOKENS and answer.stats["eos_reason"] == "max_new_tokens"
        expected = run_alone(engine_service, prompts[tab.chat_id], NUM_TOKENS)
        assert answer.text == expected
        assert tab.message_widgets()[-1].text == expected
        # the chat was named after its first message
        assert tab.title == prompts[tab.chat_id]
        assert window.tabs.tabText(window.tabs.indexOf(tab)) == prompts[tab.chat_id]


def test_answer_stats_and_context_meter(window, engine_service, app_store, run, ui):
    tab = window.current_tab()
    tab.set_settings(ui.greedy_settings(engine_service, 12))
    tab.system_prompt_edit.setPlainText("You are terse.")

    async def go():
        assert send(tab, "Hello there")  # at once: the system prompt typed just before counts
        await ui.wait_idle(window)

    run(go())
    assert app_store.get_chat(tab.chat_id).system_prompt == "You are terse."
    answer = app_store.messages(tab.chat_id)[-1]
    stats = answer.stats
    hello = [{"role": "user", "content": "Hello there"}]
    assert stats["prompt_tokens"] == engine_service.count_tokens(hello, "You are terse.")
    assert stats["new_tokens"] == 12 and stats["prompt_tokens"] > 0 and stats["cached_tokens"] >= 0
    assert stats["tokens_per_second"] > 0 and stats["time_to_first_token"] > 0
    line = tab.message_widgets()[-1].stats_label.text()
    for part in ("12 tokens", "tok/s", "first token", f"{stats['cached_tokens']} of {stats['prompt_tokens']}"):
        assert part in line
    conversation = [{"role": m.role, "content": m.text} for m in app_store.messages(tab.chat_id)]
    used = engine_service.count_tokens(conversation, "You are terse.")
    # counted on a worker thread (it renders the chat template) once the answer ends
    run(ui.wait_for(lambda: tab.context_meter.value() == used, what="the context meter's count"))
    assert tab.context_meter.maximum() == engine_service.context_length
    assert used > engine_service.count_tokens(conversation)  # the system prompt counts


def test_stop_keeps_the_partial_answer_and_a_new_window_shows_it(window, engine_service, app_store, run, ui):
    tab = window.current_tab()
    tab.set_settings(ui.greedy_settings(engine_service, 600))

    async def go():
        assert send(tab, "Tell me a long story")
        await ui.wait_for(lambda: len(tab.streamed_text) >= 8, what="some text")
        tab.stop_button.click()
        await ui.wait_idle(window)

    run(go())
    answer = app_store.messages(tab.chat_id)[-1]
    assert answer.role == "assistant" and answer.text
    assert not answer.complete and answer.stats["stopped"]
    assert 0 < answer.stats["new_tokens"] < 600
    assert tab.message_widgets()[-1].text == answer.text
    assert "stopped" in tab.message_widgets()[-1].stats_label.text()

    with Store(app_store.path) as fresh:  # on disk, not only in this connection
        assert fresh.messages(tab.chat_id)[-1].text == answer.text
    run(ui.close_window(window))
    reopened = ui.open_window(app_store, engine_service)
    try:
        shown = reopened.current_tab()
        assert shown.chat_id == tab.chat_id
        assert [w.text for w in shown.message_widgets()] == ["Tell me a long story", answer.text]
    finally:
        run(ui.close_window(reopened))


def test_regenerate_replaces_the_last_answer(window, engine_service, app_store, run, ui):
    tab = window.current_tab()
    tab.set_settings(ui.greedy_settings(engine_service, 10))

    async def go():
        assert not tab.regenerate()  # nothing to regenerate yet
        assert send(tab, "Say something")
        await ui.wait_idle(window)
        first = app_store.messages(tab.chat_id)[-1]
        button = tab.message_widgets()[-1].regenerate_button
        assert button.isVisible() and button.isEnabled()
        assert not tab.message_widgets()[0].regenerate_button.isVisible()
        button.click()
        assert tab.is_streaming
        await ui.wait_idle(window)
        return first

    first = run(go())
    messages = app_store.messages(tab.chat_id)
    assert [m.role for m in messages] == ["user", "assistant"]
    # a new row (SQLite may reuse the deleted row's id, so compare creation times)
    assert messages[-1].created_at > first.created_at and messages[-1].complete
    assert messages[-1].text == first.text  # greedy: the same answer again
    assert [w.message_id for w in tab.message_widgets()] == [m.id for m in messages]


def test_edit_and_resend_replaces_later_messages(window, engine_service, app_store, run, ui):
    tab = window.current_tab()
    tab.set_settings(ui.greedy_settings(engine_service, 8))

    async def go():
        assert send(tab, "First question")
        await ui.wait_idle(window)
        assert send(tab, "Second question")
        await ui.wait_idle(window)
        first_user = app_store.messages(tab.chat_id)[0]
        tab.message_widgets()[0].edit_button.click()
        assert tab.input.toPlainText() == "First question" and tab.edit_bar.isVisible()
        assert send(tab, "Edited question")
        await ui.wait_idle(window)
        return first_user

    first_user = run(go())
    messages = app_store.messages(tab.chat_id)
    assert [(m.role, m.text if m.role == "user" else "") for m in messages] == [
        ("user", "Edited question"),
        ("assistant", ""),
    ]
    assert messages[0].created_at > first_user.created_at  # a new row, not the old one rewritten
    assert messages[1].text == run_alone(engine_service, "Edited question", 8)
    assert [w.text for w in tab.message_widgets()] == [m.text for m in messages]
    assert not tab.edit_bar.isVisible()


def test_cancel_edit_keeps_the_conversation(window, engine_service, app_store, run, ui):
    tab = window.current_tab()
    tab.set_settings(ui.greedy_settings(engine_service, 4))

    async def go():
        assert send(tab, "Keep me")
        await ui.wait_idle(window)

    run(go())
    before = app_store.messages(tab.chat_id)
    tab.begin_edit(before[0].id)
    tab.cancel_edit()
    assert tab.input.toPlainText() == "" and not tab.edit_bar.isVisible()
    assert app_store.messages(tab.chat_id) == before


def test_keyboard_enter_shift_enter_esc(window, engine_service, app_store, run, ui):
    tab = window.current_tab()
    tab.set_settings(ui.greedy_settings(engine_service, 600))
    window.activateWindow()

    async def go():
        await ui.wait_for(lambda: QApplication.activeWindow() is window, what="the window to be active")
        QTest.keyClick(tab.input, Qt.Key.Key_Return)  # empty input: nothing happens
        assert app_store.messages(tab.chat_id) == []
        QTest.keyClicks(tab.input, "line one")
        QTest.keyClick(tab.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
        QTest.keyClicks(tab.input, "line two")
        assert tab.input.toPlainText() == "line one\nline two"
        assert app_store.messages(tab.chat_id) == []
        QTest.keyClick(tab.input, Qt.Key.Key_Return)
        assert tab.is_streaming and tab.input.toPlainText() == ""
        assert app_store.messages(tab.chat_id)[0].text == "line one\nline two"
        await ui.wait_for(lambda: len(tab.streamed_text) >= 4, what="some text")
        QTest.keyClick(tab.input, Qt.Key.Key_Escape)
        await ui.wait_idle(window)
        QTest.keyClick(tab.input, Qt.Key.Key_Escape)  # nothing streaming: harmless

    run(go())
    answer = app_store.messages(tab.chat_id)[-1]
    assert answer.stats["stopped"] and answer.stats["new_tokens"] < 600 and answer.text


def test_ctrl_t_ctrl_w_and_rename(window, engine_service, app_store, run, ui):
    first = window.current_tab()
    first.set_settings(ui.greedy_settings(engine_service, 600))
    window.activateWindow()

    async def go():
        await ui.wait_for(lambda: QApplication.activeWindow() is window, what="the window to be active")
        QTest.keyClick(window, Qt.Key.Key_T, Qt.KeyboardModifier.ControlModifier)
        assert window.tabs.count() == 2
        empty = window.current_tab()
        assert empty is not first and empty.title == "New chat"
        QTest.keyClick(window, Qt.Key.Key_W, Qt.KeyboardModifier.ControlModifier)
        assert window.tabs.count() == 1 and window.current_tab() is first
        # a closed chat without messages is discarded
        await ui.wait_for(lambda: empty.chat_id not in [c.id for c in app_store.list_chats()], what="discard")
        # closing a tab while it streams stops the answer and keeps what it wrote
        assert send(first, "Stream then close")
        await ui.wait_for(lambda: len(first.streamed_text) >= 4, what="some text")
        QTest.keyClick(window, Qt.Key.Key_W, Qt.KeyboardModifier.ControlModifier)
        assert window.tabs.count() == 1 and window.current_tab() is not first  # a fresh chat replaces it
        await ui.wait_for(lambda: not first.is_streaming, what="the closed tab to stop")

    run(go())
    answer = app_store.messages(first.chat_id)[-1]
    assert answer.role == "assistant" and answer.text and answer.stats["stopped"]
    assert first.chat_id in window.sidebar.chat_ids()

    tab = window.current_tab()
    window.rename_chat(tab.chat_id, "  Renamed   chat ")
    assert app_store.get_chat(tab.chat_id).title == "Renamed chat"
    assert window.tabs.tabText(window.tabs.currentIndex()) == "Renamed chat"
    window.ask_rename(window.tabs.currentIndex())
    dialog = window.findChild(QInputDialog)
    assert dialog is not None and dialog.textValue() == "Renamed chat"
    dialog.setTextValue("Via dialog")
    dialog.accept()
    assert app_store.get_chat(tab.chat_id).title == "Via dialog"


def test_a_streaming_answer_is_saved_while_it_streams(window, engine_service, app_store, run, ui):
    assert SAVE_INTERVAL_MS <= 1000  # the promise: at least every second
    tab = window.current_tab()
    tab.save_interval_ms = 50  # the same timer, faster, so the tiny model's short answer sees several saves
    tab.set_settings(ui.greedy_settings(engine_service, 900))
    seen: list[tuple[float, str]] = []  # (time, text) each time another connection sees new text

    async def go():
        with Store(app_store.path) as watcher:
            assert send(tab, "Write for a while")
            while tab.is_streaming and len(seen) < 4:
                # The answer's row appears once its prompt is built (off the GUI thread), after the user's.
                answers = [m for m in watcher.messages(tab.chat_id) if m.role == "assistant"]
                text = answers[-1].text if answers else ""
                if text and (not seen or text != seen[-1][1]):
                    seen.append((time.monotonic(), text))
                await asyncio.sleep(0.01)
            tab.stop()
            await ui.wait_idle(window)

    run(go())
    assert len(seen) >= 3, f"the answer was saved {len(seen)} times while it streamed"
    gaps = [b[0] - a[0] for a, b in zip(seen, seen[1:])]
    assert max(gaps) < 0.05 + 0.5  # slack for a busy machine
    assert all(b[1].startswith(a[1]) for a, b in zip(seen, seen[1:]))
