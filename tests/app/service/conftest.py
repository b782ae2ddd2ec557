"""A qasync loop per test for the service tests (the service emits its signals from that loop)."""

from __future__ import annotations

import asyncio

import pytest
import qasync


@pytest.fixture
def loop(qapp):
    loop = qasync.QEventLoop(qapp)
    asyncio.set_event_loop(loop)
    yield loop
    asyncio.set_event_loop(None)
    loop.close()
