"""A model that will not fit in free memory is refused before loading, with what to do, and the window offers
the longest context that fits.

The model is a real GGUF written by tools/make_bench_model.py (2 layers, hidden 256, the starter's vocabulary,
a 131,072-token context); the free memory is a figure handed to the real EngineService (its `free_memory`
argument), set just below what the model needs at the default context.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from app.service import EngineService
from app.ui.model_manager import CONTEXT_SETTING, ModelManager
from engine.model_info import read_model_info

_SPEC = importlib.util.spec_from_file_location(
    "make_bench_model", Path(__file__).resolve().parents[3] / "tools" / "make_bench_model.py"
)
bench = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = bench  # its dataclasses look their module up there
_SPEC.loader.exec_module(bench)

SHAPE = {"hidden": 256, "num_heads": 4, "num_kv_heads": 2, "head_dim": 64, "ffn_hidden": 512}


@pytest.fixture(scope="module")
def bench_gguf(tmp_path_factory, starter_gguf) -> Path:
    path = tmp_path_factory.mktemp("memory") / "bench-tiny-Q4_K_M.gguf"
    return bench.write_bench_model(path, "Q4_K_M", 2, tokenizer_gguf=starter_gguf, context_length=131072, **SHAPE)


class FreeMemory:
    """The free-memory figure the test gives the service; None (not known: nothing refused) until set."""

    bytes: int | None = None

    def __call__(self) -> int | None:
        return self.bytes


@pytest.fixture
def free():
    return FreeMemory()


@pytest.fixture
def service(run, free):
    svc = EngineService(dtype=torch.float32, free_memory=free)
    yield svc
    run(svc.close())


@pytest.fixture
def manager(qtbot, app_store, service):
    m = ModelManager(app_store, service)
    qtbot.addWidget(m)
    m.show()
    return m


def press(run, button, service) -> bool:
    async def go() -> bool:
        button.click()  # inside the running loop, as in the app
        return await service.wait_loaded()

    return run(go())


def test_a_model_that_does_not_fit_is_refused_and_loads_at_the_context_offered(
    run, manager, app_store, service, free, bench_gguf, tiny_folder
):
    manager.add_model(tiny_folder, name="tiny")
    assert press(run, manager.load_button, service)  # the model in use before the attempt

    info = read_model_info(bench_gguf)
    free.bytes = service.check_fit(info, 2048).total_bytes + 100_000  # 2,048 tokens fit, 8,192 do not
    app_store.set_setting(CONTEXT_SETTING, 8192)  # chosen earlier (none chosen: the largest that fits)
    manager.add_model(bench_gguf)
    card = manager.card
    assert card.context_tokens() == 8192 and card.fits() is False
    assert card.memory_label.text().startswith("Does not fit: needs about") and "Up to 2,048 tokens fit" in (
        card.memory_label.text()
    )

    progress = []
    service.loading_progress.connect(progress.append)
    assert not press(run, manager.load_button, service)
    assert progress == []  # refused before any weight was read
    message = manager.error_label.text()
    assert manager.error_label.isVisible()
    assert "bench-tiny-Q4_K_M.gguf needs about" in message and "at a 8,192-token context but" in message
    assert "is free. Close other programs, pick a smaller context, or a smaller quantization" in message
    assert "up to 2,048 tokens" in message and "previous model, tiny, is still loaded" in message
    assert service.model_name == "tiny" and manager.load_button.isEnabled()  # the app stays usable
    assert manager.fit_button.isVisible() and manager.fit_button.text() == "Load with a 2,048-token context"

    assert press(run, manager.fit_button, service)
    assert service.model_name == "bench-tiny-Q4_K_M" and service.context_length == 2048
    assert app_store.get_setting(CONTEXT_SETTING) == 2048 and card.context_tokens() == 2048
    assert not manager.fit_button.isVisible() and not manager.error_label.isVisible()
    assert manager.status_label.text() == "Loaded: bench-tiny-Q4_K_M"


def test_a_model_too_big_at_any_context_offers_none(run, manager, service, free, bench_gguf):
    free.bytes = 50_000_000  # less than the weights alone (55 MB in float32)
    manager.add_model(bench_gguf)
    assert not press(run, manager.load_button, service) and not service.is_loaded
    message = manager.error_label.text()
    assert "is free. Close other programs, or pick a smaller quantization or model." in message, message
    assert "smaller context" not in message and not manager.fit_button.isVisible()
