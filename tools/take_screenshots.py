"""Take the README's screenshots from the real window, in light and dark, on the starter model.

    xvfb-run -s "-screen 0 1400x900x24" python tools/take_screenshots.py [--out docs/screenshots]

Under Xvfb (a real X server, not Qt's offscreen platform) it opens Tandem's MainWindow on a fresh data
folder, loads the starter model (fetched once, as `python -m engine fetch-starter` does), asks two chats
a question each, writes a second version of the first answer, and runs the compare view on one prompt under three presets. Each window is captured from
the X screen (QScreen.grabWindow), once per colour scheme:

    main-window-light.png  main-window-dark.png  compare-light.png  compare-dark.png

Seeds are fixed, so a re-run on the same engine writes the same answers. Look at every PNG before
committing it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CHATS = [
    ("Write a Python function that checks whether a number is prime.", "You are a concise coding assistant."),
    ("Give me three tips for a good night's sleep.", ""),
]
COMPARE_PROMPT = "Describe a rainy afternoon in a small town in three sentences."
MAIN_SIZE = (1240, 780)
COMPARE_SIZE = (1300, 760)
TIMEOUT_S = 900


async def _wait_for(predicate, what: str, timeout: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up after {timeout:.0f} s waiting for {what}")
        await asyncio.sleep(0.05)


def _capture(widget, path: Path) -> None:
    """The window as the X server shows it (not a re-render), refused when it came out blank."""
    from PySide6.QtWidgets import QApplication

    QApplication.processEvents()
    pixmap = widget.screen().grabWindow(widget.winId())
    image = pixmap.toImage()
    colours = {image.pixel(x, y) for x in range(0, image.width(), 37) for y in range(0, image.height(), 23)}
    if len(colours) < 20:
        raise RuntimeError(f"{path.name} came out blank ({len(colours)} colours): is the window on screen?")
    if not pixmap.save(str(path)):
        raise OSError(f"could not write {path}")
    print(f"wrote {path} ({image.width()}x{image.height()})")


async def _take(app, model: Path, out: Path, max_new_tokens: int) -> None:
    from app.service import EngineService
    from app.store import Store
    from app.ui import theme
    from app.ui.compare_view import CompareView
    from app.ui.main_window import MainWindow

    store = Store()
    service = EngineService()
    service.load_model(model)
    if not await service.wait_loaded():
        raise RuntimeError("the starter model did not load; run `python -m engine fetch-starter` to see why")
    window = MainWindow(store, service)
    window.resize(*MAIN_SIZE)
    window.move(20, 20)
    window.show()
    try:
        tabs = [window.current_tab()]
        tabs.append(window.new_chat())
        for tab, (prompt, system_prompt) in zip(tabs, CHATS):
            tab.set_settings({**tab.settings(), "seed": 1234, "max_new_tokens": max_new_tokens})
            tab.system_prompt_edit.setPlainText(system_prompt)
            await _wait_for(lambda t=tab, s=system_prompt: t.chat.system_prompt == s, "the system prompt to save")
            tab.input.setPlainText(prompt)
            if not tab.send():
                raise RuntimeError(f"the chat refused the prompt: {tab.notice_text() or 'no reason shown'}")
        await _wait_for(lambda: not any(t.is_streaming for t in tabs), "both answers")
        # A second version of the first answer (another seed), so the picture shows the versions' switch.
        tabs[0].set_settings({**tabs[0].settings(), "seed": 4321})
        if not tabs[0].regenerate():
            raise RuntimeError(f"the chat refused to regenerate: {tabs[0].notice_text() or 'no reason shown'}")
        await _wait_for(lambda: not tabs[0].is_streaming, "the second version")
        window.tabs.setCurrentWidget(tabs[0])
        window.sidebar.select(tabs[0].chat_id)

        window.show_compare_view()
        view = window.findChild(CompareView)
        view.resize(*COMPARE_SIZE)
        view.move(40, 60)
        view.set_column_count(3)
        view.set_prompt(COMPARE_PROMPT)
        view.set_max_new_tokens(max_new_tokens // 2)
        if not await view.run():
            raise RuntimeError(f"the comparison did not finish: {view.message_label.text()}")

        for scheme in theme.SCHEMES:
            theme.apply_theme(app, scheme)
            for tab in tabs:
                tab.reload()  # answers re-rendered, so code blocks take the scheme's colours too
            view.hide()
            window.raise_()
            window.activateWindow()
            await asyncio.sleep(1.0)  # coalesced renders, layouts and the X server's copy land
            _capture(window, out / f"main-window-{scheme}.png")
            view.show()
            view.raise_()
            view.activateWindow()
            await asyncio.sleep(1.0)
            _capture(view, out / f"compare-{scheme}.png")
    finally:
        for tab in window.chat_tabs():
            await tab.shutdown()
        window.close()
        await service.close()
        store.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "docs" / "screenshots")
    parser.add_argument("--max-new-tokens", type=int, default=160, help="answer length in the chats")
    args = parser.parse_args(argv)
    if os.environ.get("QT_QPA_PLATFORM", "xcb") != "xcb" or not os.environ.get("DISPLAY"):
        parser.error('run it under an X server: xvfb-run -s "-screen 0 1400x900x24" python tools/take_screenshots.py')
    args.out.mkdir(parents=True, exist_ok=True)
    from engine.loading.starter import fetch_starter

    model = fetch_starter()  # before the data folder moves: the user's models folder keeps the one copy
    data = tempfile.TemporaryDirectory(prefix="tandem-screenshots-")
    os.environ["TANDEM_DATA_DIR"] = data.name  # a fresh store: no one's chats in the pictures

    import qasync
    from PySide6.QtWidgets import QApplication

    app = QApplication([sys.argv[0]])
    app.setApplicationName("Tandem")
    app.setQuitOnLastWindowClosed(False)  # hiding the compare window between captures must not stop the loop
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(_take(app, model, args.out, args.max_new_tokens))
    finally:
        asyncio.set_event_loop(None)
        loop.close()
        data.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
