"""The model manager's card and its loading rules, on real widgets, the real engine and a real store.

Models: a GGUF written by tools/make_bench_model.py (2 layers, hidden 256, the starter's vocabulary, a 131,072
token context), the tiny Llama and LLaVA folders, the starter as the catalog knows it before its download, and
a .gguf of garbage. Double-clicking the model already loaded does not load it again.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from PySide6.QtCore import Qt

from app.service import EngineService
from app.ui.model_manager import CONTEXT_SETTING, ModelManager
from engine.loading.starter import STARTER_NAME
from engine.memory_fit import format_bytes

_SPEC = importlib.util.spec_from_file_location(
    "make_bench_model", Path(__file__).resolve().parents[3] / "tools" / "make_bench_model.py"
)
bench = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = bench  # its dataclasses look their module up there
_SPEC.loader.exec_module(bench)

SHAPE = {"hidden": 256, "num_heads": 4, "num_kv_heads": 2, "head_dim": 64, "ffn_hidden": 512}


@pytest.fixture(scope="module")
def bench_gguf(tmp_path_factory, starter_gguf) -> Path:
    path = tmp_path_factory.mktemp("card") / "bench-tiny-Q4_K_M.gguf"
    return bench.write_bench_model(path, "Q4_K_M", 2, tokenizer_gguf=starter_gguf, context_length=131072, **SHAPE)


@pytest.fixture
def service(run):
    svc = EngineService(dtype=torch.float32, free_memory=lambda: 64 * 10**9)  # plenty: nothing is refused here
    yield svc
    run(svc.close())


@pytest.fixture
def manager(qtbot, app_store, service):
    m = ModelManager(app_store, service)
    qtbot.addWidget(m)
    m.show()
    return m


def row_of(manager, path) -> int:
    return manager.paths().index(str(Path(path).resolve()))


def test_the_card_shows_what_a_gguf_is_and_what_it_needs(manager, app_store, bench_gguf):
    manager.add_model(bench_gguf)
    card = manager.card
    assert card.value("Architecture") == "llama"
    assert card.value("Parameters") == "13.8M"  # 49,152 x 256 embeddings and two layers
    assert card.value("Quantization") == "Q4_K_M"
    assert card.value("Size on disk") == format_bytes(bench_gguf.stat().st_size)
    assert card.value("Context") == "131,072 tokens" and card.value("Images") == "text only"
    assert card.context_tokens() == 131072  # the default: the largest that fits, here the model's own
    text = card.memory_label.text()
    assert "at 131,072 tokens" in text and "64.0 GB free now" in text and card.fits(), text
    row = manager.model_list.item(row_of(manager, bench_gguf)).text()
    assert "Q4_K_M" in row and "13.8M parameters" in row

    card.context_spin.setValue(4096)  # the user's choice is remembered for every model
    assert app_store.get_setting(CONTEXT_SETTING) == 4096 and "at 4,096 tokens" in card.memory_label.text()


def test_the_context_is_capped_per_model_and_vision_models_say_so(manager, app_store, tiny_llava_folder):
    app_store.set_setting(CONTEXT_SETTING, 4096)
    manager.add_model(tiny_llava_folder)
    card = manager.card
    assert card.value("Images") == "sees images" and card.value("Context") == "1,024 tokens"
    assert card.context_tokens() == 1024 and card.context_spin.maximum() == 1024
    assert app_store.get_setting(CONTEXT_SETTING) == 4096  # capping for this model is not a new choice


def test_the_starter_has_a_card_before_it_is_downloaded_and_broken_files_say_why(manager, tmp_path):
    manager.select_path(manager.paths()[0])  # this data folder has no starter yet
    assert manager.paths()[0].endswith(STARTER_NAME) and not Path(manager.paths()[0]).exists()
    card = manager.card
    assert card.value("Quantization") == "Q4_1" and card.value("Parameters") == "134.5M"
    assert card.value("Context") == "8,192 tokens" and "Downloaded when you load it" in card.note_label.text()
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + bytes(100))
    manager.add_model(junk)
    assert card.info is None and "junk.gguf" in card.note_label.text() and not card.context_spin.isEnabled()


def test_double_clicking_the_loaded_model_does_not_load_it_again(qtbot, run, manager, service, tiny_folder):
    manager.add_model(tiny_folder, name="tiny")

    async def load_and_wait(action) -> bool:
        action()
        return await service.wait_loaded()

    assert run(load_and_wait(manager.load_button.click))
    model, starts = service.model, []
    service.loading_started.connect(starts.append)
    item = manager.model_list.item(row_of(manager, tiny_folder))
    rect = manager.model_list.visualItemRect(item)

    async def double_click() -> None:
        viewport, left = manager.model_list.viewport(), Qt.MouseButton.LeftButton
        qtbot.mouseClick(viewport, left, pos=rect.center())  # as a user's: the view acts on a pressed row only
        qtbot.mouseDClick(viewport, left, pos=rect.center())
        await asyncio.sleep(0.3)  # a load would have started by now

    clicks = []
    manager.model_list.itemDoubleClicked.connect(lambda clicked: clicks.append(clicked.text()))
    run(double_click())
    assert clicks == [item.text()] and starts == [] and service.model is model and not service.is_loading
    assert manager.status_label.text() == "tiny is already loaded."
    run(load_and_wait(manager.load_button.click))  # Load at the same context: the same
    assert starts == [] and service.model is model

    manager.card.context_spin.setValue(512)  # Load at another context loads it again, with that context
    assert run(load_and_wait(manager.load_button.click))
    assert starts == ["tiny"] and service.model is not model and service.context_length == 512
