"""The `tandem` entry point: opens the window with a model, reopens saved chats, survives SIGKILL mid-stream,
sends --prompt in a chat of its own.

Bad inputs tried: --model pointing at nothing (usage error, exit status 2), SIGKILL while an answer streams,
--prompt while the chat open last is in JSON mode with its own settings and history.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from app.main import main
from app.service.generation import complete_settings
from app.store import Store
from app.ui.main_window import CURRENT_TAB_KEY, OPEN_TABS_KEY, MainWindow

REPO = Path(__file__).resolve().parents[2]


def run_main_until(argv: list[str], inspect, timeout: float = 60.0, ready=None) -> tuple[int, dict]:
    """Run `main(argv)` in this process; once `ready(window)` (default: the window shows a loaded model),
    `inspect(window)` fills a dict, then the window closes and the app quits.

    The default waits for the status bar, not just `service.is_loaded`: the service flips that flag on its
    loading thread a moment before the window handles the `model_loaded` signal (a CI run caught the gap)."""
    ready = ready or (lambda w: w.service.is_loaded and w.model_label.text().startswith("Model:"))
    seen: dict = {}
    deadline = time.monotonic() + timeout

    def check():
        windows = [w for w in QApplication.topLevelWidgets() if isinstance(w, MainWindow) and w.isVisible()]
        if windows and ready(windows[0]):
            seen.update(inspect(windows[0]))
            windows[0].close()
            QApplication.quit()
        elif time.monotonic() > deadline:
            seen["timed_out"] = True
            QApplication.quit()
        else:
            QTimer.singleShot(50, check)

    QTimer.singleShot(50, check)
    return main(argv), seen


def test_main_opens_a_titled_window_with_the_model(qapp, tiny_folder, tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_DATA_DIR", str(tmp_path))
    status, seen = run_main_until(
        ["--model", str(tiny_folder)],
        lambda w: {"title": w.windowTitle(), "model": w.model_label.text(), "tabs": w.tabs.count()},
    )
    assert status == 0 and "timed_out" not in seen
    assert "Tandem" in seen["title"] and seen["tabs"] == 1
    assert seen["model"].startswith(f"Model: {tiny_folder.name}")
    assert (tmp_path / "tandem.sqlite3").is_file()


def test_main_without_arguments_loads_the_starter(qapp, starter_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_DATA_DIR", str(tmp_path))
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / starter_gguf.name).symlink_to(starter_gguf)  # fetched once per test session
    status, seen = run_main_until([], lambda w: {"model": w.model_label.text()}, timeout=120)
    assert status == 0 and "timed_out" not in seen
    assert seen["model"].startswith("Model: SmolLM2-135M-Instruct")


def test_a_missing_model_path_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["--model", str(tmp_path / "no-such-model")])
    assert info.value.code == 2
    assert "no-such-model" in capsys.readouterr().err


def model_ready(window: MainWindow) -> bool:
    return window.service.is_loaded and window.model_label.text().startswith("Model:")


def type_into_open_chat(text: str):
    """A `ready` for run_main_until that, once the model is loaded, sends `text` in the chat that is open, as a
    user would (`--prompt` goes to a new chat of its own), then waits for 20 characters of its answer."""
    sent: list[bool] = []

    def ready(window: MainWindow) -> bool:
        if not model_ready(window):
            return False
        tab = window.current_tab()
        if not sent:
            tab.input.setPlainText(text)
            sent.append(tab.send())
        return len(tab.streamed_text) > 20

    return ready


# `python -c` program: the app over --model argv[1], with argv[2] sent in the open chat once the model is loaded.
SEND_IN_OPEN_CHAT = """
import sys
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication
from app.main import main
from app.ui.main_window import MainWindow

app = QApplication(sys.argv[:1])

def send():
    windows = [w for w in QApplication.topLevelWidgets() if isinstance(w, MainWindow)]
    if windows and windows[0].service.is_loaded and windows[0].model_label.text().startswith("Model:"):
        windows[0].current_tab().input.setPlainText(sys.argv[2])
        windows[0].current_tab().send()
    else:
        QTimer.singleShot(50, send)

