"""The Server window, from the main window's Server menu, on the real engine (tiny model) and a real server.

The openai client runs on a worker thread so the window's loop keeps running: the request log reaches the
panel through a queued Qt signal.
"""

from __future__ import annotations

import asyncio
import socket

import keyring
import openai
import pytest
from keyring.backends import null
from PySide6.QtGui import QGuiApplication

USER = [{"role": "user", "content": "Hello there"}]


@pytest.fixture(autouse=True)
def no_keyring():
    """No OS keyring: nothing a test does reaches the user's real one."""
    before = keyring.get_keyring()
    keyring.set_keyring(null.Keyring())
    yield
    keyring.set_keyring(before)


async def press(button) -> None:
    button.click()  # inside the running loop, as in the app


def open_panel(window):
    menu = next(a.menu() for a in window.menuBar().actions() if a.text() == "&Server")
    next(a for a in menu.actions() if a.text() == "Local server…").trigger()
    return window._server_panel


def test_start_from_the_panel_answer_a_request_log_it_and_stop(window, engine_service, run, ui):
    panel = open_panel(window)
    assert panel.isVisible() and panel.state_label.text() == "Stopped" and not panel.stop_button.isEnabled()
    assert window.chat_tabs() and not any(t.is_streaming for t in window.chat_tabs())  # a chat, idle

    panel.port_box.setValue(0)  # any free port
    run(press(panel.start_button))
    run(ui.wait_for(lambda: window.app_server.is_running and panel.stop_button.isEnabled(), what="the server"))
    url = panel.url_field.text()
    assert url == window.app_server.url and url.startswith("http://127.0.0.1:")
    assert panel.state_label.text() == f"Running · {engine_service.model_name}"
    panel.copy_button.click()
    assert QGuiApplication.clipboard().text() == url

    def ask():
        c = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=60)
        return c.chat.completions.create(model=engine_service.model_name, messages=USER, max_tokens=6)

    reply = run(asyncio.to_thread(ask))
    assert reply.model == engine_service.model_name and reply.usage.completion_tokens > 0
    run(ui.wait_for(lambda: panel.log_list.count() >= 1, what="the log line"))
    line = panel.log_list.item(panel.log_list.count() - 1).text()
    assert "POST /v1/chat/completions  200" in line
    assert f"{reply.usage.prompt_tokens}+{reply.usage.completion_tokens} tokens" in line

    run(press(panel.stop_button))
    run(ui.wait_for(lambda: not window.app_server.is_running and panel.start_button.isEnabled(), what="stop"))
    assert panel.state_label.text() == "Stopped" and panel.url_field.text() == ""
    with pytest.raises(openai.APIConnectionError):
        openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=5).models.list()


def test_a_port_in_use_shows_the_message(window, run, ui):
    panel = open_panel(window)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        port = taken.getsockname()[1]
        panel.port_box.setValue(port)
        run(press(panel.start_button))
        run(ui.wait_for(lambda: panel.message.text() != "", what="the message"))
        assert f"Port {port} is in use" in panel.message.text()
        assert not window.app_server.is_running and panel.start_button.isEnabled()
        assert panel.state_label.text() == "Stopped"
    finally:
        taken.close()


def test_closing_the_window_stops_the_server(app_store, engine_service, run, ui):
    win = ui.open_window(app_store, engine_service)
    url = run(win.app_server.start(port=0))
    run(ui.close_window(win))
    with pytest.raises(openai.APIConnectionError):
        openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=5).models.list()
    assert app_store.get_setting("server.running") is True  # so the next start of the app serves again
