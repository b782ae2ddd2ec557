"""A model whose chat template runs away: the window keeps responding while the template renders on a worker
thread, the template's own error shows in the chat once its time limit stops it, and the window keeps working.

Bad inputs tried: a template with two nested 100,000-step loops (it froze the window before the render moved off
the GUI thread and got a time limit), and one that builds a 2 GB string. Sending beside a runaway render stalled the window for 0.6-0.7 s on an AMD
EPYC (each SQLite and Qt call of the send waited out CPython's 5 ms GIL switch interval) until long renders
started pausing briefly every 2 ms.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
import torch
from PySide6.QtCore import QTimer

from app.service import EngineService

RUNAWAY = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
HUGE = "{{ '{:>2000000000}'.format(1) }}"


def with_template(tiny_folder: Path, dest: Path, template: str) -> Path:
    """The tiny model with `template` as its chat template (chat_template.jinja wins over tokenizer_config)."""
    shutil.copytree(tiny_folder, dest)
    (dest / "chat_template.jinja").write_text(template, encoding="utf-8")
    return dest


@pytest.mark.timing
def test_a_runaway_chat_template_is_stopped_shown_and_the_window_keeps_working(
    tiny_folder, tmp_path, app_store, run, ui
):
    runaway = with_template(tiny_folder, tmp_path / "runaway", RUNAWAY)
    huge = with_template(tiny_folder, tmp_path / "huge", HUGE)
    gaps: list[float] = []
    last = [0.0]

    def tick():
        now = time.perf_counter()
        gaps.append(now - last[0])
        last[0] = now

    probe = QTimer()
    probe.setInterval(10)
    probe.timeout.connect(tick)

    async def go():
        service = EngineService(dtype=torch.float32)
        window = ui.open_window(app_store, service)
        try:
            service.load_model(runaway, "runaway")
            assert await service.wait_loaded()
            tab = window.current_tab()
            tab.set_settings(ui.greedy_settings(service, 4))
            tab.input.setPlainText("Hello")
            started = time.monotonic()
            last[0] = time.perf_counter()
            probe.start()
            assert tab.send()
            assert tab.is_streaming and not tab.send_button.isEnabled()  # building the prompt, off the GUI thread
            await ui.wait_idle(window)
            probe.stop()
            elapsed = time.monotonic() - started
            assert "ran past 2 s" in tab.notice_text() and "runaway" in tab.notice_text()
            assert 1.9 < elapsed < 10
            assert max(gaps) < 0.5, f"the window stalled for {max(gaps):.2f} s while the template ran"
            assert not tab.is_streaming and tab.send_button.isEnabled()
            assert [m.role for m in app_store.messages(tab.chat_id)] == ["user"]  # kept; no answer row

            service.load_model(huge, "huge")  # a template that would build 2 GB fails at once
            assert await service.wait_loaded()
            tab.input.setPlainText("Again")
            assert tab.send()
            await ui.wait_idle(window, timeout=10)
            assert "too large" in tab.notice_text() and "10000" in tab.notice_text()

            service.load_model(tiny_folder, "tiny")  # a model with a sound template answers in the same chat
            assert await service.wait_loaded()
            tab.input.setPlainText("And now?")
            assert tab.send()
            await ui.wait_idle(window)
            assert tab.notice_text() == ""
            answer = app_store.messages(tab.chat_id)[-1]
            assert answer.role == "assistant" and answer.complete and answer.stats["new_tokens"] == 4
        finally:
            await ui.close_window(window)
            await service.close()

    run(go())
