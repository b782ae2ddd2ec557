"""One Tandem per data folder (app/single_instance.py), with real `python -m app.main` processes.

Bad inputs tried: a second `--quit-after-answer` run on a folder in use (refused at once, nothing written),
a second windowed start (hands its prompt to the first and exits 0), a first start killed with SIGKILL (its
lock and its socket do not block the next start), a malformed request on the socket (refused with a reason).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.single_instance import InstanceLock, SingleInstance, _parse_request, send_request, server_name
from app.store import Store

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT = 120  # a loaded two-core machine imports torch and Qt slowly


def app_env(data: Path) -> dict[str, str]:
    return {**os.environ, "TANDEM_DATA_DIR": str(data), "QT_QPA_PLATFORM": "offscreen"}


def start_first(data: Path, model: Path, log_path: Path) -> subprocess.Popen:
    """A windowed Tandem on `data` (logging to `log_path`), once it holds the folder's lock."""
    log = log_path.open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.main", "--model", str(model), "-v"],
        cwd=REPO,
        env=app_env(data),
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    log.close()
    deadline = time.monotonic() + START_TIMEOUT
    while "window shown" not in log_path.read_text(errors="replace"):  # after the lock and the socket
        assert proc.poll() is None, log_path.read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, "the first Tandem did not open its window"
        time.sleep(0.1)
    assert InstanceLock(data).holder_pid() == proc.pid
    return proc


def run_app(data: Path, *args: str, timeout: float = START_TIMEOUT) -> tuple[subprocess.CompletedProcess, float]:
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "app.main", *args],
        cwd=REPO,
        env=app_env(data),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return done, time.monotonic() - began


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=30)


def user_texts(data: Path) -> list[str]:
    with Store(data / "tandem.sqlite3") as store:
        return [m.text for chat in store.list_chats() for m in store.messages(chat.id) if m.role == "user"]


def test_the_lock_is_held_once_per_folder_and_names_its_holder(tmp_path):
    first, second = InstanceLock(tmp_path), InstanceLock(tmp_path)
    assert first.acquire()
    assert not second.acquire()  # flock belongs to the open file: a second open in this process is refused too
    assert second.holder_pid() == os.getpid()
    first.release()
    assert second.acquire()
    second.release()
    assert server_name(tmp_path) == server_name(tmp_path / "." / "")  # one folder, one socket name
    assert server_name(tmp_path) != server_name(tmp_path / "other")


@pytest.mark.parametrize(
    ("line", "complaint"),
    [(b"not json", "not JSON"), (b"[1, 2]", "not a JSON object"), (b'{"images": "a.png"}', "'images' must be")],
)
def test_a_malformed_request_is_refused_with_a_reason(line, complaint):
    with pytest.raises(ValueError, match=complaint):
        _parse_request(line)


@pytest.mark.timing
def test_a_second_headless_run_is_refused_at_once_and_writes_nothing(tiny_folder, tmp_path):
    data = tmp_path / "data"
    first = start_first(data, tiny_folder, tmp_path / "first.log")
    try:
        done, seconds = run_app(data, "--model", str(tiny_folder), "--prompt", "second", "--quit-after-answer")
        assert first.poll() is None  # the first one keeps running
    finally:
        stop(first)
    assert done.returncode == 1 and done.stdout == ""
    assert f"another Tandem is using the data folder {data} (pid {first.pid})" in done.stderr
    assert "set TANDEM_DATA_DIR to another folder" in done.stderr
    assert seconds < 60  # refused before any model is loaded (the time is mostly importing torch and Qt)
    assert "second" not in user_texts(data)


def test_a_second_windowed_start_hands_its_prompt_to_the_first(tiny_folder, tmp_path):
    data = tmp_path / "data"
    first = start_first(data, tiny_folder, tmp_path / "first.log")
    try:
        done, _ = run_app(data, "--prompt", "handed over")
        assert done.returncode == 0, done.stderr
        deadline = time.monotonic() + START_TIMEOUT
        with Store(data / "tandem.sqlite3") as watcher:
            while True:  # the first window sends it in a new chat, and the answer completes
                chats = {c.id: watcher.messages(c.id) for c in watcher.list_chats()}
                sent = [msgs for msgs in chats.values() if msgs and msgs[0].text == "handed over"]
                if sent and len(sent[0]) == 2 and sent[0][1].complete:
                    break
                assert first.poll() is None, (tmp_path / "first.log").read_text(errors="replace")[-3000:]
                assert time.monotonic() < deadline, f"the first Tandem did not send the prompt; chats: {chats}"
                time.sleep(0.1)
        assert first.poll() is None
    finally:
        stop(first)
    log = (tmp_path / "first.log").read_text(errors="replace")
    request = {"model": None, "prompt": "handed over", "images": []}
    assert f"another start handed over its arguments: {request}" in log
    assert sent[0][1].role == "assistant" and sent[0][1].text


def test_a_killed_first_start_leaves_nothing_that_blocks_the_next(tiny_folder, tmp_path, qapp):
    data = tmp_path / "data"
    first = start_first(data, tiny_folder, tmp_path / "first.log")
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    assert (data / "tandem.lock").is_file()  # the file stays; its lock went with the process

    # The next start takes the folder and listens, though the killed one's socket file may still be there.
    instance = SingleInstance(data)
    try:
        assert instance.claim()
        assert instance.serve(window=None, startup=None)
    finally:
        instance.close()

    done, _ = run_app(data, "--model", str(tiny_folder), "--prompt", "after the kill", "--quit-after-answer")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
    assert "after the kill" in user_texts(data)


def test_a_headless_first_start_refuses_a_windowed_second_with_a_reason(tmp_path, qtbot):
    first = SingleInstance(tmp_path)
    try:
        assert first.claim()
        assert first.serve(window=None, startup=None, headless=True)
        # The second start's side in its own process: a blocking Qt call holds the GIL this thread's slots need.
        code = (
            "import json, sys; from app.single_instance import send_request; "
            f"print(json.dumps(send_request({server_name(tmp_path)!r}, {{'prompt': 'hi'}}, 30)))"
        )
        second = subprocess.Popen(
            [sys.executable, "-c", code], cwd=REPO, env=app_env(tmp_path), stdout=subprocess.PIPE, text=True
        )
        qtbot.waitUntil(lambda: second.poll() is not None, timeout=START_TIMEOUT * 1000)  # the first answers here
    finally:
        first.close()
    reply = json.loads(second.stdout.read())
    assert reply["ok"] is False
    assert (
        f"another Tandem is answering a --prompt in the data folder {tmp_path} (pid {os.getpid()})" in (reply["error"])
    )


def test_nobody_listening_ends_the_handoff_in_bounded_time(tmp_path, qapp):
    began = time.monotonic()
    assert send_request(server_name(tmp_path), {"prompt": "hi"}, 0.5) is None
    assert time.monotonic() - began < 5
