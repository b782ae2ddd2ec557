"""kill -9 mid-stream: reopening shows the user message and the answer as of its last committed update."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from app.store import Store

HELPER = Path(__file__).with_name("crash_writer.py")
REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs POSIX SIGKILL")
def test_kill_9_mid_stream_keeps_every_committed_write(tmp_path):
    path = tmp_path / "tandem.sqlite3"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TANDEM_DATA_DIR": str(tmp_path)}
    child = subprocess.Popen(
        [sys.executable, str(HELPER), str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        ready = child.stdout.readline().split()
        assert ready[:1] == ["ready"], f"child failed to start: {ready} {child.stderr.read()}"
        chat_id, answer_id = int(ready[1]), int(ready[2])
        last_seen = 0
        while last_seen < 40:  # let it stream a while, then kill it between two writes or in one
            line = child.stdout.readline()
            assert line, f"child exited early: {child.stderr.read()}"
            last_seen = int(line)
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=10) == -signal.SIGKILL
        # Lines already in the pipe were printed after their commit, so they count too.
        last_printed = max([last_seen] + [int(line) for line in child.stdout.read().split()])
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
        child.stderr.close()

    with Store(path) as store:
        messages = store.messages(chat_id)
        assert [(m.role, m.text) for m in messages[:1]] == [("user", "Tell me a long story.")]
        answer = messages[1]
        assert answer.id == answer_id and answer.complete is False
        saved_step = answer.text.count("word ")
        assert answer.text == "word " * saved_step and answer.stats == {"new_tokens": saved_step}
        # Every write that returned is there; at most one more committed before its line was printed.
        assert last_printed <= saved_step <= last_printed + 1
