"""Kept versions and branches in a chat tab, on the real engine (tiny model): regenerate keeps the earlier
answer, an edited question starts a branch, ←/→ and Alt+Left/Alt+Right switch, the prompt follows the visible
branch and the prefix cache serves each branch's own prefix after a switch, and a chat written before
versions existed shows as it was.

Bad inputs tried: ← on the first version and → on the last (disabled, and refused when called), a switch while
the chat answers (refused), a regenerate stopped before its answer started (the old answer comes back).
"""

from __future__ import annotations

import json

from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication

from app.service.memory_plan import PAGE_SIZE
from app.store import Store
from app.store.migrations import MIGRATIONS
from app.ui.message_view import MessageWidget


def send(tab, text: str) -> bool:
    tab.input.setPlainText(text)
    return tab.send()


def shown(tab) -> list[str]:
    return [w.text for w in tab.message_widgets()]


def switch(tab) -> list[tuple[str, bool, bool]]:
    """Each message's version label and whether ← and → can be clicked ("" where it has one version)."""
    return [
        (w.versions.label.text(), w.versions.back_button.isEnabled(), w.versions.forward_button.isEnabled())
        if not w.versions.isHidden()
        else ("", False, False)
        for w in tab.message_widgets()
    ]


def unshown_widgets() -> list[MessageWidget]:
    """Message widgets with no parent: built and never put in a conversation."""
    return [w for w in QApplication.topLevelWidgets() if isinstance(w, MessageWidget)]


def test_regenerate_keeps_the_earlier_answer_as_a_version(window, engine_service, app_store, run, ui):
    tab = window.current_tab()
    tab.set_settings(ui.greedy_settings(engine_service, 6))
    at_begin: list[list[tuple[str, bool, bool]]] = []  # the switches as each answer begins (off: it answers)
    tab.answer.began.connect(lambda: at_begin.append(switch(tab)))

    async def go():
        assert send(tab, "Say something")
        await ui.wait_idle(window)
        tab.message_widgets()[-1].regenerate_button.click()
        assert tab.is_streaming
        assert not tab.switch_version(tab.message_widgets()[0].message_id, +1)  # refused while answering
        await ui.wait_idle(window)
        tab.message_widgets()[-1].regenerate_button.click()
        await ui.wait_idle(window)

    run(go())
    off = ("", False, False)
    assert at_begin == [[off, off], [off, ("2/2", False, False)], [off, ("3/3", False, False)]]
    question, *answers = app_store.all_messages(tab.chat_id)
    assert [a.role for a in answers] == ["assistant"] * 3 and all(a.complete for a in answers)
    assert {a.parent_id for a in answers} == {question.id}
    ids = lambda t: [w.message_id for w in t.message_widgets()]  # noqa: E731
    assert ids(tab) == [question.id, answers[2].id]
    assert switch(tab) == [("", False, False), ("3/3", True, False)]
    tab.message_widgets()[-1].versions.back_button.click()
    assert ids(tab) == [question.id, answers[1].id] and switch(tab)[1] == ("2/3", True, True)
    tab.message_widgets()[-1].versions.back_button.click()
    assert ids(tab) == [question.id, answers[0].id] and switch(tab)[1] == ("1/3", False, True)
    assert shown(tab)[1] == answers[0].text
    assert not tab.switch_version(answers[0].id, -1)  # nothing before the first version
    assert [m.id for m in app_store.messages(tab.chat_id)] == [question.id, answers[0].id]  # saved
    # the next answer's prompt is the visible thread: the meter counts the version shown
    conversation = [{"role": m.role, "content": m.text} for m in app_store.messages(tab.chat_id)]
    used = engine_service.count_tokens(conversation)
    run(ui.wait_for(lambda: tab.context_meter.value() == used, what="the context meter's count"))

    run(ui.close_window(window))
    reopened = ui.open_window(app_store, engine_service)
    try:
        again = reopened.current_tab()
        assert ids(again) == [question.id, answers[0].id] and switch(again)[1] == ("1/3", False, True)
    finally:
        run(ui.close_window(reopened))


