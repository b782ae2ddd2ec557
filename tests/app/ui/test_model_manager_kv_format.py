"""The model manager's context and KV cache format, on real widgets, the real engine and a real store: the memory
each format needs at the shown context, the default context (the largest that fits in free memory, for the chosen
format), the choice saved and used by the load, and the formats a model's heads cannot take.

Models: a GGUF written by tools/make_bench_model.py (2 layers, 2 KV heads of 64, a 131,072-token context), the tiny
Llama with heads of 32 (quantized formats fit) and with heads of 16 (they do not). The free memory is a figure
handed to the real EngineService (its `free_memory` argument); the service computes in float32, so a full-precision
cache takes 4 bytes a value.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from PySide6.QtCore import Qt

from app.service import EngineService
from app.service.memory_plan import kv_bytes_per_token
from app.ui.model_manager import CONTEXT_SETTING, KV_FORMAT_SETTING, ModelManager
from app.ui.window_model import local_status
from engine.memory_fit import format_bytes
from engine.model_info import read_model_info

_SPEC = importlib.util.spec_from_file_location(
    "make_bench_model", Path(__file__).resolve().parents[3] / "tools" / "make_bench_model.py"
)
bench = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = bench  # its dataclasses look their module up there
_SPEC.loader.exec_module(bench)

SHAPE = {"hidden": 256, "num_heads": 4, "num_kv_heads": 2, "head_dim": 64, "ffn_hidden": 512}
# Bytes a token takes in the bench model's cache: keys and values * 2 layers * 2 KV heads * one head row of 64
# (float32: 256 bytes; Q8: 2 blocks of a 2-byte scale + 32 codes = 68; Q4: 2 * (2 + 16) = 36).
PER_TOKEN = {"bf16": 8 * 256, "q8": 8 * 68, "q6": 8 * 52, "q4": 8 * 36}


@pytest.fixture(scope="module")
def bench_gguf(tmp_path_factory, starter_gguf) -> Path:
    path = tmp_path_factory.mktemp("kv-format") / "bench-tiny-Q4_K_M.gguf"
    return bench.write_bench_model(path, "Q4_K_M", 2, tokenizer_gguf=starter_gguf, context_length=131072, **SHAPE)


class FreeMemory:
    """The free-memory figure the test gives the service (64 GB until a test sets another)."""

    bytes: int | None = 64 * 10**9

    def __call__(self) -> int | None:
        return self.bytes


@pytest.fixture
def free():
    return FreeMemory()


@pytest.fixture
def service(run, free):
    svc = EngineService(dtype=torch.float32, page_size=16, free_memory=free)
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


def format_items(card) -> dict[str, tuple[str, bool, str]]:
    """The format list as a user sees it: format -> (text, enabled, tooltip)."""
    combo = card.format_combo
    return {
        combo.itemData(i): (
            combo.itemText(i),
            combo.model().item(i).isEnabled(),
            combo.itemData(i, Qt.ItemDataRole.ToolTipRole),
        )
        for i in range(combo.count())
    }


def test_the_memory_shown_follows_the_format(manager, app_store, bench_gguf):
    app_store.set_setting(CONTEXT_SETTING, 32768)
    manager.add_model(bench_gguf)
    card = manager.card
    assert card.kv_format() == "bf16" and card.context_tokens() == 32768  # nothing chosen: full precision
    full = format_bytes(32768 * PER_TOKEN["bf16"])
    assert card.cache_label.text() == f"32,768 tokens · Full precision · {full}"
    items = format_items(card)
    for kv_format, note in (("q8", " (recommended)"), ("q6", ""), ("q4", "")):
        text, enabled, tip = items[kv_format]
        assert enabled and text == f"{kv_format.upper()} · {format_bytes(32768 * PER_TOKEN[kv_format])}{note}", text
        assert "memory of full precision" in tip
    assert items["bf16"][0] == f"Full precision · {full}"
    total_full = card.memory_label.text()

    card.format_combo.setCurrentIndex(card.format_combo.findData("q8"))  # as the user picks it
    q8 = format_bytes(32768 * PER_TOKEN["q8"])
    assert card.kv_format() == "q8" and card.cache_label.text() == f"32,768 tokens · Q8 · {q8}"
    assert f"cache {q8}" in card.memory_label.text() and card.memory_label.text() != total_full
    assert app_store.get_setting(KV_FORMAT_SETTING) == "q8"  # saved for the next load and the next run

    card.set_context(8192)  # the memory updates with the context too, in the chosen format
    assert card.cache_label.text() == f"8,192 tokens · Q8 · {format_bytes(8192 * PER_TOKEN['q8'])}"
    assert format_items(card)["q4"][0] == f"Q4 · {format_bytes(8192 * PER_TOKEN['q4'])}"


def test_the_default_context_is_the_largest_that_fits_for_the_format(
    run, manager, app_store, service, free, bench_gguf
):
    info = read_model_info(bench_gguf)
    free.bytes = service.check_fit(info, 8192, "q8").total_bytes + 1000  # 8,192 tokens of Q8 and 1 kB
    app_store.set_setting(KV_FORMAT_SETTING, "q8")
    manager.add_model(bench_gguf)
    card = manager.card
    assert card.kv_format() == "q8" and card.is_largest_context()
    assert card.context_tokens() == 8192 and card.fits()
    assert card.cache_label.text().endswith("(the largest that fits)")

    room = 8192 * PER_TOKEN["q8"] + 1000  # what the cache may take; contexts come in pages of 256
    card.set_kv_format("q4")
    assert card.context_tokens() == room // PER_TOKEN["q4"] // 256 * 256 == 15360 and card.fits()
    card.set_kv_format("bf16")
    assert card.context_tokens() == room // PER_TOKEN["bf16"] // 256 * 256 == 2048 and card.fits()
    assert app_store.get_setting(CONTEXT_SETTING) is None  # still none chosen: it follows the format

    card.set_context(1024)  # a context the user picks stays when the format changes
    card.set_kv_format("q4")
    assert card.context_tokens() == 1024 and not card.is_largest_context()
    assert app_store.get_setting(CONTEXT_SETTING) == 1024
    card.largest_button.click()  # and "Largest that fits" goes back to following memory
    assert card.context_tokens() == 15360 and app_store.get_setting(CONTEXT_SETTING) is None

    assert press(run, manager.load_button, service)  # the load gets what the card showed
    assert service.kv_format == "q4" and service.context_length == service.context_request == 15360
    assert service.serving().cache.max_seq_len >= 15360
    assert manager.status_label.text() == "Loaded: bench-tiny-Q4_K_M"


def test_a_q4_load_makes_a_q4_cache_and_the_status_says_so(run, manager, app_store, service, tiny_wide_folder):
    manager.add_model(tiny_wide_folder, name="wide")
    card = manager.card
    card.set_kv_format("q4")
    assert card.kv_format() == "q4" and card.context_tokens() == 1024  # the model's own: 64 GB are free
    assert press(run, manager.load_button, service)
    cache = service.serving().cache
    assert cache.kv_format == "q4" and cache.k[0].dtype == torch.uint8
    assert cache.bytes_per_token == kv_bytes_per_token(service.model.config, service.model.dtype, "q4")
    assert local_status(service) == "Model: wide · context 1024 tokens · Q4 cache"

    starts: list[str] = []
    service.loading_started.connect(starts.append)
    press(run, manager.load_button, service)  # the same context and format: not loaded again
    assert starts == [] and manager.status_label.text() == "wide is already loaded."
    card.set_kv_format("q8")  # another format is another load
    assert press(run, manager.load_button, service)
    assert starts == ["wide"] and service.kv_format == "q8" and service.context_length == 1024
    assert local_status(service) == "Model: wide · context 1024 tokens · Q8 cache"


def test_formats_a_models_heads_cannot_take_are_disabled(run, manager, app_store, service, tiny_folder):
    app_store.set_setting(KV_FORMAT_SETTING, "q8")  # chosen for another model
    manager.add_model(tiny_folder, name="tiny")
    card = manager.card
    items = format_items(card)
    assert items["bf16"][1] and card.kv_format() == "bf16"  # full precision: the one this model takes
    for kv_format in ("q8", "q6", "q4"):
        text, enabled, tip = items[kv_format]
        assert not enabled and "·" not in text, text  # no memory figure for a format it cannot use
        assert tip.startswith("Not for this model:") and "blocks of 32" in tip and "heads have 16" in tip, tip
    card.set_kv_format("q4")
    assert card.kv_format() == "bf16"
    assert app_store.get_setting(KV_FORMAT_SETTING) == "q8"  # showing this model is not a new choice

    assert press(run, manager.load_button, service)
    assert service.kv_format == "bf16"
    assert local_status(service) == f"Model: tiny · context {service.context_length} tokens · full-precision cache"


def test_file_open_loads_with_the_cards_context_and_format(run, qtbot, app_store, service, tiny_wide_folder):
    """Model → Open… takes the same choice as the model manager's Load (saved settings), not full precision."""
    from PySide6.QtWidgets import QFileDialog, QWidget

    from app.ui.window_model import ModelSide

    class Window(ModelSide, QWidget):  # the main window's side of model loading, on a plain widget
        def __init__(self):
            super().__init__()
            self.store, self.service = app_store, service

    window = Window()
    qtbot.addWidget(window)
    app_store.set_setting(KV_FORMAT_SETTING, "q6")
    app_store.set_setting(CONTEXT_SETTING, 512)
    window.ask_open_model()
    (dialog,) = window.findChildren(QFileDialog)

    async def pick() -> bool:
        dialog.fileSelected.emit(str(tiny_wide_folder / "config.json"))  # a folder is picked by its config.json
        return await service.wait_loaded()

    assert run(pick())
    dialog.reject()
    assert service.kv_format == "q6" and service.context_length == 512
    assert service.serving().cache.kv_format == "q6"
