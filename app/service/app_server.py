"""The app's local OpenAI-compatible server (LM Studio style): the engine's server over the model, cache and
generator the chats use, started and stopped from the window.

Where it runs: uvicorn runs on a thread of its own with its own asyncio loop, not on the window's qasync
loop. DynamicGeneratorAsync allows it: enqueue and cancel are thread-safe (a lock and a command queue), and
each DynamicJobAsync hands its results to the loop it was created on (call_soon_threadsafe), so a request's
job streams to the server's loop while a chat's job streams to the window's, both on the one engine thread.
On its own loop, HTTP parsing and JSON encoding never stall the window; uvicorn installs no signal handlers
off the main thread (it would take Ctrl-C from Qt on the main one); and Starlette's async generators get the
loop hooks qasync's loop lacks.

What crosses threads: the window's thread decides which model is served (`_follow`, on the service's
signals) and publishes one ServedModel reference, which the server's thread reads at each request; the
server's thread appends to the request log and reports it with a queued Qt signal.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QObject, Signal

from app.service.api_keys import NO_KEYRING_NOTE, delete_api_key, load_api_key, save_api_key
from app.service.workers import LOADER, in_worker
from engine.server.app import ServerOptions, create_app
from engine.server.command import DEFAULT_PORT, LOOPBACK, bind, url_of
from engine.server.served import ServedModel

log = logging.getLogger(__name__)

# Its requests' jobs wait behind the chats' (DynamicJob.priority 0): a chat's first token never queues behind API
# traffic in the generator they share.
REQUEST_PRIORITY = -1
LOG_LINES = 50
PORT_KEY = "server.port"
RUNNING_KEY = "server.running"  # whether it was running when the app last closed: start it again then
API_KEY_KEY = "server.api_key"  # only where no keyring holds it
KEYRING_NAME = "tandem-local-server"  # the key's name in the keyring (api_keys keys by endpoint)
START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
STOP_GRACE = 2.0  # seconds a cut request has to cancel its job before its task is cancelled


class ServerError(Exception):
    """The server could not start; the message says why and what to do."""


@dataclass(frozen=True)
class RequestRecord:
    """One line of the request log."""

    time: float  # seconds since the epoch, when the request arrived
    method: str
    path: str
    status: int
    prompt_tokens: int | None
    completion_tokens: int | None
    seconds: float

    def line(self) -> str:
        tokens = "" if self.completion_tokens is None else f"  {self.prompt_tokens}+{self.completion_tokens} tokens"
        clock = time.strftime("%H:%M:%S", time.localtime(self.time))
        return f"{clock}  {self.method} {self.path}  {self.status}{tokens}  {self.seconds * 1000:.0f} ms"


class _Logged:
    """ASGI middleware: calls `record` with each HTTP request's RequestRecord once its reply has ended."""

    def __init__(self, app: Any, record: Any):
        self.app = app
        self.record = record

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        state = scope.setdefault("state", {})  # the routes note tokens here (request.state)
        start, wall = time.monotonic(), time.time()
        status = 500  # unless a reply starts: the connection broke, or stop cut it before any answer

        async def sending(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            self.record(
                RequestRecord(
                    wall,
                    scope["method"],
                    scope["path"],
                    status,
                    state.get("prompt_tokens"),
                    state.get("completion_tokens"),
                    time.monotonic() - start,
                )
            )


class _Uvicorn:
    """uvicorn serving `app` on a bound socket, on its own thread and asyncio loop."""

    def __init__(self, app: Any, sock: Any):
        import uvicorn

        # Stop closes every connection first (stream.py then cancels each one's job, as for a client that left);
        # what has not ended after this grace is cancelled.
        config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=STOP_GRACE)
        self.server = uvicorn.Server(config)
        self.sock = sock
        self.error: BaseException | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=self._run, name="tandem-app-server", daemon=True)

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as e:  # reported by start(), or logged when it happens later
            self.error = e
            log.exception("the local server stopped")
        finally:
            self.sock.close()

    async def _serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        await self.server.serve(sockets=[self.sock])

    def _cut(self) -> None:
        # Server loop: a closed connection reads as the client leaving, which ends its request and its job.
        for connection in list(self.server.server_state.connections):
            connection.transport.close()

    def stop(self, timeout: float) -> None:
        if self.loop is not None:
            try:
                self.loop.call_soon_threadsafe(self._cut)
            except RuntimeError:
                pass  # the loop has ended already
        self.server.should_exit = True
        self.thread.join(timeout)
        if self.thread.is_alive():
            log.warning("the local server did not stop within %.0f s", timeout)