def test_alt_left_and_alt_right_switch_the_focused_or_lowest_message(window, engine_service, app_store, run, ui):
    tab = window.current_tab()
    tab.set_settings(ui.greedy_settings(engine_service, 4))
    window.activateWindow()

    async def go():
        await ui.wait_for(lambda: QApplication.activeWindow() is window, what="the window to be active")
        assert send(tab, "First question")
        await ui.wait_idle(window)
        tab.message_widgets()[0].edit_button.click()
        assert send(tab, "Edited question")
        await ui.wait_idle(window)
        assert tab.regenerate()
        await ui.wait_idle(window)

    run(go())
    assert shown(tab)[0] == "Edited question" and switch(tab) == [("2/2", True, False), ("2/2", True, False)]
    QTest.keyClick(window, Qt.Key.Key_Left, Qt.KeyboardModifier.AltModifier)  # no focus: the lowest message
    assert switch(tab) == [("2/2", True, False), ("1/2", False, True)]
    tab.message_widgets()[0].body.setFocus()
    QTest.keyClick(window, Qt.Key.Key_Left, Qt.KeyboardModifier.AltModifier)  # the focused message
    assert shown(tab)[0] == "First question" and switch(tab) == [("1/2", False, True), ("", False, False)]
    assert tab.message_widgets()[0].body.hasFocus()  # it keeps the focus: the keys go on with it
    QTest.keyClick(window, Qt.Key.Key_Right, Qt.KeyboardModifier.AltModifier)
    assert shown(tab)[0] == "Edited question" and switch(tab)[1] == ("1/2", False, True)  # as that branch was left
    names = [window.previous_version_action.text(), window.next_version_action.text()]
    listed = {(s.keys, s.action) for s in window.show_shortcuts().shortcuts}
    assert {("Alt+Left", names[0]), ("Alt+Right", names[1])} <= listed


