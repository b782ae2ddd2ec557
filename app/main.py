"""`tandem`: opens the chat window with the model used last, or the starter (fetched first, with progress).

    tandem [--model PATH|starter|demo | --remote URL [--remote-model ID] [--api-key KEY]]
           [--prompt TEXT [--image PATH ...] [--quit-after-answer [--show]]] [-v]

The window runs on a qasync loop (asyncio on Qt's event loop); the model loads on a worker thread and
answers are generated on the engine's own thread, so the window stays responsive throughout.
`--quit-after-answer` prints the answer to `--prompt` on stdout and exits, a command-line tool that needs no
display (offscreen; `--show` shows the window meanwhile): packaging/check.sh drives the bundled app that way. `--remote` chats through an OpenAI-compatible server instead of loading a model.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from app.qt_platform import platform_arguments, quiet_qt_noise, window_problem

log = logging.getLogger(__name__)

APP_ID = "io.github.tandem.Tandem"  # the .desktop file's name and the AppStream id (packaging/linux)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tandem",
        description="Tandem: chat with language models running locally. "
        "User data lives in the platform's data folder; TANDEM_DATA_DIR overrides it.",
    )
    parser.add_argument(
        "--model",
        metavar="PATH",
        help="a Hugging Face model folder or a .gguf file to load instead of the model used last; "
        "'starter' for the starter model, 'demo' for the bundled demo vision model",
    )
    parser.add_argument(
        "--prompt", metavar="TEXT", help="send TEXT in a new chat (default settings) as soon as the model has loaded"
    )
    parser.add_argument(
        "--image", metavar="PATH", action="append", default=[], help="attach an image to --prompt (repeatable)"
    )
    parser.add_argument(
        "--quit-after-answer",
        action="store_true",
        help="print the answer to --prompt on stdout and quit (exit status 1 when it fails); no window or "
        "display is needed",
    )
    parser.add_argument(
        "--show", action="store_true", help="with --quit-after-answer: show the window while it answers"
    )
    parser.add_argument(
        "--remote",
        metavar="URL",
        help="chat through an OpenAI-compatible server (vLLM, llama-server, python -m engine serve) at URL, "
        "e.g. http://host:8000/v1, instead of a local model",
    )
    parser.add_argument("--remote-model", metavar="ID", help="the server's model to use (default: the first it lists)")
    parser.add_argument("--api-key", metavar="KEY", help="the server's API key (default: $TANDEM_API_KEY)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log more (to stderr)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the app until its window closes; returns the exit status."""
    args_list = sys.argv[1:] if argv is None else argv
    if args_list[:2] == ["-m", "pip"] and getattr(sys, "frozen", False):
        return _bundled_pip(args_list[2:])
    parser = build_parser()
    args = parser.parse_args(args_list)
    _check_args(parser, args)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from PySide6.QtWidgets import QApplication

    qt_arguments = platform_arguments(headless=args.quit_after_answer and not args.show)
    problem = None if QApplication.instance() or qt_arguments else window_problem()
    if problem:  # Qt's own report would be a misleading hint and an abort
        print(f"tandem: {problem}", file=sys.stderr)
        return 1
    if argv is None:
        # Ctrl+C in the terminal: Qt's loop would swallow KeyboardInterrupt, so let the signal end the process.
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    import qasync
    import shiboken6
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QMessageBox

    from app.gui_gc import GuiThreadCollector
    from app.service import EngineService
    from app.service.loading import prompt_cache_dir
    from app.service.speculation import load_speculation
    from app.single_instance import SingleInstance
    from app.store import StoreError
    from app.store.recovery import open_store
    from app.ui.first_run import ModelStartup
    from app.ui.main_window import MainWindow
    from app.ui.tasks import spawn

    quiet_qt_noise()
    app = QApplication.instance() or QApplication([sys.argv[0] if sys.argv else "tandem", *qt_arguments])
    collector = GuiThreadCollector(app)  # Qt objects are freed on the GUI thread only (app/gui_gc.py)
    app.setApplicationName("Tandem")
    app.setDesktopFileName(APP_ID)  # Wayland matches the window to the .desktop file (and its icon) by this
    _set_icon(app)
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    instance = SingleInstance()  # one Tandem per data folder (app/single_instance.py)
    try:
        if not instance.claim():
            return instance.hand_over(args)
        try:
            opened = open_store()  # a damaged file is moved aside and what can be read recovered
        except StoreError as e:
            print(f"tandem: {e}", file=sys.stderr)
            if not args.quit_after_answer:  # headless runs must not wait on a dialog nobody sees
                QMessageBox.critical(None, "Tandem cannot open its data", str(e))
            return 1
        store = opened.store
        # the saved speculation choice; finished prompt pages also kept in the data folder for the next start
        service = EngineService(speculation=load_speculation(store), prompt_cache_dir=prompt_cache_dir())
        try:
            window = MainWindow(store, service)  # restores the open chats, or saves a first one
        except StoreError as e:  # a full disk, or a file turned read-only: nothing saved is lost
            message = (
                f"Tandem could not write to its data file: {e} Free some disk space (or check the file's "
                "permissions) and start Tandem again; the chats already saved are intact."
            )
            print(f"tandem: {message}", file=sys.stderr)
            if not args.quit_after_answer:
                QMessageBox.critical(None, "Tandem cannot save its data", message)
            store.close()
            return 1
        window.show()
        if opened.notice:
            print(f"tandem: {opened.notice}", file=sys.stderr)
            window.show_error(opened.notice)
            if not args.quit_after_answer:
                _show_notice(window, "Tandem recovered its data", opened.notice)
        QTimer.singleShot(0, lambda: log.info("window shown"))  # the first turn of the loop after show()
        startup = ModelStartup(window, store, service)
        remote = _remote_endpoint(args)
        if remote is None:
            startup.start(args.model)
        instance.serve(window, startup, headless=args.quit_after_answer)
        outcome: dict[str, Any] = {}
        if args.image or args.quit_after_answer:
            QTimer.singleShot(
                0, lambda: spawn(_answer_once(window, startup, args, outcome, remote), name="answer-once")
            )
        elif remote is not None:
            QTimer.singleShot(0, lambda: spawn(_use_remote(window, remote, args.prompt), name="use-remote"))
        elif args.prompt:
            window.send_prompt(args.prompt)
        status = loop.run_forever()
        loop.run_until_complete(service.close())
        # main returns to its caller, which is not always the process's exit (the tests call it in place): the
        # window goes with it, or it and its widgets live on in the QApplication, which restyles every live
        # widget when the colour scheme changes (every leftover window makes a theme switch slower)
        shiboken6.delete(window)
        store.close()
        if "error" in outcome:
            print(f"tandem: {outcome['error']}", file=sys.stderr)
            return 1
        return int(status) if isinstance(status, int) and status >= 0 else 0
    finally:
        instance.close()
        collector.stop()
        asyncio.set_event_loop(None)
        loop.close()


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    from engine.loading.builtin import BUILTIN_MODELS, DEMO, demo_vision_available

    if args.model == DEMO and not demo_vision_available():
        parser.error("--model demo: this installation has no demo vision model (assets/demo-vision is missing)")
    if args.model not in (None, *BUILTIN_MODELS) and not Path(args.model).expanduser().exists():
        parser.error(f"--model {args.model}: no such file or folder (give a model folder or a .gguf file)")
    if args.remote and args.model:
        parser.error("--remote and --model are two different models: give one of them")
    if (args.remote_model or args.api_key) and not args.remote:
        parser.error("--remote-model and --api-key go with --remote URL (the server to use)")
    if (args.image or args.quit_after_answer) and not args.prompt:
        parser.error("--image and --quit-after-answer need --prompt TEXT (the message to send)")
    if args.show and not args.quit_after_answer:
        parser.error("--show goes with --quit-after-answer (without it the window shows anyway)")
    for image in args.image:
        if not Path(image).expanduser().is_file():
            parser.error(f"--image {image}: no such file")


