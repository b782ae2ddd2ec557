"""The KV cache formats in the service's sizing (app/service/memory_plan.py, engine/memory_fit.py) and loads: the
bytes a token takes are exactly the Cache's in every format, a chosen context gets its whole cache, and a load
makes its Cache in the format asked for, or refuses one the model's heads cannot take before reading a weight.

Models: the tiny Llama with heads of 32 (tiny_wide_folder, quantized formats fit) and of 16 (tiny_folder).
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from app.service import EngineService
from app.service.memory_plan import MAX_CACHE_TOKENS, kv_bytes_per_token, plan_cache_tokens
from engine import Cache
from engine.memory_fit import NotEnoughMemoryError, check_memory
from engine.memory_fit import kv_bytes_per_token as engine_kv_bytes_per_token
from engine.model_info import read_model_info

TIMEOUT = 60
FORMATS = ("bf16", "q8", "q6", "q4")


def run(loop, coro):
    return loop.run_until_complete(asyncio.wait_for(coro, TIMEOUT))


@pytest.fixture
def service(loop):
    svc = EngineService(dtype=torch.float32, page_size=16, free_memory=lambda: 64 * 10**9)
    failures: list[str] = []
    svc.load_failed.connect(failures.append)
    svc.failures = failures
    yield svc
    run(loop, svc.close())


@pytest.mark.parametrize("kv_format", FORMATS)
def test_a_tokens_bytes_are_what_the_cache_allocates(tiny_wide_model, kv_format):
    per_token = kv_bytes_per_token(tiny_wide_model.config, tiny_wide_model.dtype, kv_format)
    cache = Cache(tiny_wide_model, 64, page_size=16, kv_format=kv_format)
    assert per_token == cache.bytes_per_token and per_token * 64 == cache.num_bytes  # scales included


def test_quantized_rows_count_their_scales_and_narrow_heads_are_refused():
    # Llama-3.1-8B: 32 layers, 8 KV heads of 128; a Q8 row is 4 blocks of (2-byte scale + 32 codes).
    assert engine_kv_bytes_per_token(32, 8, 128, 2) == 131072
    assert engine_kv_bytes_per_token(32, 8, 128, 2, "q8") == 2 * 32 * 8 * 4 * 34
    assert engine_kv_bytes_per_token(32, 8, 128, 2, "q6") == 2 * 32 * 8 * 4 * 26
    assert engine_kv_bytes_per_token(32, 8, 128, 2, "q4") == 2 * 32 * 8 * 4 * 18
    with pytest.raises(ValueError, match="blocks of 32.*heads have 16"):
        engine_kv_bytes_per_token(2, 2, 16, 4, "q4")
    with pytest.raises(ValueError, match="not one of"):
        engine_kv_bytes_per_token(2, 2, 32, 4, "q5")


def test_a_refusal_in_full_precision_says_what_q8_would_fit(tiny_wide_folder):
    info = read_model_info(tiny_wide_folder)
    need = check_memory(info, 1024, None, 4)
    free = need.total_bytes - 1  # 1,024 tokens of float32 cache do not quite fit; in Q8 they do
    with pytest.raises(NotEnoughMemoryError, match="With the Q8 cache format it fits with a context of up to 1,024"):
        check_memory(info, 1024, free, 4)
    assert check_memory(info, 1024, free, 4, kv_format="q8").kv_bytes < need.kv_bytes


def test_a_chosen_context_gets_its_whole_cache_past_the_usual_cap():
    assert plan_cache_tokens(131072, 1000, None) == MAX_CACHE_TOKENS  # no context chosen: the cap
    assert plan_cache_tokens(131072, 1000, None, min_tokens=131072) == 131072
    assert plan_cache_tokens(131072, 1000, 10**9, min_tokens=131072) == 131072  # 131 MB fit in 1 GB
    assert plan_cache_tokens(131072, 1000, 10**8, min_tokens=131072) == 24832  # not in 100 MB: a quarter of it


def test_a_load_makes_its_cache_in_the_format_asked_for(loop, service, tiny_wide_folder):
    assert run(loop, service.load_model(tiny_wide_folder, "wide", context_length=512, kv_format="q4"))
    cache = service.serving().cache
    assert service.kv_format == cache.kv_format == "q4" and cache.k[0].dtype == torch.uint8
    assert cache.bytes_per_token == kv_bytes_per_token(service.model.config, service.model.dtype, "q4")
    assert service.context_length == 512

    assert run(loop, service.load_model(tiny_wide_folder, "wide", context_length=512))  # the default: full precision
    assert service.kv_format == "bf16" and service.serving().cache.k[0].dtype == torch.float32


def test_a_format_the_heads_cannot_take_is_refused_before_loading(loop, service, tiny_folder):
    progress: list[float] = []
    service.loading_progress.connect(progress.append)
    assert not run(loop, service.load_model(tiny_folder, "tiny", kv_format="q8"))
    assert progress == [] and not service.is_loaded  # no weight was read
    assert (
        "A Q8 cache packs each head's values in blocks of 32, and this model's heads have 16" in (service.failures[-1])
    )
    assert "use full precision" in service.failures[-1]
