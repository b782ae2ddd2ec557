"""The sidebar: saved chats newest first, search over titles and message text, open, delete (asked), export.

Bad inputs tried: a search that matches nothing, a search differing only in case, Cancel on the delete
question, an export into a folder that does not exist, an unknown export format.
"""

from __future__ import annotations

import asyncio
import json

from PySide6.QtWidgets import QMessageBox

from app.ui.sidebar import when


def make_chats(store):
    fox = store.create_chat("Foxes")
    store.add_message(fox.id, "user", "Tell me about foxes")
    cooking = store.create_chat("Cooking")
    store.add_message(cooking.id, "user", "How long do I boil an egg?")
    store.add_message(cooking.id, "assistant", "About nine minutes. A fox would eat it raw.")
    empty = store.create_chat("Empty one")
    return fox, cooking, empty


def test_lists_newest_first_and_searches_titles_and_text(window, app_store, run, ui):
    fox, cooking, empty = make_chats(app_store)
    sidebar = window.sidebar
    sidebar.refresh()
    expected = [c.id for c in app_store.list_chats() if c.kind == "chat"]
    assert sidebar.chat_ids() == expected
    assert sidebar.chat_ids()[:3] == [empty.id, cooking.id, fox.id]  # newest first
    app_store.add_message(fox.id, "user", "More foxes")  # touching a chat moves it up
    sidebar.refresh()
    assert sidebar.chat_ids()[0] == fox.id

    async def search(text):
        sidebar.search_edit.setText(text)
        # the search runs on a worker: wait for the typing pause, then for its results
        await ui.wait_for(lambda: not sidebar._search_timer.isActive() and not sidebar.searching, what="the search")

    run(search("FOX"))  # title "Foxes" and the cooking answer's text
    assert set(sidebar.chat_ids()) == {fox.id, cooking.id}
    run(search("egg"))
    assert sidebar.chat_ids() == [cooking.id]
    run(search("no such words"))
    assert sidebar.chat_ids() == []
    run(search(""))
    assert set(sidebar.chat_ids()) >= {fox.id, cooking.id, empty.id}


def test_search_shows_each_match_in_context_and_only_the_latest_search(window, app_store, run, ui):
    fox, cooking, _ = make_chats(app_store)
    sidebar = window.sidebar

    async def search(text):
        sidebar.search_edit.setText(text)
        await ui.wait_for(lambda: not sidebar._search_timer.isActive() and not sidebar.searching, what="the search")

    run(search("nine min"))
    assert sidebar.chat_ids() == [cooking.id]
    lines = sidebar.list.item(0).text().split("\n")
    assert lines[0] == "Cooking" and "About nine minutes" in lines[1]  # the title, then the match in context
    assert sidebar.search_status.isHidden()
    run(search("Foxes"))  # the title alone matches (and "foxes" in its message): the newest message's snippet
    assert sidebar.chat_ids() == [fox.id] and "foxes" in sidebar.list.item(0).text().split("\n")[1]
    sidebar.search_edit.setText("boil")
    sidebar.refresh()  # started, then replaced before its results came: only the last search is listed
    sidebar.search_edit.setText("no such words")
    run(search("no such words"))
    assert sidebar.chat_ids() == [] and sidebar.search_status.text() == "No chat matches."


def test_open_from_the_sidebar(window, app_store):
    fox, cooking, _ = make_chats(app_store)
    window.sidebar.refresh()
    window.sidebar.select(cooking.id)
    window.sidebar.open_button.click()
    tab = window.current_tab()
    assert tab.chat_id == cooking.id
    assert [w.text for w in tab.message_widgets()] == [
        "How long do I boil an egg?",
        "About nine minutes. A fox would eat it raw.",
    ]
    count = window.tabs.count()
    window.sidebar.open_requested.emit(cooking.id)  # already open: switches, no second tab
    assert window.tabs.count() == count


def test_delete_asks_first(window, app_store, run, ui):
    fox, cooking, _ = make_chats(app_store)
    window.open_chat(cooking.id)
    window.sidebar.refresh()
    window.sidebar.select(cooking.id)

    async def go():
        box = window.ask_delete_chat(cooking.id)
        assert isinstance(box, QMessageBox) and "Cooking" in box.text()
        box.button(QMessageBox.StandardButton.Cancel).click()
        await ui.wait_for(lambda: not box.isVisible(), what="the question to close")
        await asyncio.sleep(0.05)
        assert app_store.get_chat(cooking.id).title == "Cooking" and window.tab_for(cooking.id) is not None

        window.sidebar.select(cooking.id)
        window.sidebar.delete_button.click()  # the same question, via the sidebar
        box = next(b for b in window.findChildren(QMessageBox) if b.isVisible())
        box.button(QMessageBox.StandardButton.Yes).click()
        await ui.wait_for(lambda: cooking.id not in window.sidebar.chat_ids(), what="the chat to go")

    run(go())
    assert cooking.id not in [c.id for c in app_store.list_chats()]
    assert window.tab_for(cooking.id) is None
    assert fox.id in window.sidebar.chat_ids()


def test_export_markdown_and_json(window, app_store, tmp_path):
    _, cooking, _ = make_chats(app_store)
    md = tmp_path / "chat.md"
    assert window.export_chat(cooking.id, "markdown", md)
    assert md.read_text(encoding="utf-8") == app_store.export.markdown(cooking.id)
    assert "About nine minutes" in md.read_text(encoding="utf-8")
    js = tmp_path / "chat.json"
    assert window.export_chat(cooking.id, "json", js)
    assert json.loads(js.read_text(encoding="utf-8")) == json.loads(json.dumps(app_store.export.json(cooking.id)))

    assert not window.export_chat(cooking.id, "json", tmp_path / "missing" / "chat.json")
    assert "Could not export" in window.error_label.text() and "missing" in window.error_label.text()
    assert not window.export_chat(cooking.id, "pdf", tmp_path / "chat.pdf")
    assert "unknown export format" in window.error_label.text()


def test_when():
    now = 1_000_000.0
    assert when(now - 5, now) == "just now"
    assert when(now - 300, now) == "5 min ago"
    assert when(now - 7200, now) == "2 h ago"
    assert when(now - 90000, now) == "yesterday"