def _remote_endpoint(args: argparse.Namespace) -> Any:
    """The server --remote names (with --remote-model, --api-key or $TANDEM_API_KEY), or None. Images given
    with --image mean the user says that model sees them."""
    if not args.remote:
        return None
    from app.service.remote_endpoints import Endpoint

    key = args.api_key or os.environ.get("TANDEM_API_KEY") or None
    return Endpoint(args.remote, key, args.remote_model, sees_images=bool(args.image))


async def _use_remote(window: Any, remote: Any, prompt: str | None) -> None:
    from app.ui.remote_dialog import use_remote

    if await use_remote(window, remote, remember=False) and prompt:
        window.send_prompt(prompt)


async def _answer_once(
    window: Any, startup: Any, args: argparse.Namespace, outcome: dict[str, Any], remote: Any = None
) -> None:
    """Send --prompt (with --image files) once the model is loaded (or the --remote server answered); with
    --quit-after-answer print the answer and quit. A failure goes into `outcome["error"]` (and quits) in
    that mode."""
    from PySide6.QtWidgets import QApplication

    from app.ui.remote_dialog import use_remote

    service = window.service
    try:
        if remote is not None:
            if not await use_remote(window, remote, remember=False):
                raise RuntimeError(window.error_label.text() or "the server could not be used")
        elif not await service.wait_loaded():
            raise RuntimeError(startup.last_error or "the model did not load")
        tab = window.new_prompt_chat()  # never the user's open chat, whatever its settings
        if args.image:
            await tab.attach_files([str(Path(p).expanduser()) for p in args.image])
            if len(tab.strip.attachments()) != len(args.image):
                raise RuntimeError(tab.notice_text() or "an image could not be attached")
        tab.input.setPlainText(args.prompt)
        if not args.quit_after_answer:
            tab.send()  # a refusal shows above the chat's input
            return
        finished = asyncio.get_running_loop().create_future()
        tab.generation_finished.connect(lambda _id: finished.done() or finished.set_result(None))
        if not tab.send():
            raise RuntimeError(tab.notice_text() or "the prompt was not sent")
        await finished
        if tab.save_error:  # a headless run cannot wait for the disk to have room again
            raise RuntimeError(f"the answer could not be saved: {tab.save_error}")
        answer = next((m for m in reversed(window.store.messages(tab.chat_id)) if m.role == "assistant"), None)
        if answer is None:  # the answer never started; the tab says why
            raise RuntimeError(tab.notice_text() or "the answer did not start")
        if "error" in (answer.stats or {}):
            raise RuntimeError(f"the answer failed: {answer.stats['error']}")
        log.info("answer received")
        print(answer.text, flush=True)
    except Exception as e:
        if not args.quit_after_answer:
            window.show_error(f"Could not send the prompt from the command line: {e}")
            return
        outcome["error"] = str(e)
    if args.quit_after_answer:
        window.close()
        QApplication.quit()


def _show_notice(parent: Any, title: str, text: str) -> None:
    """A warning that does not block: the window is already usable behind it."""
    from PySide6.QtWidgets import QMessageBox

    box = QMessageBox(QMessageBox.Icon.Warning, title, text, QMessageBox.StandardButton.Ok, parent)
    box.setModal(False)
    box.show()


def _set_icon(app: Any) -> None:
    from PySide6.QtGui import QIcon

    from app.resources import icon_paths

    icon = QIcon()
    for path in icon_paths():
        icon.addFile(str(path))
    if icon.isNull():
        log.info("no icon PNGs in the assets folder; the window keeps the platform's default icon")
        return
    app.setWindowIcon(icon)  # every window of the app, the main one included


def _bundled_pip(args: list[str]) -> int:
    """`tandem -m pip ...` in the frozen bundle: the starter fetch runs `sys.executable -m pip download`
    (engine/loading/starter.py), and a bundle's executable is this app, so it answers as pip would."""
    from pip._internal.cli.main import main as pip_main

    os.environ.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")  # the bundled pip is not upgraded by itself
    return int(pip_main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
