"""The context meter with a model whose images take a size-dependent number of tokens (tiny Qwen2-VL: dynamic
grids inside <|vision_start|>/<|vision_end|>): counted from the pictures' headers, it equals the prompt the
real embeddings make, for a small, a wide and a tall picture in one conversation.

Bad inputs tried: fewer picture sources than image parts (falls back to the nominal count, no error).
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from app.service import EngineService
from engine.vision.prompt import user_message

# The tiny Qwen2-VL folder builder of the model tests (tests are not a package, so load it by path).
_spec = importlib.util.spec_from_file_location(
    "qwen2_vl_model_tests", Path(__file__).parents[2] / "engine" / "models" / "qwen2_vl" / "test_qwen2_vl.py"
)
qwen = sys.modules.setdefault(_spec.name, importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(qwen)


def run(loop, coro):
    return loop.run_until_complete(asyncio.wait_for(coro, 60))


@pytest.fixture
def service(loop, tmp_path):
    folder = tmp_path / "qwen2-vl"
    folder.mkdir()
    qwen._build(folder, "qwen2_vl")
    svc = EngineService(dtype=torch.float32, page_size=16, max_cache_tokens=2048)
    svc.load_model(folder, "tiny-qwen2-vl")
    assert run(loop, svc.wait_loaded())
    yield svc
    run(loop, svc.close())


def test_the_meter_counts_each_picture_as_the_model_will(loop, service, tmp_path):
    sources = []
    for name, size in {"small": (16, 16), "wide": (60, 20), "tall": (24, 56)}.items():
        sources.append(tmp_path / f"{name}.png")
        Image.new("RGB", size, (200, 30, 30)).save(sources[-1])
    messages = [
        user_message("What is in these?", 2),
        {"role": "assistant", "content": "Two red boxes."},
        user_message("And this one?", 1),
    ]
    real = run(loop, service.embed_images(sources))
    assert len({e.num_tokens for e in real}) == 3  # the sizes give different runs
    expected = service.encode_chat(messages, "Be brief.", images=real).shape[-1]
    assert service.count_tokens(messages, "Be brief.", image_sources=sources) == expected
    nominal = service.count_tokens(messages, "Be brief.", image_sources=sources[:2])  # a source missing
    assert nominal != expected and nominal > 0
