"""The model manager on the real engine, a real qasync loop and a real SQLite store.

Bad inputs tried: a path that does not exist, a file that is not .gguf, a model folder without
config.json, a truncated .gguf, an empty repo id, a download with the Hub out of reach
(HF_ENDPOINT=http://127.0.0.1:9, where nothing listens).
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PySide6.QtWidgets import QLabel

from app.service import EngineService
from app.service.catalog import demo_vision_path
from app.store import Store
from app.ui.compare_view import CompareView
from app.ui.model_manager import PROGRESS_STEPS, ModelManager
from engine.loading.starter import STARTER_NAME

GREEDY = {"temperature": 1.0, "top_k": 1, "token_repetition_penalty": 1.0}


@pytest.fixture
def store(app_store):
    return app_store  # tests/app/ui/conftest.py: a fresh Store under TANDEM_DATA_DIR=tmp_path/data


@pytest.fixture
def service(run):
    svc = EngineService(dtype=torch.float32)
    yield svc
    run(svc.close())


@pytest.fixture
def manager(qtbot, store, service):
    m = ModelManager(store, service)
    qtbot.addWidget(m)
    m.show()
    return m


def write_tiny_gguf(path: Path) -> Path:
    """A one-layer random Llama in GGUF with a byte-level BPE vocabulary, as llama.cpp lays it out."""
    import gguf

    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *map(chr, range(ord("a"), ord("z") + 1)), "Ġ", "Ġt"]
    vocab, hidden, ffn, heads, kv_heads = len(tokens), 64, 96, 4, 2
    head_dim = hidden // heads
    rng = np.random.default_rng(0)

    def w(*shape: int) -> np.ndarray:
        return rng.normal(0.0, 0.2, size=shape).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-gguf")
    writer.add_block_count(1)
    writer.add_context_length(512)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_rope_dimension_count(head_dim)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3, 3] + [1] * (vocab - 3))  # 3 = control, 1 = normal
    writer.add_token_merges(["Ġ t"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    shapes = {
        "token_embd.weight": (vocab, hidden),
        "output_norm.weight": (hidden,),
        "output.weight": (vocab, hidden),
        "blk.0.attn_norm.weight": (hidden,),
        "blk.0.attn_q.weight": (hidden, hidden),
        "blk.0.attn_k.weight": (kv_heads * head_dim, hidden),
        "blk.0.attn_v.weight": (kv_heads * head_dim, hidden),
        "blk.0.attn_output.weight": (hidden, hidden),
        "blk.0.ffn_norm.weight": (hidden,),
        "blk.0.ffn_gate.weight": (ffn, hidden),
        "blk.0.ffn_up.weight": (ffn, hidden),
        "blk.0.ffn_down.weight": (hidden, ffn),
    }
    for name, shape in shapes.items():
        writer.add_tensor(name, w(*shape))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "small-llama.gguf")


@pytest.fixture
def broken_models(tmp_path, tiny_folder, tiny_gguf) -> tuple[Path, Path]:
    """A model folder without config.json and a .gguf cut off halfway through its tensors."""
    folder = tmp_path / "no-config"
    shutil.copytree(tiny_folder, folder)
    (folder / "config.json").unlink()
    corrupt = tmp_path / "corrupt.gguf"
    data = tiny_gguf.read_bytes()
    corrupt.write_bytes(data[: len(data) // 2])
    return folder, corrupt


def load_through(run, manager, path) -> tuple[bool, list[int], list[bool]]:
    """Select `path` in the list and press Load; returns (loaded, progress values, bar visible at each)."""
    values, visible = [], []

    def seen(value: int) -> None:
        values.append(value)
        visible.append(manager.progress_bar.isVisible())

    async def press_load() -> bool:
        manager.load_button.click()  # inside the running loop, as in the app
        return await manager.service.wait_loaded()

    manager.progress_bar.valueChanged.connect(seen)
    try:
        assert manager.select_path(path)
        ok = run(press_load())
    finally:
        manager.progress_bar.valueChanged.disconnect(seen)
    return ok, values, visible


def answer(run, service, n: int = 4) -> str:
    async def go() -> list[dict]:
        ids = service.encode_chat([{"role": "user", "content": "hello there"}])
        return [r async for r in service.start_job(ids, GREEDY, max_new_tokens=n, seed=0)]

    results = run(go())
    assert results[-1]["eos"] and results[-1]["new_tokens"] >= 1
    return "".join(r.get("text", "") for r in results)


def test_added_models_are_remembered_across_managers(qtbot, manager, store, service, tiny_folder, tiny_gguf, tmp_path):
    assert manager.paths()[0].endswith(STARTER_NAME) and "starter" in manager.model_list.item(0).text()
    assert manager.add_model(tiny_folder).path == str(tiny_folder.resolve())
    assert manager.add_model(tiny_gguf, name="my gguf").name == "my gguf"
    assert manager.selected_path() == str(tiny_gguf.resolve())
    assert not manager.error_label.isVisible()
    # Each entry says what it is, read from its header without loading it.
    texts = [manager.model_list.item(i).text() for i in range(manager.model_list.count())]
    assert any("LlamaForCausalLM" in t for t in texts) and any("my gguf" in t and "llama" in t for t in texts)

    missing = tmp_path / "nowhere"
    assert manager.add_model(missing) is None
    assert manager.error_label.isVisible() and str(missing) in manager.error_label.text()
    not_gguf = tmp_path / "notes.txt"
    not_gguf.write_text("hi")
    assert manager.add_model(not_gguf) is None and "not a .gguf" in manager.error_label.text()
    assert len(store.models.all()) == 2

    # A new store on the same file and a new manager: both models are still there, the starter first.
    again = Store()
    try:
        other = ModelManager(again, service)
        qtbot.addWidget(other)
        # After the starter (and the bundled demo vision model, once it is trained into assets/).
        bundled = 2 if (demo_vision_path() / "config.json").is_file() else 1
        assert other.paths()[bundled:] == [str(tiny_folder.resolve()), str(tiny_gguf.resolve())]
        other.remove_model(str(tiny_folder.resolve()))
        assert [e.path for e in again.models.all()] == [str(tiny_gguf.resolve())]
        assert other.paths()[bundled:] == [str(tiny_gguf.resolve())]
    finally:
        again.close()


def test_selecting_a_model_loads_it_with_a_moving_progress_bar(run, manager, service, tiny_folder, tiny_gguf):
    manager.add_model(tiny_folder, name="tiny")
    manager.add_model(tiny_gguf)
    for path, name in ((tiny_folder, "tiny"), (tiny_gguf, "small-llama")):
        ok, values, visible = load_through(run, manager, path)
        assert ok and service.model_path == path.resolve() and service.model_name == name
        assert len(set(values)) >= 3, values  # it moved through steps, not just empty -> full
        assert any(0 < v < PROGRESS_STEPS for v in values) and values[-1] == PROGRESS_STEPS
        assert values == sorted(values) and all(visible[:-1])
        assert not manager.progress_bar.isVisible() and manager.status_label.text() == f"Loaded: {name}"
        loaded_rows = [manager.model_list.item(i).text() for i in range(manager.model_list.count())]
        assert [t.startswith("● ") for t in loaded_rows].count(True) == 1
        assert manager.model_list.currentItem().text().startswith("● ")
        assert answer(run, service) is not None


def test_broken_models_show_the_file_and_keep_the_previous_model(run, manager, service, tiny_folder, broken_models):
    manager.add_model(tiny_folder, name="tiny")
    assert load_through(run, manager, tiny_folder)[0]
    before = answer(run, service, 6)
    no_config, corrupt = broken_models
    for bad, named in ((no_config, "config.json"), (corrupt, "corrupt.gguf")):
        assert manager.add_model(bad) is not None  # remembered; the list and the load say what is wrong
        item = manager.model_list.currentItem()
        assert "cannot be read" in item.text() and named in item.toolTip()
        ok, _, _ = load_through(run, manager, bad)
        assert not ok
        message = manager.error_label.text()
        assert manager.error_label.isVisible() and str(bad) in message and named in message, message
        assert "previous model, tiny, is still loaded" in message
        assert service.model_name == "tiny" and service.model_path == tiny_folder.resolve()
        assert manager.status_label.text() == "Loaded: tiny" and manager.load_button.isEnabled()
        assert answer(run, service, 6) == before  # the previous model still answers, the same way
    # Choosing the model still loaded clears the error; it is not loaded again.
    load_through(run, manager, tiny_folder)
    assert not manager.error_label.isVisible() and manager.status_label.text() == "tiny is already loaded."
    assert service.model_path == tiny_folder.resolve() and answer(run, service, 6) == before


def test_switching_models_stops_running_compare_jobs_cleanly(
    run, qtbot, manager, store, service, tiny_folder, tiny_gguf
):
    manager.add_model(tiny_folder, name="tiny")
    manager.add_model(tiny_gguf)
    assert load_through(run, manager, tiny_folder)[0]
    view = CompareView(store, service)
    qtbot.addWidget(view)
    view.set_column_count(2)
    for column in view.columns:  # no end-of-turn token: the columns are still running at the switch
        eos = sorted(service.tokenizer.eos_token_ids)
        column.set_settings({**column.settings(), "max_new_tokens": 500, "disallowed_tokens": eos})
    view.set_prompt("one two three")

    async def switch_midway() -> bool:
        task = view.start()
        while not all(c.num_tokens >= 2 for c in view.columns):
            await asyncio.sleep(0.01)
        manager.load(tiny_gguf)
        finished = await task
        assert await service.wait_loaded()
        return finished

    assert run(switch_midway()) is False
    assert service.model_name == "small-llama" and not view.is_running()
    for column in view.columns:
        assert column.error is None and column.stats["eos_reason"] == "stopped" and column.text
    assert answer(run, service) is not None


def test_starter_entry_loads_the_starter(run, manager, service, data_dir, starter_gguf):
    # The fetched starter, put where this data folder keeps it: the manager loads it without a download.
    (data_dir / "models").mkdir(parents=True, exist_ok=True)
    (data_dir / "models" / STARTER_NAME).symlink_to(starter_gguf)
    manager.refresh()
    assert "downloaded" in manager.model_list.item(0).text()
    ok, values, _ = load_through(run, manager, manager.paths()[0])
    assert ok and service.model_name == Path(STARTER_NAME).stem and values[-1] == PROGRESS_STEPS
    assert manager.model_list.item(0).text().startswith("● ")


@pytest.mark.timing
def test_download_offline_says_so_quickly(qtbot, manager, store, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    manager.download("   ")
    assert "repo id" in manager.download_label.text() and not manager.is_downloading()

    start = time.monotonic()
    manager.repo_edit.setText("HuggingFaceTB/SmolLM2-135M-Instruct")
    manager.download_button.click()
    # The button is re-enabled only by a queued signal, so it is still disabled here however fast the
    # worker thread fails (is_downloading() may already be False: an offline failure takes milliseconds).
    assert not manager.download_button.isEnabled()
    qtbot.waitUntil(lambda: manager.download_button.isEnabled(), timeout=30_000)
    elapsed = time.monotonic() - start
    text = manager.download_label.text()
    assert "offline" in text and "127.0.0.1:9" in text and "SmolLM2-135M-Instruct" in text, text
    assert elapsed < 20, elapsed
    assert not manager.download_progress.isVisible()
    assert store.models.all() == []  # nothing half-downloaded was remembered


def test_a_download_that_fails_before_download_returns_still_reports_afterwards(qtbot, manager, monkeypatch):
    """A failure can finish before download() adds its done-callback, which then runs inside download(): the
    message must still arrive after download() returns (queued), with the button re-enabled then."""
    from concurrent.futures import Future

    import app.ui.download_box as download_box

    def failed_already(*args, **kwargs) -> Future:
        future: Future = Future()
        future.set_exception(OSError("offline: nothing listens on 127.0.0.1:9"))
        return future

    monkeypatch.setattr(download_box, "submit", failed_already)
    manager.repo_edit.setText("HuggingFaceTB/SmolLM2-135M-Instruct")
    manager.download_button.click()
    assert not manager.download_button.isEnabled()  # the failure has not been shown yet
    qtbot.waitUntil(lambda: manager.download_button.isEnabled(), timeout=5_000)
    assert "offline" in manager.download_label.text()
    assert not manager.download_progress.isVisible()


def write_projector(path: Path, projector_type: str) -> Path:
    """A header-only llama.cpp projector file (mmproj): what the manager and the loader read first."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_string("clip.projector_type", projector_type)
    writer.add_uint32("clip.vision.projection_dim", 64)
    writer.add_tensor("v.post_ln.weight", np.ones(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_projector_file_is_not_added_as_a_model(manager, store, tmp_path):
    write_projector(tmp_path / "mmproj-model-f16.gguf", "idefics3")
    before = len(store.models.all())
    assert manager.add_model(tmp_path / "mmproj-model-f16.gguf") is None
    assert "vision projector (mmproj)" in manager.error_label.text() and "text .gguf" in manager.error_label.text()
    assert len(store.models.all()) == before


def test_a_gguf_whose_projector_cannot_pair_loads_text_only_and_says_why(run, manager, service, tmp_path):
    text = write_tiny_gguf(tmp_path / "small-llama.gguf")
    write_projector(tmp_path / "mmproj-small-llama.gguf", "cogvlm")
    manager.add_model(text)
    ok, _, _ = load_through(run, manager, text)
    assert ok and service.model_path == text.resolve()
    status = manager.status_label.text()
    assert status.startswith("Loaded: small-llama. Images are off: ") and "'cogvlm' projector" in status
    assert answer(run, service) is not None  # the text model works


def test_manager_names_the_families_it_runs_and_marks_vision_models(manager, tiny_llava_folder):
    # by the names users know them by ("Gemma3ForCausalLM" told a newcomer nothing), each once
    text_line, vision_line = manager.supported_label.text().split("\n")
    assert "For" not in text_line + vision_line
    for family in ("Llama", "Qwen3", "Gemma 3", "Mistral"):
        assert family in text_line.split(": ")[1].rstrip(".").split(", "), family
    for family in ("LLaVA", "Qwen2.5-VL", "Qwen2-VL", "Mistral Small 3.1", "SmolVLM", "Gemma 3"):
        assert family in vision_line.split(": ")[1].rstrip(".").split(", "), family
    assert vision_line.count("Gemma 3") == 1
    manager.add_model(tiny_llava_folder)
    row = next(
        manager.model_list.item(i).text()
        for i in range(manager.model_list.count())
        if "LlavaForConditionalGeneration" in manager.model_list.item(i).text()
    )
    assert "sees images" in row


def test_a_long_download_error_shows_whole_and_clips_nothing(qtbot, manager):
    # The offline Hugging Face error runs to five lines; in a dialog as tall as the screen it was cut off and
    # overlapped the speculation help above it.
    manager.resize(920, 780)
    manager.show()
    message = "Could not download x/y: " + "We couldn't connect to 'https://huggingface.co' to load the files. " * 6
    manager.download_box._set_message(message, error=True)

    def nothing_clipped() -> bool:
        labels = [w for w in manager.findChildren(QLabel) if w.isVisible() and w.wordWrap() and w.text()]
        return all(w.height() >= w.heightForWidth(w.width()) for w in labels)

    qtbot.waitUntil(nothing_clipped, timeout=2000)
    assert manager.download_box.label.text() == message


def test_an_old_error_goes_once_another_model_loads(qtbot, run, manager, service, tiny_folder, tmp_path):
    # a failed download's message stayed under a model loaded since, as if that load had failed
    manager.download("   ")  # refused: no repo id
    manager.add_model(tmp_path / "no-such-model")  # refused: no such path
    assert manager.download_box.label.property("error") and manager.error_label.isVisible()

    async def load_elsewhere() -> bool:  # the window's Model -> Open, not this dialog's Load button
        service.load_model(tiny_folder, "tiny")
        return await service.wait_loaded()

    assert run(load_elsewhere())
    qtbot.waitUntil(lambda: manager.status_label.text() == "Loaded: tiny", timeout=5000)  # the signal arrived
    assert not manager.download_box.label.property("error") and not manager.error_label.isVisible()
    assert "repo id" not in manager.download_label.text() and "internet" in manager.download_label.text()
