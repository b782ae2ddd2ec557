"""The server tests' one way to run the real app: uvicorn on a free port of 127.0.0.1, in a thread."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from engine.server.app import ServerOptions, create_app
from engine.server.command import bind, make_server, url_of
from engine.server.served import ServedModel


@contextmanager
def running(served: ServedModel, options: ServerOptions | None = None) -> Iterator[str]:
    """Serve on a free port of 127.0.0.1; yields the base URL (".../v1")."""
    server = make_server(create_app(served, options or ServerOptions()))
    sock = bind("127.0.0.1", 0)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), name="test-uvicorn")
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield url_of(sock)
    finally:
        server.should_exit = True
        thread.join(30)
        assert not thread.is_alive(), "the server did not stop"


@pytest.fixture(scope="session")
def serving():
    """`with serving(served[, options]) as url:` runs the real server for one block."""
    return running
