"""The app's own chats go ahead of its local server's clients in the generator they share: a chat tab sent
while API requests wait for cache pages starts before any of them.

Bad inputs tried: a cache with room for one request at a time, two more requests already waiting when the chat
is sent, and a chat too long to run beside a request.
"""

from __future__ import annotations

import asyncio
import threading

import keyring
import openai
import pytest
import torch
from keyring.backends import null

from app.service import EngineService
from app.service.app_server import AppServer
from app.service.generation import complete_settings
from app.store import Store
from app.ui.main_window import MainWindow

TIMEOUT = 120
PAGE = 16
CACHE_TOKENS = 1024  # 64 pages
REQUEST_TOKENS = 600  # with its prompt, 38 pages: one request at a time
CHAT_TOKENS = 450  # with its prompt, more pages than a running request leaves, and too many to run beside one


def run(loop, coro):
    return loop.run_until_complete(asyncio.wait_for(coro, TIMEOUT))


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_DATA_DIR", str(tmp_path / "data"))
    before = keyring.get_keyring()
    keyring.set_keyring(null.Keyring())
    s = Store()
    yield s
    s.close()
    keyring.set_keyring(before)


@pytest.fixture
def service(loop, tiny_folder):
    svc = EngineService(dtype=torch.float32, page_size=PAGE, max_cache_tokens=CACHE_TOKENS)
    svc.load_model(tiny_folder, "tiny")
    assert run(loop, svc.wait_loaded())
    yield svc
    run(loop, svc.close())


def _request(url: str, name: str, events: list) -> None:
    """One streamed completion of REQUEST_TOKENS; notes its first token and its end (on this thread)."""
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=TIMEOUT)
    stream = client.completions.create(
        model="tiny",
        prompt=f"Request {name}",
        max_tokens=REQUEST_TOKENS,
        stream=True,
        logprobs=1,  # a chunk for every token: the first chunk is the first token
        extra_body={"min_tokens": REQUEST_TOKENS},
    )
    first = True
    for _ in stream:
        if first:
            events.append(("first", name))
            first = False
    events.append(("done", name))


def test_a_chat_tab_starts_before_the_server_requests_waiting_for_pages(loop, store, service):
    cache = service.serving().cache
    assert cache.num_pages * cache.page_size == CACHE_TOKENS
    server = AppServer(store, service)
    url = run(loop, server.start(port=0))
    window = MainWindow(store, service)
    window.show()
    tab = window.current_tab()
    settings = complete_settings(
        {"temperature": 1.0, "top_k": 1, "top_p": 1.0, "token_repetition_penalty": 1.0, "max_new_tokens": CHAT_TOKENS}
    )
    settings["disallowed_tokens"] = sorted(service.tokenizer.eos_token_ids)  # the answer runs its full length
    tab.set_settings(settings)
    events: list = []
    tab.chunk_received.connect(lambda *_: events.append(("first", "chat")) if ("first", "chat") not in events else None)
    tab.generation_finished.connect(lambda *_: events.append(("done", "chat")))
    threads = [threading.Thread(target=_request, args=(url, name, events)) for name in ("r1", "r2", "r3")]

    async def scenario() -> None:
        threads[0].start()
        while ("first", "r1") not in events:
            await asyncio.sleep(0.005)
        for thread in threads[1:]:
            thread.start()
        while server._served.in_flight < 3:  # r2 and r3 hold jobs, waiting for r1's pages
            await asyncio.sleep(0.005)
        tab.input.setPlainText("Tell me a long story.")
        assert tab.send()
        while ("done", "chat") not in events or any(t.is_alive() for t in threads):
            await asyncio.sleep(0.01)

    try:
        run(loop, scenario())
    finally:
        for thread in threads:
            thread.join(TIMEOUT)
        window.close()
        window.deleteLater()
        run(loop, server.stop())
    order = [f"{kind}:{name}" for kind, name in events]
    assert order.index("first:r1") < order.index("first:chat"), order
    # Sent after r2 and r3 were waiting, the chat took r1's pages when they freed; either request first would
    # have held them until its own end (a chat and a request do not fit together).
    assert order.index("first:chat") < min(order.index("first:r2"), order.index("first:r3")), order
