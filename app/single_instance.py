"""One Tandem per data folder: a second start hands its arguments to the first window, or refuses.

    first start   takes the lock on <data folder>/tandem.lock (held by the OS for this process: it goes
                  away when the process ends, kill -9 included), then listens on a local socket named from
                  the folder. A request from a later start raises the window, loads its --model, and sends
                  its --prompt (with its --image files) in a new chat.
    later start   finds the lock taken. With a window it connects, sends one JSON line
                  {"model", "prompt", "images"} (paths made absolute), reads one JSON line back
                  {"ok", "error"} and exits 0. With --quit-after-answer it refuses at once (exit 1): two
                  copies on one database interleaved their turns and printed each other's answers.

The socket name lives in the system's temporary folder (a named pipe on Windows), so it is derived from a
hash of the data folder's path; a socket left by a killed process is removed by the next lock holder.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import shiboken6
from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtNetwork import QLocalServer, QLocalSocket

log = logging.getLogger(__name__)

LOCK_FILE_NAME = "tandem.lock"
HANDOFF_TIMEOUT_S = 10.0  # a first start may still be opening its window; longer means it is stuck
_MAX_REQUEST_BYTES = 4 << 20  # a prompt can be long, but not without bound
_WIN_LOCK_OFFSET = 1 << 30  # Windows locks a byte range that others cannot read: lock one far past the pid


class InstanceLock:
    """An exclusive lock on `folder/tandem.lock` for this process's lifetime; the file holds the owner's pid.

    flock (Unix) and msvcrt.locking (Windows) locks belong to the open file, so the OS drops them when the
    process ends however it ends: a lock file left behind by a killed Tandem never blocks the next start.
    """

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_FILE_NAME
        self._fd: int | None = None

    @property
    def is_held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> bool:
        """Take the lock; False when another process holds it. OSError when the file cannot be opened."""
        if self._fd is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by child processes (PEP 446)
        try:
            locked = _try_lock(fd)
        except OSError:
            os.close(fd)
            raise
        if not locked:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        self._fd = fd
        return True

    def holder_pid(self) -> int | None:
        """The pid the lock's owner wrote, or None when unreadable (it may be writing it right now)."""
        try:
            return int(self.path.read_text(encoding="ascii").split()[0])
        except (OSError, ValueError, IndexError, UnicodeDecodeError):
            return None

    def release(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # closing the file drops the lock


def _try_lock(fd: int) -> bool:
    if sys.platform == "win32":
        import msvcrt

        os.lseek(fd, _WIN_LOCK_OFFSET, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except PermissionError:
            return False
        return True
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def server_name(folder: Path) -> str:
    """The local socket's name for a data folder: the same folder, however it was spelled, gives one name."""
    try:
        key = str(Path(folder).resolve())
    except OSError:
        key = os.path.abspath(folder)
    return "tandem-" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:24]


def _folder_words(folder: Path, pid: int | None) -> str:
    return f"the data folder {folder}" + (f" (pid {pid})" if pid is not None else "")


class SingleInstance(QObject):
    """This process's claim on its data folder (`engine.paths.user_data_dir()`, which TANDEM_DATA_DIR moves).

    `claim()` once at start; when it is refused, `hand_over(args)` gives the exit status. Otherwise
    `serve(window, startup)` once the window exists, and `close()` at the end.
    """

    arguments_received = Signal(dict)  # a later start's request, after the window acted on it

    def __init__(self, folder: Path | None = None):
        super().__init__()
        self._folder = Path(folder) if folder is not None else None
        self._lock: InstanceLock | None = None
        self._server: QLocalServer | None = None
        self._sockets: dict[QLocalSocket, bytearray] = {}
        self._window: Any = None
        self._startup: Any = None
        self._headless = False

    @property
    def folder(self) -> Path | None:
        return self._folder

    def claim(self) -> bool:
        """Take the data folder; False when another Tandem has it. A folder where no lock file can be made
        is not refused here: opening the store says what is wrong with it."""
        if self._folder is None:
            from engine.paths import user_data_dir  # lazy: reads TANDEM_DATA_DIR at call time

            try:
                self._folder = user_data_dir()
            except OSError as e:
                log.warning("no instance lock: the data folder cannot be made (%s)", e)
                return True
        lock = InstanceLock(self._folder)
        try:
            if not lock.acquire():
                self._lock = lock  # for holder_pid()
                return False
        except OSError as e:
            log.warning("no instance lock in %s: %s", self._folder, e)
            return True
        self._lock = lock
        return True

    def other_pid(self) -> int | None:
        return self._lock.holder_pid() if self._lock is not None else None

    # --- the later start --------------------------------------------------------------------------------------

    def hand_over(self, args: Any, timeout: float = HANDOFF_TIMEOUT_S) -> int:
        """Give this start's arguments to the Tandem holding the folder; the exit status (0: it took them)."""
        folder = _folder_words(self._folder, self.other_pid())
        if args.quit_after_answer:
            # This run must print its own answer; the other one owns the database, so it cannot.
            print(
                f"tandem: another Tandem is using {folder}; close it or set TANDEM_DATA_DIR to another folder",
                file=sys.stderr,
            )
            return 1
        request = {
            "model": _absolute(args.model),
            "prompt": args.prompt,
            "images": [str(_absolute(p)) for p in args.image],
        }
        reply = send_request(server_name(self._folder), request, timeout)
        if reply is None:
            print(
                f"tandem: another Tandem is using {folder} but did not answer within {timeout:.0f} s; "
                "close it or set TANDEM_DATA_DIR to another folder",
                file=sys.stderr,
            )
            return 1
        if not reply.get("ok"):
            print(f"tandem: {reply.get('error') or 'the running Tandem refused the request'}", file=sys.stderr)
            return 1
        log.info("handed over to the Tandem already using %s", folder)
        return 0

    # --- the first start --------------------------------------------------------------------------------------

    def serve(self, window: Any, startup: Any, *, headless: bool = False) -> bool:
        """Listen for later starts: each raises `window` and has `startup` load its model and the window
        send its prompt. A `headless` run (--quit-after-answer) refuses them with a reason. False when not
        listening (no lock, or the socket cannot be made; later starts then say the folder is in use)."""
        if self._lock is None or not self._lock.is_held:
            return False
        self._window, self._startup, self._headless = window, startup, headless
        name = server_name(self._folder)
        QLocalServer.removeServer(name)  # a socket left by a killed holder; we hold the lock, so it is not live
        server = QLocalServer(self)
        server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        server.newConnection.connect(self._accept)
        if not server.listen(name):
            log.warning("cannot listen for later starts on %s: %s", name, server.errorString())
            return False
        self._server = server
        return True

    def close(self) -> None:
        """Stop listening and release the folder."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for socket in list(self._sockets):
            socket.abort()
        self._sockets.clear()
        if self._lock is not None:
            self._lock.release()

    def _accept(self) -> None:
        while self._server is not None and self._server.hasPendingConnections():
            socket = self._server.nextPendingConnection()
            self._sockets[socket] = bytearray()
            socket.readyRead.connect(lambda s=socket: self._read(s))
            socket.disconnected.connect(lambda s=socket: self._forget(s))
            if socket.bytesAvailable():  # the request came with the connection: no readyRead will follow
                self._read(socket)

    def _forget(self, socket: QLocalSocket) -> None:
        self._sockets.pop(socket, None)
        if shiboken6.isValid(socket):  # not when Qt is deleting it already (the server closing)
            socket.deleteLater()

    def _read(self, socket: QLocalSocket) -> None:
        buffer = self._sockets.get(socket)
        if buffer is None:
            return
        buffer += bytes(socket.readAll().data())
        if b"\n" not in buffer:
            if len(buffer) > _MAX_REQUEST_BYTES:
                self._reply(socket, False, "the request from the command line is too long")
            return
        line = bytes(buffer.split(b"\n", 1)[0])
        self._sockets[socket] = bytearray()
        try:
            request = _parse_request(line)
        except ValueError as e:
            self._reply(socket, False, f"the running Tandem could not read the request: {e}")
            return
        if self._headless:
            pid = os.getpid()
            self._reply(
                socket,
                False,
                f"another Tandem is answering a --prompt in {_folder_words(self._folder, pid)} and quits "
                "after it; start again when it is done, or set TANDEM_DATA_DIR to another folder",
            )
            return
        self._reply(socket, True)
        log.info("another start handed over its arguments: %s", request)
        self._act(request)
        self.arguments_received.emit(request)

    def _reply(self, socket: QLocalSocket, ok: bool, error: str = "") -> None:
        socket.write(json.dumps({"ok": ok, "error": error}).encode("utf-8") + b"\n")
        socket.flush()
        socket.disconnectFromServer()  # after the reply is written

    def _act(self, request: dict[str, Any]) -> None:
        bring_forward(self._window)
        if request["model"]:
            self._startup.start(request["model"])
        if request["prompt"]:
            from app.ui.tasks import spawn

            spawn(send_in_new_chat(self._window, request["prompt"], request["images"]), name="handed-over-prompt")


def bring_forward(window: Any) -> None:
    """Show the window above the others, restored if it was minimised (the platform may only flash it)."""
    window.setWindowState((window.windowState() & ~Qt.WindowState.WindowMinimized) | Qt.WindowState.WindowActive)
    window.show()
    window.raise_()
    window.activateWindow()


async def send_in_new_chat(window: Any, prompt: str, images: list[str]) -> bool:
    """Send `prompt` (with `images`) in a new chat once the model is loaded; a failure shows in the window."""
    try:
        if not await window.service.wait_loaded():
            raise RuntimeError("no model is loaded")
        tab = window.new_prompt_chat()  # default settings, as `tandem --prompt` uses
        if images:
            await tab.attach_files(images)
            if len(tab.strip.attachments()) != len(images):
                raise RuntimeError(tab.notice_text() or "an image could not be attached")
        tab.input.setPlainText(prompt)
        if not tab.send():
            raise RuntimeError(tab.notice_text() or "the prompt was not sent")
    except Exception as e:  # shown, not raised: the window keeps working
        window.show_error(f"Could not send the prompt from another start of Tandem: {e}")
        return False
    return True


def send_request(name: str, request: dict[str, Any], timeout: float) -> dict[str, Any] | None:
    """Send one request to the server `name` and return its reply; None when none came within `timeout`."""
    deadline = time.monotonic() + timeout

    def left_ms() -> int:
        return max(1, int((deadline - time.monotonic()) * 1000))

    socket = QLocalSocket()
    while True:  # the first start may not be listening yet
        socket.connectToServer(name)
        if socket.waitForConnected(left_ms()):
            break
        socket.abort()
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.1)
    try:
        socket.write(json.dumps(request).encode("utf-8") + b"\n")
        while socket.bytesToWrite() > 0:  # often written at once, and then waitForBytesWritten says False
            if not socket.waitForBytesWritten(left_ms()):
                return None
        data = b""
        while b"\n" not in data:
            if time.monotonic() >= deadline or not socket.waitForReadyRead(left_ms()):
                data += bytes(socket.readAll().data())  # the reply may have come with the disconnect
                if b"\n" not in data:
                    return None
                break
            data += bytes(socket.readAll().data())
        reply = json.loads(data.split(b"\n", 1)[0])
        return reply if isinstance(reply, dict) else None
    except ValueError:
        return None
    finally:
        socket.abort()


def _parse_request(line: bytes) -> dict[str, Any]:
    try:
        request = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"not JSON ({e})") from None
    if not isinstance(request, dict):
        raise ValueError("not a JSON object")
    model, prompt, images = request.get("model"), request.get("prompt"), request.get("images", [])
    if model is not None and not isinstance(model, str):
        raise ValueError("'model' must be a string")
    if prompt is not None and not isinstance(prompt, str):
        raise ValueError("'prompt' must be a string")
    if not isinstance(images, list) or not all(isinstance(p, str) for p in images):
        raise ValueError("'images' must be a list of paths")
    return {"model": model, "prompt": prompt, "images": images}


def _absolute(path: str | None) -> str | None:
    """A path from the command line, made absolute (the first start has its own working folder);
    the model names "starter" and "demo" stay as they are."""
    from app.ui.first_run import DEMO, STARTER

    if path is None or path in (STARTER, DEMO):
        return path
    return str(Path(path).expanduser().absolute())
