"""Fixtures for the window tests: one qasync loop and one EngineService (tiny model, float32) per session,
a fresh SQLite store per test under tmp_path (TANDEM_DATA_DIR points there), and helpers to drive them."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import qasync
import shiboken6
import torch

from app.service import EngineService
from app.service.generation import complete_settings
from app.store import Store
from app.ui.main_window import MainWindow

TIMEOUT = 90
ARTIFACTS = Path(__file__).resolve().parents[3] / "test-artifacts"


@pytest.fixture(scope="session")
def qloop(qapp):
    qapp.setQuitOnLastWindowClosed(False)  # closing a test's window must not stop the loop under the test
    loop = qasync.QEventLoop(qapp)
    yield loop
    loop.close()


@pytest.fixture
def run(qloop):
    """run(coro): drive `coro` on the qasync loop (Qt events and asyncio both run) until it finishes."""

    def run(coro, timeout: float = TIMEOUT):
        return qloop.run_until_complete(asyncio.wait_for(coro, timeout))

    return run


@pytest.fixture(scope="session")
def engine_service(qloop, tiny_folder):
    service = EngineService(dtype=torch.float32)  # float32: bfloat16 on CPU is slow for tiny batches

    async def load():
        service.load_model(tiny_folder, "tiny")
        return await service.wait_loaded()

    assert qloop.run_until_complete(load())
    # Building the tiny model (transformers) leaves ~300k young objects while automatic collection is off: the
    # GUI thread's collector (app/gui_gc.py) took them in two ~220 ms collections inside the first test, which
    # times the event loop (test_responsiveness.py, run alone). Collected here, as after every test.
    gc.collect()
    yield service
    qloop.run_until_complete(service.close())


@pytest.fixture
def data_dir(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "data"
    monkeypatch.setenv("TANDEM_DATA_DIR", str(path))
    return path


@pytest.fixture
def app_store(data_dir):
    store = Store()
    yield store
    store.close()


@pytest.fixture
def window(app_store, engine_service, run):
    win = open_window(app_store, engine_service)
    yield win
    run(close_window(win))


def open_window(store, service) -> MainWindow:
    win = MainWindow(store, service)
    win.resize(1240, 780)
    win.show()
    return win


async def close_window(win: MainWindow) -> None:
    if not shiboken6.isValid(win):  # the test closed it already
        return
    for tab in win.chat_tabs():
        await tab.shutdown()
    win.close()
    win.deleteLater()
    await asyncio.sleep(0)


async def wait_for(predicate: Callable[[], object], timeout: float = TIMEOUT, what: str = "condition") -> None:
    """Let the loop run until `predicate()` is true."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.005)


async def wait_idle(win: MainWindow, timeout: float = TIMEOUT) -> None:
    await wait_for(lambda: not any(t.is_streaming for t in win.chat_tabs()), timeout, "every answer to finish")


def greedy_settings(service, max_new_tokens: int, *, allow_eos: bool = False) -> dict:
    """The Greedy preset's settings with a fixed seed; without eos the answer runs to max_new_tokens."""
    settings = complete_settings(
        {
            "temperature": 1.0,
            "top_k": 1,
            "top_p": 1.0,
            "token_repetition_penalty": 1.0,
            "seed": 7,
            "max_new_tokens": max_new_tokens,
        }
    )
    if not allow_eos:
        settings["disallowed_tokens"] = sorted(service.tokenizer.eos_token_ids)
    return settings


@pytest.fixture
def ui():
    """The helpers above, for test modules (conftest is not importable under --import-mode=importlib)."""
    return SimpleNamespace(
        wait_for=wait_for,
        wait_idle=wait_idle,
        greedy_settings=greedy_settings,
        open_window=open_window,
        close_window=close_window,
        artifacts=ARTIFACTS,
    )
