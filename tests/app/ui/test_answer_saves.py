"""A full disk while an answer streams and ends (app/ui/answer_saves.py), on the real engine and a real store.

The fault comes through the store's own seam: its `update_message` raises the StoreError SQLite's "database
or disk is full" becomes (app/store/db.py), for as long as the test keeps the disk full.

Bad inputs tried: every save of an answer refused until the disk has room again (the answer stays on screen,
the tab says so, the save is retried and lands complete), the room coming back just before the user's next
send (that send saves the earlier answer first), the user's own message refused (not sent, kept in the box).
"""

from __future__ import annotations

from app.store import StoreError
from app.ui.chat_tab import ChatTab

NUM_TOKENS = 24


class FullDisk:
    """Makes `store.update_message` (or another write) fail as a full disk does, until `full` is cleared."""

    def __init__(self, store, monkeypatch, method: str = "update_message"):
        self.full = True
        self.refused = 0
        real = getattr(store, method)

        def write(*args, **kwargs):
            if self.full:
                self.refused += 1
                raise StoreError(
                    f"could not save to {store.path}: database or disk is full. Nothing of this change was written."
                )
            return real(*args, **kwargs)

        monkeypatch.setattr(store, method, write)


def answer(store, chat_id: int):
    return [m for m in store.messages(chat_id) if m.role == "assistant"][-1]


def test_an_answer_the_disk_refuses_stays_and_is_saved_once_there_is_room(
    window, engine_service, app_store, run, ui, monkeypatch
):
    monkeypatch.setattr(ChatTab, "save_retry_ms", 100)
    tab = window.new_chat()
    tab.set_settings(ui.greedy_settings(engine_service, NUM_TOKENS))
    disk = FullDisk(app_store, monkeypatch)

    async def go():
        tab.input.setPlainText("Count to ten")
        assert tab.send()
        await ui.wait_idle(window)  # a failed final save must not leave the tab answering forever
        shown = tab.message_widgets()[-1].text
        assert shown and not tab.is_streaming
        assert "Could not save this answer" in tab.notice_text() and "database or disk is full" in tab.notice_text()
        assert "tries again" in tab.notice_text()
        assert "disk is full" in tab.save_error
        stored = answer(app_store, tab.chat_id)
        assert stored.text == "" and not stored.complete  # nothing reached the database yet
        refused = disk.refused
        await ui.wait_for(lambda: disk.refused >= refused + 2, 10, "the save to be retried")
        disk.full = False
        await ui.wait_for(lambda: tab.save_error is None, 10, "the retried save to land")
        return shown

    shown = run(go())
    stored = answer(app_store, tab.chat_id)
    assert stored.text == shown and stored.complete
    assert stored.stats["new_tokens"] == NUM_TOKENS and stored.stats["eos_reason"] == "max_new_tokens"
    assert tab.notice_text() == ""  # the failure notice goes once the answer is saved
    assert tab.message_widgets()[-1].text == shown


def test_the_next_send_saves_an_answer_the_disk_refused_first(window, engine_service, app_store, run, ui, monkeypatch):
    monkeypatch.setattr(ChatTab, "save_retry_ms", 600_000)  # only the user's next action retries here
    tab = window.new_chat()
    tab.set_settings(ui.greedy_settings(engine_service, NUM_TOKENS))
    disk = FullDisk(app_store, monkeypatch)

    async def go():
        tab.input.setPlainText("First question")
        assert tab.send()
        await ui.wait_idle(window)
        first = answer(app_store, tab.chat_id)
        assert tab.save_error and not first.complete
        disk.full = False
        tab.input.setPlainText("Second question")
        assert tab.send()
        saved = next(m for m in app_store.messages(tab.chat_id) if m.id == first.id)
        assert tab.save_error is None and saved.complete and saved.text == tab.message_widgets()[1].text
        await ui.wait_idle(window)

    run(go())
    roles = [(m.role, m.complete) for m in app_store.messages(tab.chat_id)]
    assert roles == [("user", True), ("assistant", True), ("user", True), ("assistant", True)]


def test_a_message_the_disk_refuses_is_not_sent_and_stays_in_the_box(window, app_store, monkeypatch):
    tab = window.new_chat()
    FullDisk(app_store, monkeypatch, "add_message")
    tab.input.setPlainText("Hello there")
    assert not tab.send()
    assert not tab.is_streaming
    assert "Not sent" in tab.notice_text() and "disk is full" in tab.notice_text()
    assert tab.input.toPlainText() == "Hello there"
    assert app_store.messages(tab.chat_id) == []


def test_an_answer_the_disk_refuses_to_start_is_cancelled_and_explained(
    window, engine_service, app_store, run, ui, monkeypatch
):
    tab = window.new_chat()
    tab.set_settings(ui.greedy_settings(engine_service, NUM_TOKENS))
    real_add = app_store.add_message

    def add_message(chat_id, role, text, **kwargs):
        if role == "assistant":
            raise StoreError(f"could not save to {app_store.path}: database or disk is full.")
        return real_add(chat_id, role, text, **kwargs)

    monkeypatch.setattr(app_store, "add_message", add_message)
    jobs = []
    local = engine_service.local_backend  # every local answer's job is started by its _start
    real_start = local._start
    monkeypatch.setattr(local, "_start", lambda *a, **k: jobs.append(real_start(*a, **k)) or jobs[-1])

    async def go():
        tab.input.setPlainText("Hello")
        assert tab.send()  # the user's message is saved; the answer's row is not
        await ui.wait_idle(window)
        await ui.wait_for(lambda: jobs and jobs[0].cancelled, 10, "the unsaved answer's job to be cancelled")

    run(go())
    assert "Could not start the answer" in tab.notice_text() and "disk is full" in tab.notice_text()
    assert [m.role for m in app_store.messages(tab.chat_id)] == ["user"]
