"""The window around the tabs: status bar (model, load progress, load errors), menus, state between runs.

Bad inputs tried: loading a model folder that does not exist (the message shows, the tiny model stays
loaded and usable), reopening with a saved tab whose chat was deleted meanwhile, sending before any
model is loaded.
"""

from __future__ import annotations

from app.service import EngineService
from app.ui.main_window import CURRENT_TAB_KEY, OPEN_TABS_KEY, MainWindow


def test_status_bar_shows_the_model_and_a_failed_load(window, engine_service, run, ui, tmp_path):
    context = engine_service.context_length
    assert window.model_label.text() == f"Model: tiny · context {context} tokens · full-precision cache"
    assert not window.load_progress.isVisible()

    async def go():
        engine_service.load_model(tmp_path / "missing-model")
        assert not await engine_service.wait_loaded()

    run(go())
    assert "missing-model" in window.error_label.text() and "Could not load" in window.error_label.text()
    assert window.model_label.text().startswith("Model: tiny")
    assert not window.load_progress.isVisible()

    tab = window.current_tab()
    tab.set_settings(ui.greedy_settings(engine_service, 3))

    async def still_works():
        tab.input.setPlainText("Still there?")
        assert tab.send()
        await ui.wait_idle(window)

    run(still_works())
    assert tab.message_widgets()[-1].text


def test_a_window_without_a_model_refuses_to_send(app_store, run, ui):
    async def go():
        service = EngineService()
        window = ui.open_window(app_store, service)
        try:
            assert window.model_label.text() == "No model"
            tab = window.current_tab()
            tab.input.setPlainText("hello")
            assert not tab.send()
            assert "No model is loaded" in tab.notice_text()
            assert app_store.messages(tab.chat_id) == []
            assert tab.context_meter.format() == "context: no model loaded"
            window.send_prompt("later")  # kept until a model loads
            assert window._pending_prompt == "later"
        finally:
            await ui.close_window(window)
            await service.close()

    run(go())


def test_menus_open_the_compare_view_and_the_model_manager(window, run):
    titles = {a.text() for a in window.actions()}
    assert {"New chat", "Close chat", "Stop answer", "Open model file or folder…"} <= titles
    assert {"Compare settings side by side…", "Model manager…"} <= titles
    window.show_compare_view()
    window.show_model_manager()
    from app.ui.compare_view import CompareView
    from app.ui.model_manager import ModelManager

    assert isinstance(window._compare_view, CompareView) and window._compare_view.isVisible()
    assert isinstance(window._model_manager, ModelManager) and window._model_manager.isVisible()
    window.show_compare_view()  # a second time: the same window, raised
    assert len(window.findChildren(CompareView)) == 1


def test_open_tabs_and_the_current_one_come_back(app_store, engine_service, run, ui):
    first = ui.open_window(app_store, engine_service)
    a = first.current_tab().chat_id
    app_store.add_message(a, "user", "keep A")
    b = first.new_chat().chat_id
    app_store.add_message(b, "user", "keep B")
    c = first.new_chat().chat_id
    app_store.add_message(c, "user", "keep C")
    first.tabs.setCurrentIndex(1)
    assert app_store.get_setting(OPEN_TABS_KEY) == [a, b, c]
    assert app_store.get_setting(CURRENT_TAB_KEY) == b
    run(ui.close_window(first))
    app_store.delete_chat(c)  # gone meanwhile: skipped on reopen

    second = MainWindow(app_store, engine_service)
    try:
        assert [t.chat_id for t in second.chat_tabs()] == [a, b]
        assert second.current_tab().chat_id == b
        assert second.sampler_panel.settings() == second.current_tab().settings()
    finally:
        run(ui.close_window(second))


def test_the_compare_window_opens_whole_on_a_small_screen(window):
    # It asked for 1200 x 700 whatever the screen; offscreen the screen is 800 px wide
    window.show_compare_view()
    room = window.screen().availableGeometry()
    view = window._compare_view
    assert view.width() <= room.width() and view.height() <= room.height()
    view.close()
