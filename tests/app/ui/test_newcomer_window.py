"""What a newcomer tripped over in the real window (tiny model, a real store): a draft lost on quit, pictures left
out without a word, file dialogs' keys in the shortcuts list, a stale window title, the compare window's width
and Esc, the sampler panel that could not be hidden, the Help menu's About.

Bad inputs tried: a draft whose image file was deleted while the app was closed (the text comes back, the notice
names the image), closing the tab of a new chat that holds only a draft (kept, not discarded).
"""

from __future__ import annotations

import shiboken6
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QFileDialog

from app.service.catalog import models_dir
from app.ui.about_dialog import AboutDialog, app_version
from app.ui.main_window import SAMPLER_PANEL_KEY


def _sent(tab, text: str) -> bool:
    tab.input.setPlainText(text)
    return tab.send()


def test_a_draft_and_its_picture_survive_a_restart(window, app_store, engine_service, shapes_png, run, ui):
    tab = window.current_tab()
    chat_id = tab.chat_id

    async def attach():  # checked on a worker, as a dropped file is
        await tab.attach_files([str(shapes_png)])

    run(attach())
    QTest.keyClicks(tab.input, "What is left of the square?")
    run(ui.wait_for(lambda: app_store.draft(chat_id) is not None, what="the draft saved while typing"))
    assert app_store.draft(chat_id).text == "What is left of the square?"  # before any quit: a crash keeps it
    run(ui.close_window(window))  # Ctrl+Q

    again = ui.open_window(app_store, engine_service)
    try:
        restored = again.current_tab()
        assert restored.chat_id == chat_id and restored.input.toPlainText() == "What is left of the square?"
        run(ui.wait_for(lambda: len(restored.strip.attachments()) == 1, what="the draft's picture"))
        assert restored.strip.attachments()[0].name == "shapes.png"
        restored.set_settings(ui.greedy_settings(engine_service, 2))
        restored.strip.clear()  # the tiny model sees no images: the text goes alone

        async def send():
            assert _sent(restored, "What is left of the square?")
            await ui.wait_idle(again)

        run(send())
        assert app_store.draft(chat_id) is None  # sent: no draft any more
        assert restored.input.toPlainText() == ""
    finally:
        run(ui.close_window(again))


def test_a_draft_whose_picture_is_gone_comes_back_as_text(window, app_store, engine_service, shapes_png, run, ui):
    chat = app_store.create_chat("Drafting")
    sha = app_store.add_attachment(shapes_png.read_bytes(), "png")
    app_store.save_draft(chat.id, "Look at this", [(sha, "shapes.png")])
    app_store.attachment_path(sha).unlink()  # removed by hand while Tandem was closed
    tab = window.open_chat(chat.id)
    assert tab.input.toPlainText() == "Look at this"
    run(ui.wait_for(lambda: tab._num_attaching == 0, what="the image check"))
    assert tab.strip.attachments() == [] and tab.notice_text()  # said, not silently dropped


def test_closing_a_new_chat_that_holds_only_a_draft_keeps_it(window, app_store, run, ui):
    tab = window.new_chat()
    tab.input.setPlainText("an idea for later")
    chat_id = tab.chat_id

    async def close():  # Ctrl+W: the tab's answer (none) is stopped on the loop
        window.close_tab(window.tabs.indexOf(tab))
        await ui.wait_for(lambda: window.tab_for(chat_id) is None and not shiboken6.isValid(tab), what="the close")

    run(close())
    assert chat_id in [c.id for c in app_store.list_chats()] and app_store.draft(chat_id).text == "an idea for later"
    reopened = window.open_chat(chat_id)
    assert reopened.input.toPlainText() == "an idea for later"


def test_pictures_a_text_model_cannot_see_are_named_with_an_offer(
    window, app_store, engine_service, shapes_png, run, ui
):
    chat = app_store.create_chat("From a vision model", settings=ui.greedy_settings(engine_service, 2))
    sha = app_store.add_attachment(shapes_png.read_bytes(), "png")
    app_store.add_message(chat.id, "user", "What is this?", images=[sha])
    app_store.add_message(chat.id, "assistant", "A red circle and a blue square.")
    tab = window.open_chat(chat.id)
    assert not engine_service.can_see_images

    async def go():
        assert _sent(tab, "And which is bigger?")
        await ui.wait_idle(window)

    run(go())
    assert "cannot see the 1 image in this conversation; it was left out" in tab.notice_text()
    assert tab.notice_button.isVisible() and tab.notice_button.text() == "Load a vision model…"
    assert app_store.messages(chat.id)[-1].role == "assistant"  # answered from the text, not refused
    tab.notice_button.click()
    assert window._model_manager is not None and window._model_manager.isVisible()
    assert tab.notice_text() == ""
    window._model_manager.close()


def test_the_shortcuts_list_holds_no_file_dialog_keys(window, qtbot):
    window.ask_open_model()  # Model -> Open…: Qt's own file dialog, with its unnamed actions
    dialogs = window.findChildren(QFileDialog)
    assert dialogs
    for dialog in dialogs:
        dialog.reject()
    shortcuts = window.show_shortcuts()
    rows = shortcuts.rows()
    assert all(keys and action for keys, action, _place in rows)
    assert not [r for r in rows if r[0] in ("Ctrl+Shift+H", "Ctrl+Up")]
    assert len({(keys, action) for keys, action, _ in rows}) == len(rows)
    shortcuts.close()


