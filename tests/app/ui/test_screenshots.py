"""Screenshots of the main window with two chats, saved to test-artifacts/ (offscreen renders, for review).

The tiny random model writes noise; set TANDEM_SCREENSHOT_MODEL to a model path, or to "starter", to take
them with a real model. The README's pictures in docs/screenshots/ come from the real window under Xvfb,
light and dark: tools/take_screenshots.py.
"""

from __future__ import annotations

import asyncio
import os

import pytest
from PySide6.QtGui import QImage

from app.service import EngineService
from app.service.generation import complete_settings

CHATS = [
    ("Write a Python function that checks whether a number is prime.", "You are a concise coding assistant."),
    ("Give me three tips for a good night's sleep.", ""),
]


@pytest.fixture
def screenshot_service(engine_service, qloop):
    choice = os.environ.get("TANDEM_SCREENSHOT_MODEL")
    if not choice:
        yield engine_service, 40
        return
    from engine.loading.starter import fetch_starter

    path = fetch_starter() if choice == "starter" else choice
    service = EngineService()

    async def load():
        service.load_model(path)
        return await service.wait_loaded()

    assert qloop.run_until_complete(load())
    yield service, 160
    qloop.run_until_complete(service.close())


def test_main_window_with_two_chats(app_store, screenshot_service, run, ui):
    service, max_new_tokens = screenshot_service
    window = ui.open_window(app_store, service)
    try:
        balanced = next(p for p in app_store.presets.all() if p.name == "Balanced").settings
        settings = complete_settings({**balanced, "seed": 1234, "max_new_tokens": max_new_tokens})
        tabs = [window.current_tab()]
        tabs[0].set_settings(settings)
        tabs.append(window.new_chat())

        async def go():
            for tab, (prompt, system_prompt) in zip(tabs, CHATS):
                tab.system_prompt_edit.setPlainText(system_prompt)
                await ui.wait_for(lambda t=tab, s=system_prompt: t.chat.system_prompt == s, what="system prompt")
                tab.input.setPlainText(prompt)
                assert tab.send()
            await ui.wait_idle(window, timeout=850)

        run(go(), timeout=900)
        ui.artifacts.mkdir(exist_ok=True)
        for i, tab in enumerate(tabs, start=1):
            window.tabs.setCurrentWidget(tab)
            window.sidebar.select(tab.chat_id)
            run(asyncio.sleep(0.3))  # coalesced Markdown renders and layouts land
            path = ui.artifacts / f"main-window-chat-{i}.png"
            assert window.grab().save(str(path))
            image = QImage(str(path))
            assert (image.width(), image.height()) == (window.width(), window.height())
            colours = {image.pixel(x, y) for x in range(0, image.width(), 37) for y in range(0, image.height(), 23)}
            assert len(colours) > 20  # a drawn window, not a blank frame
        assert [window.tabs.tabText(i) for i in range(2)] == [_short(prompt) for prompt, _ in CHATS]
    finally:
        run(ui.close_window(window))


def _short(title: str) -> str:
    title = title[:48] + ("…" if len(title) > 48 else "")
    return title if len(title) <= 24 else title[:23] + "…"
