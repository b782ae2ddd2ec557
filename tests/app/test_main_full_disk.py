"""`tandem --prompt ... --quit-after-answer` when the disk refuses the answer: no save of it ever lands, or its
row cannot even be made.

Before, the failed save at the end of the answer raised out of the tab's task: the answer stayed complete=0
and the process never exited. Now each case prints why and exits 1, in bounded time.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.store import Store

REPO = Path(__file__).resolve().parents[2]

# The real app in its own process, with one store write failing as a full disk makes it fail.
FULL_DISK_MAIN = """
import sys
from app.store import Store, StoreError

def refuse(store):
    raise StoreError(f"could not save to {{store.path}}: database or disk is full. Nothing of this change was written.")

{patch}
from app.main import main
sys.exit(main(sys.argv[1:]))
"""
NO_ANSWER_SAVES = "Store.update_message = lambda self, message_id, **fields: refuse(self)"
NO_ANSWER_ROW = """
add = Store.add_message
Store.add_message = lambda self, chat_id, role, *a, **k: refuse(self) if role == "assistant" else add(self, chat_id, role, *a, **k)
"""


@pytest.mark.parametrize(
    ("patch", "complaint", "saved_roles"),
    [
        (NO_ANSWER_SAVES, "tandem: the answer could not be saved: could not save to", ["user", "assistant"]),
        (NO_ANSWER_ROW, "tandem: Could not start the answer: could not save to", ["user"]),
    ],
    ids=["answer-never-saved", "answer-row-refused"],
)
def test_a_headless_answer_the_disk_refuses_ends_with_a_message_and_status_1(
    tiny_folder, tmp_path, patch, complaint, saved_roles
):
    data = tmp_path / "data"
    env = {**os.environ, "TANDEM_DATA_DIR": str(data), "QT_QPA_PLATFORM": "offscreen"}
    code = FULL_DISK_MAIN.format(patch=patch)
    done = subprocess.run(
        [sys.executable, "-c", code, "--model", str(tiny_folder), "--prompt", "Hi", "--quit-after-answer"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,  # it hung forever before
    )
    assert done.returncode == 1, done.stderr[-3000:]
    assert done.stdout == ""
    assert complaint in done.stderr and "database or disk is full" in done.stderr
    with Store(data / "tandem.sqlite3") as store:
        (chat,) = [c for c in store.list_chats() if store.messages(c.id)]
        messages = store.messages(chat.id)
        assert [m.role for m in messages] == saved_roles and messages[0].text == "Hi"
        assert not any(m.complete for m in messages if m.role == "assistant")  # never reached the disk, says so