def test_an_edited_question_starts_a_branch_and_the_cache_serves_each_branch(
    window, engine_service, app_store, run, ui, tmp_path
):
    """Branch A's and branch B's first questions differ from their first word on, and each is longer than a
    cache page. The engine reuses the longest cached prefix of a prompt (whole pages by hash, then a partial
    page copied), so `cached_tokens` says whose tokens came back: past the template's first few, only that
    branch's own."""
    tab = window.current_tab()
    tab.set_settings(ui.greedy_settings(engine_service, 8))
    question_a = "Apples " + " ".join(f"red{i} fruit" for i in range(30))
    question_b = "Bananas " + " ".join(f"yellow{i} fruit" for i in range(30))

    def ids(messages) -> list[int]:
        return engine_service.encode_chat(messages).flatten().tolist()

    def thread() -> list[dict]:
        return [{"role": m.role, "content": m.text} for m in app_store.messages(tab.chat_id)]

    def common(a: list[int], b: list[int]) -> int:
        return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))

    async def turn(text: str) -> dict:
        assert send(tab, text)
        await ui.wait_idle(window)
        stats = app_store.messages(tab.chat_id)[-1].stats
        assert "error" not in stats and tab.notice_text() == "", (stats, tab.notice_text())
        return stats

    run(turn(question_a))
    tab.message_widgets()[0].edit_button.click()
    first_b = run(turn(question_b))
    prompt_a, prompt_b = ids([{"role": "user", "content": question_a}]), ids([{"role": "user", "content": question_b}])
    assert len(prompt_a) > PAGE_SIZE and len(prompt_b) > PAGE_SIZE and common(prompt_a, prompt_b) < PAGE_SIZE
    # a new branch: the template's first tokens at most, nothing of A's question
    assert common(prompt_a, prompt_b) <= first_b["cached_tokens"] < PAGE_SIZE
    assert shown(tab)[0] == question_b and switch(tab)[0] == ("2/2", True, False)

    tab.message_widgets()[0].versions.back_button.click()  # back to A: no model runs for a switch
    assert not tab.is_streaming and shown(tab)[0] == question_a and len(shown(tab)) == 2
    a_thread = thread()
    second_a = run(turn("And then?"))
    sent = ids([*a_thread, {"role": "user", "content": "And then?"}])
    assert second_a["prompt_tokens"] == len(sent)  # the prompt is the visible branch, A
    # A's first prompt came back whole from the cache (and its answer's tokens as far as they match)
    assert len(prompt_a) - 1 <= common(sent, prompt_a) <= second_a["cached_tokens"] < len(sent)
    assert common(sent, prompt_b) < PAGE_SIZE < second_a["cached_tokens"]  # A's, not B's

    tab.message_widgets()[0].versions.forward_button.click()  # to B, as it was left: its question and answer
    assert shown(tab)[0] == question_b and len(shown(tab)) == 2
    b_thread = thread()
    second_b = run(turn("And then?"))
    sent = ids([*b_thread, {"role": "user", "content": "And then?"}])
    assert second_b["prompt_tokens"] == len(sent)
    assert len(prompt_b) - 1 <= common(sent, prompt_b) <= second_b["cached_tokens"] < len(sent)
    assert common(sent, prompt_a) < PAGE_SIZE < second_b["cached_tokens"]

    tab.message_widgets()[0].versions.back_button.click()  # A again, with its second turn
    assert shown(tab)[:3] == [question_a, a_thread[1]["content"], "And then?"] and len(shown(tab)) == 4
    assert [m.text for m in app_store.all_messages(tab.chat_id)].count("And then?") == 2
    # Chat -> Export: Markdown writes the branch shown, JSON the whole tree
    assert window.export_chat(tab.chat_id, "markdown", tmp_path / "chat.md")
    assert window.export_chat(tab.chat_id, "json", tmp_path / "chat.json")
    markdown = (tmp_path / "chat.md").read_text(encoding="utf-8")
    assert question_a in markdown and question_b not in markdown and "(version 1 of 2)" in markdown
    tree = json.loads((tmp_path / "chat.json").read_text(encoding="utf-8"))
    assert [m["text"] for m in tree["messages"]] == [m.text for m in app_store.all_messages(tab.chat_id)]
    assert tree["visible_thread"] == [w.message_id for w in tab.message_widgets()]


def test_a_regenerate_stopped_before_its_answer_starts_shows_the_old_answer(window, engine_service, app_store, run, ui):
    tab = window.current_tab()
    tab.set_settings(ui.greedy_settings(engine_service, 4))

    async def go():
        assert send(tab, "Keep this")
        await ui.wait_idle(window)
        before = shown(tab)
        assert tab.regenerate()
        tab.stop()  # while the prompt is being built: the job never starts
        await ui.wait_idle(window)
        # the answer's widget, built when it was asked for, is deleted unshown
        await ui.wait_for(lambda: not unshown_widgets(), what="the unused answer widget's deletion")
        return before

    before = run(go())
    assert shown(tab) == before and len(app_store.all_messages(tab.chat_id)) == 2


def test_a_chat_written_before_versions_shows_as_it_was(data_dir, engine_service, run, ui):
    class StoreV2(Store):
        migrations = MIGRATIONS[:2]

    path = data_dir / "tandem.sqlite3"
    with StoreV2(path) as v2:
        chat = v2.create_chat("Old chat", settings={"json_mode": True})
        for i in range(3):
            v2.add_message(chat.id, "user", f"question {i}")
            v2.add_message(chat.id, "assistant", f"answer **{i}**", stats={"new_tokens": 3, "cached_tokens": 0})
        texts = [m.text for m in v2.messages(chat.id)]
    store = Store(path)
    window = ui.open_window(store, engine_service)
    try:
        tab = window.open_chat(chat.id)
        assert shown(tab) == texts and all(s == ("", False, False) for s in switch(tab))
        assert tab.json_mode and [w.role for w in tab.message_widgets()] == ["user", "assistant"] * 3
    finally:
        run(ui.close_window(window))
        store.close()