def test_the_window_title_follows_the_chat_naming_itself(window, engine_service, run, ui):
    tab = window.current_tab()
    tab.set_settings(ui.greedy_settings(engine_service, 2))
    assert window.windowTitle() == "New chat — Tandem"

    async def go():
        assert _sent(tab, "Plan a picnic")
        await ui.wait_idle(window)

    run(go())
    assert window.windowTitle() == "Plan a picnic — Tandem"
    other = window.new_chat()
    other.rename("Elsewhere")  # a chat in the background renamed: the title stays with the one shown
    window.tabs.setCurrentWidget(tab)
    window.rename_chat(other.chat_id, "Still elsewhere")
    assert window.windowTitle() == "Plan a picnic — Tandem"


def test_the_sampler_panel_hides_and_stays_hidden(window, app_store, engine_service, qtbot, run, ui):
    assert window.sampler_panel.isVisible() and window.sampler_panel_action.isChecked()
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=5000)
    keys = Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier
    qtbot.keyClick(window.current_tab().input, Qt.Key.Key_S, keys)
    assert not window.sampler_panel.isVisible() and not window.sampler_panel_action.isChecked()
    assert app_store.get_setting(SAMPLER_PANEL_KEY) is False
    run(ui.close_window(window))
    again = ui.open_window(app_store, engine_service)
    try:
        assert not again.sampler_panel.isVisible()
        again.sampler_panel_action.trigger()  # View -> Sampler settings panel
        assert again.sampler_panel.isVisible() and again.sampler_panel.width() > 100
    finally:
        run(ui.close_window(again))


def test_help_has_about_and_the_docs(window, app_store):
    help_menu = next(a.menu() for a in window.menuBar().actions() if a.text() == "&Help")
    texts = [a.text() for a in help_menu.actions()]
    assert texts == ["Keyboard shortcuts", "Documentation", "About Tandem"]
    next(a for a in help_menu.actions() if a.text() == "About Tandem").trigger()
    about = window.findChild(AboutDialog)
    assert about is not None and about.isVisible()
    text = about.text()
    for part in (app_version(), str(models_dir()), str(app_store.data_dir), "Apache-2.0", "README.md"):
        assert part in text, part
    assert window.docs_action.isEnabled()
    about.close()


def test_the_compare_window_fits_the_screen_and_esc_closes_it(window, qtbot):
    window.show_compare_view()
    view = window._compare_view
    qtbot.waitExposed(view)
    room = view.screen().availableGeometry()
    assert view.width() <= room.width()
    view.activateWindow()
    qtbot.waitUntil(view.isActiveWindow, timeout=5000)
    area = view.columns_area
    # every column in view: no scroll bar hides the third behind it
    qtbot.waitUntil(lambda: not area.horizontalScrollBar().isVisible(), timeout=5000)
    for column in view.columns:
        right = column.mapTo(area.viewport(), column.rect().topRight()).x()
        assert column.isVisible() and right <= area.viewport().width()
    qtbot.keyClick(view.prompt_edit, Qt.Key.Key_Escape)
    assert not view.isVisible()
    assert window.isVisible()  # Esc closed the compare window only


def test_an_answer_cut_at_its_limit_is_marked_and_continue_writes_on_in_it(window, engine_service, app_store, run, ui):
    tab = window.current_tab()
    tab.set_settings(ui.greedy_settings(engine_service, 8))  # no end-of-turn token: the limit cuts it

    async def ask():
        assert _sent(tab, "Count with me")
        await ui.wait_idle(window)

    run(ask())
    (cut,) = [m for m in app_store.messages(tab.chat_id) if m.role == "assistant"]
    widget = tab.message_widgets()[-1]
    assert cut.stats["eos_reason"] == "max_new_tokens" and "stopped at the answer limit" in widget.stats_label.text()
    assert widget.continue_button.isVisible() and widget.regenerate_button.isVisible()
    assert not tab.message_widgets()[0].continue_button.isVisible()

    async def go_on():
        widget.continue_button.click()
        assert tab.is_streaming and not widget.continue_button.isVisible()
        await ui.wait_idle(window)

    run(go_on())
    messages = app_store.messages(tab.chat_id)
    assert [m.role for m in messages] == ["user", "assistant"] and messages[1].id == cut.id  # the same answer
    longer = messages[1]
    assert longer.text.startswith(cut.text) and len(longer.text) > len(cut.text)
    assert longer.stats["new_tokens"] == 16 and longer.complete
    assert tab.message_widgets()[-1] is widget and widget.text == longer.text
    # the prompt was the chat plus the answer so far as the assistant's unfinished turn
    hello = [{"role": "user", "content": "Count with me"}]
    unfinished = [*hello, {"role": "assistant", "content": cut.text}]
    assert longer.stats["prompt_tokens"] == engine_service.count_tokens(unfinished) > engine_service.count_tokens(hello)
    assert widget.continue_button.isVisible()  # cut at the limit again: it can go on again
