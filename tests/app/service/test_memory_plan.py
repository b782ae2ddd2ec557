"""How the service sizes a load (app/service/memory_plan.py) and refuses one that would not fit, on the real
engine with the tiny model. The free memory is a figure handed to the service (its `free_memory` argument),
so the tests do not depend on the machine's.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from app.service import EngineService
from app.service.memory_plan import plan_cache_tokens, weight_layout
from engine.memory_fit import CONTEXT_STEP, OVERHEAD_BYTES
from engine.model_info import read_model_info

TIMEOUT = 60


def run(loop, coro):
    return loop.run_until_complete(asyncio.wait_for(coro, TIMEOUT))


class FreeMemory:
    """The free-memory figure a test gives the service; None until set (nothing is refused)."""

    def __init__(self):
        self.bytes: int | None = None

    def __call__(self) -> int | None:
        return self.bytes


@pytest.fixture
def free():
    return FreeMemory()


@pytest.fixture
def service(loop, free):
    svc = EngineService(dtype=torch.float32, free_memory=free)
    events: list[tuple] = []
    svc.loading_started.connect(lambda name: events.append(("started", name)))
    svc.loading_progress.connect(lambda f: events.append(("progress", f)))
    svc.model_loaded.connect(lambda name: events.append(("loaded", name)))
    svc.memory_refused.connect(lambda path, tokens: events.append(("refused", path, tokens)))
    svc.load_failed.connect(lambda msg: events.append(("failed", msg)))
    svc.events = events
    yield svc
    run(loop, svc.close())


def test_the_cache_keeps_the_chosen_context_past_its_share_when_it_fits():
    # 100 kB a token (an 8B model in bfloat16 takes 128 KiB) and 210 MB free beside the overhead: a quarter of
    # the free memory holds 1,194 tokens (1,024 in pages), but one chat of 2,048 (205 MB) fits, so it gets that.
    per_token, free = 100_000, OVERHEAD_BYTES + 210_000_000
    assert plan_cache_tokens(8192, per_token, free) == 1024  # no floor asked: the share
    assert plan_cache_tokens(8192, per_token, free, min_tokens=2048) == 2048
    assert plan_cache_tokens(8192, per_token, free, min_tokens=2000) == 2048  # whole pages
    assert plan_cache_tokens(8192, per_token, free, min_tokens=4096) == 1024  # 410 MB does not fit: the share


def test_weight_layout_follows_the_loader(tiny_folder, starter_gguf):
    gguf, folder, cpu = read_model_info(starter_gguf), read_model_info(tiny_folder), torch.device("cpu")
    assert weight_layout(gguf, cpu, None) == (2, True)  # bfloat16, blocks kept
    assert weight_layout(gguf, cpu, torch.float32) == (4, False)  # float32 dequantizes
    assert weight_layout(folder, cpu, None) == (2, False)
    assert weight_layout(folder, cpu, torch.float32) == (4, False)
    assert weight_layout(folder, torch.device("cuda"), None) == (2, False)  # float32 checkpoints run in bfloat16


def test_a_load_that_would_not_fit_is_refused_before_any_weight_is_read(loop, service, free, tiny_folder):
    info = read_model_info(tiny_folder)
    need = service.check_fit(info, 1024)  # free memory not known yet: the figure, no refusal
    assert need.total_bytes == info.weights_bytes(4) + 2 * 2 * 2 * 16 * 4 * 1024 + OVERHEAD_BYTES
    free.bytes = need.total_bytes - 1
    task = service.load_model(tiny_folder, "tiny", context_length=1024)
    assert run(loop, task) is False and not service.is_loaded
    kinds = [e[0] for e in service.events]
    assert kinds == ["started", "refused", "failed"], kinds  # no progress: nothing was read
    refused, failed = service.events[1], service.events[2][1]
    assert refused[1] == str(tiny_folder) and 0 < refused[2] < 1024 and refused[2] % CONTEXT_STEP == 0
    assert f"{tiny_folder.name} needs about" in failed and "1,024-token context" in failed
    assert "pick a smaller context" in failed and f"up to {refused[2]:,} tokens" in failed

    free.bytes = need.total_bytes  # exactly enough: it loads, with the context asked for
    assert run(loop, service.load_model(tiny_folder, "tiny", context_length=1024))
    assert service.context_length == service.context_request == 1024


def test_the_previous_model_keeps_serving_after_a_refusal(loop, service, free, tiny_folder, tiny_llava_folder):
    assert run(loop, service.load_model(tiny_folder, "tiny", context_length=512))
    assert service.context_length == 512  # the chosen context caps the model's 1024
    free.bytes = 1000  # far too little for anything
    assert run(loop, service.load_model(tiny_llava_folder, "llava")) is False
    assert service.model_name == "tiny" and service.context_length == 512
    refused = next(e for e in service.events if e[0] == "refused")
    assert refused[2] == 0  # no context fits: none is offered
    assert "pick a smaller context" not in service.events[-1][1]
    ids = service.encode_chat([{"role": "user", "content": "hello"}])

    async def answer() -> list[dict]:
        return [r async for r in service.start_job(ids, {"top_k": 1}, max_new_tokens=3, seed=0)]

    assert run(loop, answer())[-1]["eos"]
