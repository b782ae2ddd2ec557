"""`tandem`: opens the chat window and loads the starter model (fetching it first, with progress, if absent).

    tandem [--model PATH] [--prompt TEXT] [-v]

The window runs on a qasync loop (asyncio on Qt's event loop); the model loads on a worker thread and
answers are generated on the engine's own thread, so the window stays responsive throughout.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tandem",
        description="Tandem: chat with language models running locally. "
        "User data lives in the platform's data folder; TANDEM_DATA_DIR overrides it.",
    )
    parser.add_argument(
        "--model",
        metavar="PATH",
        help="a Hugging Face model folder or a .gguf file to load instead of the starter model",
    )
    parser.add_argument(
        "--prompt", metavar="TEXT", help="send TEXT in the current chat as soon as the model has loaded"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log more (to stderr)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the app until its window closes; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.model is not None and not Path(args.model).expanduser().exists():
        parser.error(f"--model {args.model}: no such file or folder (give a model folder or a .gguf file)")
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if argv is None:
        # Ctrl+C in the terminal: Qt's loop would swallow KeyboardInterrupt, so let the signal end the process.
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    import qasync
    from PySide6.QtWidgets import QApplication, QMessageBox

    from app.service import EngineService
    from app.store import Store, StoreError
    from app.ui.main_window import MainWindow

    app = QApplication.instance() or QApplication([sys.argv[0] if sys.argv else "tandem"])
    app.setApplicationName("Tandem")
    loop = qasync.QEventLoop(app)
    asyncio.set_event_loop(loop)
    try:
        try:
            store = Store()
        except StoreError as e:
            QMessageBox.critical(None, "Tandem cannot open its data", str(e))
            return 1
        service = EngineService()
        window = MainWindow(store, service)
        window.show()
        if args.model is not None:
            service.load_model(Path(args.model).expanduser())
        else:
            service.fetch_and_load_starter()
        if args.prompt:
            window.send_prompt(args.prompt)
        status = loop.run_forever()
        loop.run_until_complete(service.close())
        store.close()
        return int(status) if isinstance(status, int) and status >= 0 else 0
    finally:
        asyncio.set_event_loop(None)
        loop.close()


if __name__ == "__main__":
    sys.exit(main())
