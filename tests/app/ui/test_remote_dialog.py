"""Chatting through a remote server from the window and from the command line (app/ui/remote_dialog.py,
app/ui/backend_switch.py, app/service/remote_endpoints.py, `tandem --remote`).

A real `python -m engine serve` server (the tiny model, float32, behind an API key) in a thread of this
process. Tried: the dialog listing the server's models, a wrong key and a closed port answered in the
dialog, "Use this server" switching open tabs and new ones, a greedy answer through the remote equal to the
server's own reply, the endpoint and key remembered (keyring or settings), a local model load switching back,
`tandem --remote URL --prompt ... --quit-after-answer` printing the remote answer, and a closed port there
ending with exit 1 and the reason, and a remote chat longer than the server's context kept answering under
truncate-middle with the divider where the model's view begins.
"""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path

import openai
import pytest
import torch

from app.main import main
from app.service.remote_endpoints import SETTING_KEY, Endpoint, saved_endpoint
from app.ui.context_divider import DIVIDER_TEXT
from app.ui.remote_dialog import RemoteDialog, use_remote
from engine.chat.request import ChatRequest
from engine.models import Model
from engine.server.app import ServerOptions
from engine.server.served import ServedModel

_spec = importlib.util.spec_from_file_location(
    "remote_service_tests", Path(__file__).resolve().parents[1] / "service" / "test_remote.py"
)
_remote_tests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_remote_tests)
running = _remote_tests.running

KEY = "remote-test-key"


@pytest.fixture(scope="module")
def server(tiny_folder):
    """(base URL, served): the tiny model as 'tiny-remote' behind KEY."""
    served = ServedModel(Model.load(tiny_folder, dtype=torch.float32), "tiny-remote", context=512, max_concurrent=2)
    with running(served, ServerOptions(api_key=KEY)) as url:
        yield url, served


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"


def test_the_dialog_lists_models_and_says_what_is_wrong(server, window, run):
    url, _ = server
    dialog = RemoteDialog(window, Endpoint(url))
    assert run(dialog.list_models()) == []  # no key yet
    assert "refused the API key (401)" in dialog.status.text()
    dialog.key.setText(KEY)
    assert run(dialog.list_models()) == ["tiny-remote"]
    assert dialog.models.currentText() == "tiny-remote" and "1 model" in dialog.status.text()
    assert dialog.endpoint() == Endpoint(url, KEY, "tiny-remote", False)
    dialog.url.setText(closed_port_url())
    assert run(dialog.list_models()) == [] and dialog.status.text()
    dialog.url.setText("ftp://example.org")
    assert run(dialog.list_models()) == [] and "http" in dialog.status.text()
    dialog.deleteLater()


def test_a_chat_answers_through_the_server_and_a_local_load_switches_back(server, window, run, ui, engine_service):
    url, _ = server
    tab = window.current_tab()
    assert run(use_remote(window, Endpoint(url, KEY)))
    assert window.backends.remote is not None and tab.backend is window.backends.current
    assert window.model_label.text().startswith("Remote: tiny-remote at 127.0.0.1")
    assert saved_endpoint(window.store) == Endpoint(url, KEY, None, False)  # the key: keyring or the setting
    saved = window.store.get_setting(SETTING_KEY)
    assert saved["url"] == url and ("api_key" not in saved or saved["api_key"] == KEY)

    settings = ui.greedy_settings(engine_service, 8)
    tab.set_settings(settings)
    tab.input.setPlainText("Hello over the network")

    async def send() -> bool:
        sent = tab.send()
        await ui.wait_idle(window)
        return sent

    assert run(send())
    answer = window.store.messages(tab.chat_id)[-1]
    assert answer.role == "assistant" and answer.complete and answer.text
    # the same request straight to the server (top_k 1 goes as temperature 0) gives the same text
    system = [{"role": "system", "content": tab.chat.system_prompt}] if tab.chat.system_prompt else []
    direct = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0).chat.completions.create(
        model="tiny-remote",
        messages=[*system, {"role": "user", "content": "Hello over the network"}],
        temperature=0,
        max_tokens=8,
        seed=7,
    )
    assert answer.text == direct.choices[0].message.content

    new_tab = window.new_chat()
    assert new_tab.backend is window.backends.current  # tabs opened later chat through it too
    window._model_loaded("tiny")  # as when the model manager loads a local model
    assert window.backends.remote is None and tab.backend is engine_service and new_tab.backend is engine_service


def test_a_remote_chat_past_the_servers_context_keeps_answering(server, window, run, ui, engine_service):
    url, served = server
    tab = window.current_tab()
    assert run(use_remote(window, Endpoint(url, KEY)))
    tab.set_settings(ui.greedy_settings(engine_service, 16))
    tab.set_overflow("truncate-middle")
    question = "Tell me about apples and pears number {}, and then about plums and cherries too, at length please."

    async def ask(text: str) -> str:
        tab.input.setPlainText(text)
        assert tab.send(), tab.notice_text()
        await ui.wait_idle(window)
        return tab.notice_text()

    turns = 10
    for t in range(turns):
        assert not run(ask(question.format(t)))
    messages = window.store.messages(tab.chat_id)
    assert len(messages) == 2 * turns and all(m.complete and m.text for m in messages if m.role == "assistant")
    everything = ChatRequest([{"role": m.role, "content": m.text} for m in messages], tab.chat.system_prompt)
    assert served.chat.prompt_ids(everything).shape[1] > served.chat.context_length  # all of it would be refused
    divider = tab.view.divider
    assert divider is not None and divider.isVisible() and divider.label.text() == DIVIDER_TEXT
    ids = [m.id for m in messages]
    first_seen = tab.view.divider_before()
    assert first_seen in ids and ids.index(first_seen) >= 2  # the first exchange is still seen


def test_tandem_remote_prints_the_servers_answer(server, qapp, tmp_path, monkeypatch, capsys):
    url, served = server
    monkeypatch.setenv("TANDEM_DATA_DIR", str(tmp_path / "data"))
    argv = ["--remote", url, "--api-key", KEY, "--prompt", "Hello", "--quit-after-answer"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.strip() and served.in_flight == 0


def test_tandem_remote_to_a_closed_port_ends_with_the_reason(qapp, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TANDEM_DATA_DIR", str(tmp_path / "data"))
    url = closed_port_url()
    assert main(["--remote", url, "--prompt", "Hello", "--quit-after-answer"]) == 1
    err = capsys.readouterr().err
    assert "Could not use the server" in err and "127.0.0.1" in err


def test_remote_flags_need_each_other(capsys):
    with pytest.raises(SystemExit):
        main(["--remote-model", "x", "--prompt", "hi"])
    with pytest.raises(SystemExit):
        main(["--remote", "http://h/v1", "--model", "starter"])
    assert "--remote" in capsys.readouterr().err


def test_the_model_manager_offers_a_remote_server(server, window, run):
    url, _ = server
    window.store.set_setting(SETTING_KEY, {"url": url, "model": "tiny-remote", "sees_images": True})
    window.show_model_manager()
    window._model_manager.remote_button.click()
    dialogs = [d for d in window.findChildren(RemoteDialog) if d.isVisible()]
    assert len(dialogs) == 1  # the saved endpoint filled in
    dialog = dialogs[0]
    assert dialog.url.text() == url and dialog.models.currentText() == "tiny-remote" and dialog.sees_images.isChecked()
    dialog.reject()
    window._model_manager.close()