class AppServer(QObject):
    """Start/stop the local server for `service`'s model; its settings persist in `store`.

    Requests use whatever model the service has loaded now (a swap is followed; requests in flight on the
    old model end with it); with none loaded they get 503.
    """

    state_changed = Signal()  # running or not, port, URL
    request_logged = Signal(str)  # a new log line (emitted from the server's thread; queued to this one)

    def __init__(self, store: Any, service: Any, parent: QObject | None = None):
        super().__init__(parent)
        self.store = store
        self.service = service
        self.requests: deque[RequestRecord] = deque(maxlen=LOG_LINES)
        self._key_note = ""  # why the last key saved went to the settings
        self._served: ServedModel | None = None  # read by the server's thread at each request
        self._uvicorn: _Uvicorn | None = None
        self._url: str | None = None
        self._restoring: asyncio.Task | None = None
        service.model_loaded.connect(self._follow)
        service.jobs_stopped.connect(self._follow)  # after a swap's old jobs ended, or the service closed

    # --- settings ------------------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        return int(self.store.get_setting(PORT_KEY, DEFAULT_PORT))

    def api_key(self) -> str | None:
        """The key clients must send (None: none needed)."""
        return load_api_key(KEYRING_NAME) or self.store.get_setting(API_KEY_KEY) or None

    def save(self, port: int, api_key: str | None) -> None:
        """Remember the port and key (the key in the keyring when there is one, else in the settings)."""
        if not 0 <= port <= 65535:
            raise ValueError(f"A port is a number from 0 to 65535 (got {port}); 0 picks a free one.")
        self.store.set_setting(PORT_KEY, port)
        if not api_key:
            delete_api_key(KEYRING_NAME)
            self.store.set_setting(API_KEY_KEY, None)
            return
        place = save_api_key(KEYRING_NAME, api_key)
        self.store.set_setting(API_KEY_KEY, None if place.in_keyring else api_key)
        self._key_note = place.note

    @property
    def key_note(self) -> str:
        """Empty, or a note that the API key sits in the settings in plain text and why (shown by the panel)."""
        if not self.store.get_setting(API_KEY_KEY):
            return ""
        return self._key_note or NO_KEYRING_NOTE

    # --- state ---------------------------------------------------------------------------------------------

    @property
    def is_running(self) -> bool:
        return self._uvicorn is not None

    @property
    def url(self) -> str | None:
        """The base URL clients use (".../v1"), while running."""
        return self._url

    @property
    def model_id(self) -> str | None:
        served = self._served
        return served.model_id if served is not None else None

    # --- start and stop ------------------------------------------------------------------------------------

    async def start(self, port: int | None = None, api_key: str | None = None) -> str:
        """Serve on 127.0.0.1:`port` (the saved port by default) and return the URL; ServerError when the port
        cannot be had. `port` and `api_key` given here are saved."""
        if self._uvicorn is not None:
            return self._url or ""
        if port is not None:
            self.save(port, api_key)
        port = self.port
        try:
            sock = bind(LOOPBACK, port)
        except ValueError:
            raise ServerError(
                f"Port {port} is in use by another program (or not allowed). Pick another port and start again."
            ) from None
        self._follow()
        options = ServerOptions(api_key=self.api_key())
        uv = _Uvicorn(_Logged(create_app(lambda: self._served, options), self._record), sock)
        url = url_of(sock)
        uv.thread.start()
        deadline = time.monotonic() + START_TIMEOUT
        while not uv.server.started:
            if not uv.thread.is_alive() or time.monotonic() > deadline:
                uv.stop(STOP_TIMEOUT)
                raise ServerError(f"The local server did not start: {uv.error or 'it took too long'}.")
            await asyncio.sleep(0.02)
        self._uvicorn, self._url = uv, url
        self.store.set_setting(RUNNING_KEY, True)
        log.info("local server at %s", url)
        self.state_changed.emit()
        return url

    async def stop(self) -> None:
        """Stop serving: open streams are cut and their jobs cancelled. Remembered as stopped."""
        await in_worker(self._shut, pool=LOADER)  # joins the server's thread: never on the GUI thread
        self.store.set_setting(RUNNING_KEY, False)

    def close(self) -> None:
        """Stop now, for quitting: waits for the server's thread, and keeps whether it was running, so the
        next start of the app serves again."""
        self._shut()

    def restore(self) -> asyncio.Task | None:
        """Start the server if it was running when the app last closed (a start that fails is logged)."""
        if not self.store.get_setting(RUNNING_KEY, False):
            return None

        async def start() -> None:
            try:
                await self.start()
            except ServerError as e:
                log.warning("%s", e)

        self._restoring = asyncio.ensure_future(start())  # a reference: the loop keeps only weak ones
        return self._restoring

    def _shut(self) -> None:
        uv, self._uvicorn, self._url = self._uvicorn, None, None
        if uv is not None:
            uv.stop(STOP_TIMEOUT)
            self.state_changed.emit()

    # --- internals -----------------------------------------------------------------------------------------

    def _follow(self, *_: Any) -> None:
        """Serve the service's current model (window thread): a new ServedModel when the generator changed."""
        now = self.service.serving()
        served = self._served
        if now is None:
            self._served = None
        # Requests already running keep the ServedModel they started with; their jobs end with the old generator.
        elif served is None or served.generator is not now.generator:
            self._served = ServedModel.shared(
                model=now.model,
                tokenizer=now.tokenizer,
                template=now.template,
                cache=now.cache,
                generator=now.generator,
                context=now.context_length,
                vision=now.vision,
                name=now.name,
                chat=now.chat,  # the chats' front door: one image cache per model for chats and requests
                priority=REQUEST_PRIORITY,
            )

    def _record(self, record: RequestRecord) -> None:
        self.requests.append(record)  # deque.append is atomic: the window reads it while this thread writes
        self.request_logged.emit(record.line())