QTimer.singleShot(50, send)
sys.exit(main(["--model", sys.argv[1]]))
"""


def long_context_copy(tiny_folder: Path, dest: Path) -> Path:
    """The tiny model with an 8192-token context, so one answer streams for several seconds."""
    shutil.copytree(tiny_folder, dest)
    config = json.loads((dest / "config.json").read_text())
    config["max_position_embeddings"] = 8192
    (dest / "config.json").write_text(json.dumps(config))
    return dest


def assistant_text(store: Store, chat_id: int) -> str | None:
    answers = [m for m in store.messages(chat_id) if m.role == "assistant"]
    return answers[-1].text if answers else None


def test_sigkill_mid_stream_keeps_the_user_message_and_the_last_save(qapp, tiny_folder, tmp_path, monkeypatch):
    model = long_context_copy(tiny_folder, tmp_path / "model")
    data = tmp_path / "data"
    data.mkdir()
    prompt = "Tell me a very long story"
    with Store(data / "tandem.sqlite3") as store:
        settings = complete_settings(
            {"temperature": 1.0, "top_k": 1, "token_repetition_penalty": 1.0, "max_new_tokens": 6000}
        )
        settings["disallowed_tokens"] = [1, 2]  # <|im_start|>, <|im_end|>: the answer never ends by itself
        chat = store.create_chat("Crash test", settings=settings)
        store.set_setting(OPEN_TABS_KEY, [chat.id])
    env = {**os.environ, "TANDEM_DATA_DIR": str(data), "QT_QPA_PLATFORM": "offscreen"}
    proc = subprocess.Popen(
        [sys.executable, "-c", SEND_IN_OPEN_CHAT, str(model), prompt],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    saves: list[str] = []
    try:
        with Store(data / "tandem.sqlite3") as watcher:
            deadline = time.monotonic() + 120
            while len(saves) < 2:  # two saves with text: the answer is saved while it streams
                assert proc.poll() is None, proc.stderr.read().decode(errors="replace")[-2000:]
                assert time.monotonic() < deadline, f"no periodic saves seen; saw {saves!r}"
                text = assistant_text(watcher, chat.id)
                if text and (not saves or text != saves[-1]):
                    saves.append(text)
                time.sleep(0.05)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert saves[1].startswith(saves[0]) and len(saves[1]) > len(saves[0])

    with Store(data / "tandem.sqlite3") as store:
        user, answer = store.messages(chat.id)
        assert (user.role, user.text, user.complete) == ("user", prompt, True)
        assert answer.role == "assistant" and not answer.complete
        assert answer.text.startswith(saves[-1])  # at least what was last seen saved
        saved = answer.text

    # reopen the app over the same data: the chat comes back with the partial answer
    monkeypatch.setenv("TANDEM_DATA_DIR", str(data))
    status, seen = run_main_until(
        ["--model", str(model)],
        lambda w: {
            "chat_id": w.current_tab().chat_id,
            "texts": [m.text for m in w.current_tab().message_widgets()],
            "streaming": w.current_tab().is_streaming,
        },
    )
    assert status == 0 and "timed_out" not in seen
    assert seen["chat_id"] == chat.id and not seen["streaming"]
    assert seen["texts"] == [prompt, saved]


def test_closing_the_window_mid_answer_keeps_it(qapp, tiny_folder, tmp_path, monkeypatch):
    model = long_context_copy(tiny_folder, tmp_path / "model")
    data = tmp_path / "data"
    data.mkdir()
    with Store(data / "tandem.sqlite3") as store:
        settings = complete_settings({"top_k": 1, "max_new_tokens": 6000, "disallowed_tokens": [1, 2]})
        chat = store.create_chat("Close test", settings=settings)
        store.set_setting(OPEN_TABS_KEY, [chat.id])
    monkeypatch.setenv("TANDEM_DATA_DIR", str(data))
    status, seen = run_main_until(
        ["--model", str(model)],
        lambda w: {"shown": w.current_tab().streamed_text},
        ready=type_into_open_chat("Keep going"),
    )
    assert status == 0 and "timed_out" not in seen
    with Store(data / "tandem.sqlite3") as store:
        user, answer = store.messages(chat.id)
        assert user.text == "Keep going"
        assert answer.text.startswith(seen["shown"]) and not answer.complete and answer.stats["stopped"]


def test_main_applies_the_saved_speculation_setting(qapp, tiny_folder, tmp_path, monkeypatch):
    from app.service.speculation import Speculation, save_speculation

    monkeypatch.setenv("TANDEM_DATA_DIR", str(tmp_path))
    store = Store()
    save_speculation(store, Speculation(mode="ngram"))  # chosen in the model manager on an earlier run
    store.close()
    status, seen = run_main_until(
        ["--model", str(tiny_folder)],
        lambda w: {"mode": w.service.speculation.mode, "status": w.service.speculation_status()},
    )
    assert status == 0 and "timed_out" not in seen
    assert seen["mode"] == "ngram" and "n-gram" in seen["status"]


def test_a_damaged_database_is_recovered_and_the_app_starts(qapp, tiny_folder, tmp_path, monkeypatch, capsys):
    # a damaged page inside the messages of a chat that was open when the app last closed: every start used to
    # fail with "database disk image is malformed" until the file was removed by hand
    import random

    monkeypatch.setenv("TANDEM_DATA_DIR", str(tmp_path))
    path = tmp_path / "tandem.sqlite3"
    with Store(path) as store:
        for c in range(3):
            chat = store.create_chat(f"chat {c}")
            for m in range(300):
                store.add_message(chat.id, "user" if m % 2 == 0 else "assistant", f"{m}: " + "y" * 800)
        store.set_setting(OPEN_TABS_KEY, [chat.id])
    with open(path, "r+b") as f:  # one page about halfway through
        f.seek(path.stat().st_size // 2 // 4096 * 4096)
        f.write(random.Random(0).randbytes(4096))
    from PySide6.QtWidgets import QMessageBox

    def inspect(window):
        boxes = [w for w in QApplication.topLevelWidgets() if isinstance(w, QMessageBox) and w.isVisible()]
        texts = [b.text() for b in boxes]
        for box in boxes:
            box.close()
        return {"notices": texts, "chats": len(window.store.list_chats())}

    status, seen = run_main_until(["--model", str(tiny_folder)], inspect)
    assert status == 0 and "timed_out" not in seen
    assert any("damaged" in t for t in seen["notices"]) and seen["chats"] >= 1  # said, not blocking, usable
    assert "Tandem's data file was damaged" in capsys.readouterr().err
    assert len(list(tmp_path.glob("tandem.sqlite3.damaged-*"))) == 1  # kept beside the new file


@pytest.mark.timing
def test_an_unwritable_data_folder_ends_a_headless_run_with_a_message(qapp, tmp_path, monkeypatch, capsys):
    # a file where the data folder should be: nothing can be saved, so the run ends at once, saying why (no
    # dialog waits for a click nobody can give)
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    monkeypatch.setenv("TANDEM_DATA_DIR", str(blocker / "data"))
    started = time.monotonic()
    assert main(["--prompt", "hi", "--quit-after-answer"]) == 1
    assert "cannot create its data folder" in capsys.readouterr().err and time.monotonic() - started < 30


def json_chat_open_last(data: Path) -> tuple[int, dict, dict]:
    """A store whose open chat is in JSON mode, with its own seed, length and system prompt and a turn of history.
    Returns its id, its settings and the default settings (the Balanced preset's, as in a new window)."""
    with Store(data / "tandem.sqlite3") as store:
        settings = {"top_k": 1, "seed": 3, "max_new_tokens": 5, "json_mode": True}
        chat = store.create_chat("My JSON chat", system_prompt="Answer in JSON.", settings=settings)
        store.add_message(chat.id, "user", "Give me an object")
        store.add_message(chat.id, "assistant", '{"a": 1}', settings=settings)
        store.set_setting(OPEN_TABS_KEY, [chat.id])
        store.set_setting(CURRENT_TAB_KEY, chat.id)
        defaults = next(p.settings for p in store.presets.all() if p.name == "Balanced")
    return chat.id, settings, defaults


def check_prompt_chat(data: Path, json_chat_id: int, json_settings: dict, defaults: dict, prompt: str) -> str:
    """The JSON chat is as it was; the prompt went to one new chat with the default settings. Returns the answer."""
    with Store(data / "tandem.sqlite3") as store:
        json_chat = store.get_chat(json_chat_id)
        assert json_chat.settings == json_settings and json_chat.system_prompt == "Answer in JSON."
        assert [m.text for m in store.messages(json_chat_id)] == ["Give me an object", '{"a": 1}']
        (new,) = [c for c in store.list_chats() if c.id != json_chat_id]
        assert new.settings == defaults and "json_mode" not in new.settings and new.system_prompt == ""
        user, answer = store.messages(new.id)
        assert user.text == prompt and answer.role == "assistant" and answer.complete
        assert "json_mode" not in answer.settings and "json_mode" not in answer.stats
        return answer.text


def test_a_prompt_from_the_command_line_starts_a_new_chat_with_the_default_settings(
    qapp, tiny_folder, tmp_path, monkeypatch
):
    data = tmp_path / "data"
    data.mkdir()
    json_chat_id, json_settings, defaults = json_chat_open_last(data)
    monkeypatch.setenv("TANDEM_DATA_DIR", str(data))

    def answered(w: MainWindow) -> bool:
        tab = w.current_tab()
        return (
            model_ready(w)
            and tab.chat_id != json_chat_id
            and len(w.store.messages(tab.chat_id)) == 2
            and (not tab.is_streaming)
        )

    status, seen = run_main_until(
        ["--model", str(tiny_folder), "--prompt", "Hello from the command line"],
        lambda w: {"tabs": [t.chat_id for t in w.chat_tabs()], "current": w.current_tab().chat_id},
        ready=answered,
    )
    assert status == 0 and "timed_out" not in seen
    assert seen["tabs"][0] == json_chat_id and len(seen["tabs"]) == 2  # the user's chat stays open beside it
    check_prompt_chat(data, json_chat_id, json_settings, defaults, "Hello from the command line")


def test_quit_after_answer_also_answers_in_a_new_chat(qapp, tiny_folder, tmp_path, monkeypatch, capsys):
    data = tmp_path / "data"
    data.mkdir()
    json_chat_id, json_settings, defaults = json_chat_open_last(data)
    monkeypatch.setenv("TANDEM_DATA_DIR", str(data))
    windows = _main_windows(qapp)
    assert main(["--model", str(tiny_folder), "--prompt", "Hello", "--quit-after-answer"]) == 0
    answer = check_prompt_chat(data, json_chat_id, json_settings, defaults, "Hello")
    assert capsys.readouterr().out == answer + "\n"
    # main's window went with it: kept, each in-process run left ~650 widgets that every restyle walked
    assert _main_windows(qapp) == windows


def _main_windows(qapp) -> int:
    from app.ui.main_window import MainWindow

    return sum(isinstance(widget, MainWindow) for widget in qapp.topLevelWidgets())


def test_a_disk_full_at_start_ends_with_a_message_not_a_traceback(qapp, tiny_folder, tmp_path, monkeypatch, capsys):
    # the window saves a first chat as it opens; a disk that refuses it must not end the app with a traceback
    from app.store import StoreError
    from app.store.store import Store

    monkeypatch.setenv("TANDEM_DATA_DIR", str(tmp_path))

    def full(*args, **kwargs):
        raise StoreError("database or disk is full.")

    monkeypatch.setattr(Store, "create_chat", full)
    assert main(["--model", str(tiny_folder), "--prompt", "hi", "--quit-after-answer"]) == 1
    err = capsys.readouterr().err
    assert "could not write to its data file: database or disk is full" in err and "Traceback" not in err
