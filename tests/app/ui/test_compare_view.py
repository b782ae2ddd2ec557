"""The compare view on the real engine (tiny model), a real qasync loop and a real SQLite store.

Bad inputs tried: an empty prompt, no model loaded, a column count of 1 and 5, an export path with an
unknown suffix, a prompt longer than the model's context (the run refuses it and starts no job).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch

from app.service import EngineService
from app.ui.compare_view import CompareView
from engine import Cache, DynamicGenerator, DynamicJob, SamplerSettings

ARTIFACTS = Path(__file__).resolve().parents[3] / "test-artifacts"
# Long enough to fill a whole 256-token page of the tiny byte-level tokenizer, so columns can share it.
PROMPT = (
    "Tandem runs several chats at once over one paged cache. The quick brown fox jumps over the lazy dog. "
    "One two three four five six seven eight nine ten. def add(a, b): return a + b. "
) * 5 + "Now write one more sentence."


@pytest.fixture
def store(app_store):
    return app_store  # tests/app/ui/conftest.py: a fresh Store under TANDEM_DATA_DIR=tmp_path/data


async def load(service, path, name=None) -> bool:
    service.load_model(path, name)  # from inside the running loop, as a button press in the app is
    return await service.wait_loaded()


@pytest.fixture
def service(run, tiny_folder):
    # float32 as in the service's own tests: bfloat16 on CPU is slow for many short sequences.
    svc = EngineService(dtype=torch.float32)
    assert run(load(svc, tiny_folder, "tiny"))
    yield svc
    run(svc.close())


@pytest.fixture
def view(qtbot, store, service):
    v = CompareView(store, service)
    qtbot.addWidget(v)
    v.resize(1400, 800)
    v.show()
    return v


def configure(view, presets, seeds, max_new_tokens=24):
    view.set_column_count(len(seeds))
    for column, preset, seed in zip(view.columns, presets, seeds):
        column.set_settings({**preset.settings, "seed": seed, "max_new_tokens": max_new_tokens})
    view.set_prompt(PROMPT)


def direct_text(service, settings: dict, seed: int, max_new_tokens: int) -> str:
    """The same prompt run alone on a fresh engine.DynamicGenerator, with SamplerSettings built by hand."""
    model = service.model
    gen = DynamicGenerator(model, Cache(model, 4096, page_size=256), service.tokenizer)
    sampler = SamplerSettings(**{k: v for k, v in settings.items() if k not in ("seed", "max_new_tokens")})
    ids = service.encode_chat([{"role": "user", "content": PROMPT}])
    gen.enqueue(
        DynamicJob(
            ids,
            max_new_tokens,
            gen_settings=sampler,
            seed=seed,
            stop_conditions=sorted(service.tokenizer.eos_token_ids),
        )
    )
    text = ""
    while gen.num_remaining_jobs():
        text += "".join(r.get("text", "") for r in gen.iterate())
    return text


def test_three_presets_match_direct_runs_share_the_prompt_and_repeat(run, view, store, service):
    presets = store.presets.all()[:3]
    assert len(presets) == 3
    seeds = [11, 22, 33]
    configure(view, presets, seeds)

    async def press_run() -> bool:
        task = view.start()
        await asyncio.sleep(0)  # one loop turn: run() has created every column's job without awaiting
        assert view.is_running() and len(view._jobs) == 3 and not view.run_button.isEnabled()
        return await task

    assert run(press_run()) is True
    texts = [c.text for c in view.columns]
    stats = [c.stats for c in view.columns]

    for column, preset, seed in zip(view.columns, presets, seeds):
        assert column.complete and column.error is None
        assert column.text == direct_text(service, preset.settings, seed, 24), column.index
        assert column.run_settings["seed"] == seed
    assert len(set(texts)) > 1  # the settings and seeds really differ per column

    # The prompt's pages are computed once: the first column prefills, the later ones reuse its pages.
    prompt_tokens = stats[0]["prompt_tokens"]
    assert prompt_tokens > 256
    assert stats[0]["cached_tokens"] == 0
    assert all(s["cached_tokens"] >= 256 for s in stats[1:]), stats
    assert all(s["new_tokens"] > 0 and s["tokens_per_second"] > 0 for s in stats)
    assert f"{stats[1]['cached_tokens']} of {prompt_tokens} prompt tokens cached" in view.columns[1].stats_label.text()

    # Columns stream side by side: every column's first token comes before any column's last one.
    firsts = [c.first_token_at for c in view.columns]
    lasts = [c.last_token_at for c in view.columns]
    assert max(firsts) < min(lasts), (firsts, lasts)

    # The same seeds again: the same text in every column (now all from cached pages).
    assert run(view.run()) is True
    assert [c.text for c in view.columns] == texts
    assert all(c.stats["cached_tokens"] > 0 for c in view.columns)


def test_save_to_history_and_export_hold_every_column(run, qtbot, view, store, service, tmp_path):
    presets = store.presets.all()
    configure(view, presets[1:3], [5, 6], max_new_tokens=12)
    assert view.save_to_history() is None  # nothing run yet
    assert run(view.run())
    chat = view.save_to_history()
    assert chat.kind == "compare" and chat.model == "tiny"
    assert view.save_to_history().id == chat.id  # saving again does not duplicate
    messages = store.messages(chat.id)
    assert [m.role for m in messages] == ["user", "assistant", "assistant"]
    assert messages[0].text == PROMPT
    for m, column in zip(messages[1:], view.columns):
        assert m.column == column.index and m.text == column.text and m.complete
        assert m.settings["seed"] == column.run_settings["seed"] and m.settings["max_new_tokens"] == 12
        assert m.stats["new_tokens"] == column.stats["new_tokens"] and "cached_tokens" in m.stats
        assert m.stats["preset"] == presets[1 + column.index].name

    md_path = view.export(tmp_path / "compare.md")
    json_path = view.export(tmp_path / "compare.json")
    assert view.export(tmp_path / "compare.txt") is None and "export as .md" in view.message_label.text()
    md = md_path.read_text(encoding="utf-8")
    assert "(column 1)" in md and "(column 2)" in md
    for column in view.columns:
        assert column.text.strip() in md
    data = json.loads(json_path.read_text(encoding="utf-8"))
    assert data["chat"]["kind"] == "compare"
    columns = [m for m in data["messages"] if m["column"] is not None]
    assert [m["text"] for m in columns] == [c.text for c in view.columns]
    assert all(m["stats"]["tokens_per_second"] > 0 for m in columns)

    # A saved comparison opens again in a new view, and re-running it repeats the text.
    other = CompareView(store, service)
    qtbot.addWidget(other)
    assert other.saved_combo.findData(chat.id) > 0
    other.open_comparison(chat.id)
    assert [c.text for c in other.columns] == [c.text for c in view.columns]
    assert [c.settings()["seed"] for c in other.columns] == [5, 6]
    saved_texts = [c.text for c in other.columns]
    assert run(other.run())
    assert [c.text for c in other.columns] == saved_texts


@pytest.mark.parametrize("count", [2, 4])
def test_two_and_four_columns_run(run, view, store, count):
    presets = store.presets.all()
    configure(view, [presets[i % len(presets)] for i in range(count)], list(range(count)), max_new_tokens=8)
    assert len(view.columns) == count
    assert sum(view.splitter.widget(i).isVisible() for i in range(view.splitter.count())) == count
    assert run(view.run())
    assert all(c.complete and c.stats["new_tokens"] > 0 for c in view.columns)
    assert sum(c.stats["cached_tokens"] > 0 for c in view.columns) >= count - 1


def test_bad_inputs_are_refused_with_a_message(run, view, store, service):
    with pytest.raises(ValueError, match="2 to 4 columns"):
        view.set_column_count(1)
    with pytest.raises(ValueError, match="2 to 4 columns"):
        view.set_column_count(5)
    view.set_prompt("   ")
    assert run(view.run()) is False and "Write a prompt" in view.message_label.text()
    # More tokens than the model's context: refused before any job starts, the service stays usable.
    view.set_prompt(PROMPT)
    view.set_max_new_tokens(service.context_length)
    assert run(view.run()) is False
    assert "Column 1" in view.message_label.text() and not view.is_running()
    view.set_max_new_tokens(4)
    assert run(view.run())


def test_no_model_loaded_says_so(run, qtbot, store):
    svc = EngineService(dtype=torch.float32)
    v = CompareView(store, svc)
    qtbot.addWidget(v)
    v.set_prompt("hello")
    assert run(v.run()) is False
    assert "No model is loaded" in v.message_label.text()
    run(svc.close())


def test_stop_keeps_what_was_written(run, view, store, service):
    presets = store.presets.all()
    configure(view, presets[:2], [1, 2], max_new_tokens=400)
    for column in view.columns:  # no end-of-turn token: the columns are still running when Stop comes
        column.set_settings({**column.settings(), "disallowed_tokens": sorted(service.tokenizer.eos_token_ids)})

    async def stop_midway():
        task = view.start()
        while not all(c.num_tokens >= 2 for c in view.columns):
            await asyncio.sleep(0.01)
        assert view.is_running() and not view.run_button.isEnabled()
        await view.stop()
        return await task

    assert run(stop_midway()) is False
    assert not view.is_running() and view.run_button.isEnabled()
    for column in view.columns:
        assert not column.complete and column.text and column.stats["eos_reason"] == "stopped"
        assert "stopped" in column.stats_label.text()


STARTER_SYSTEM_PROMPT = (
    "You are the cycling guide of a small touring company that rents tandem bicycles to visitors. "
    "Visitors ask about routes, safety, the bikes themselves and what riding together feels like. "
    "Answer warmly and concretely, in plain words, as someone who has ridden thousands of kilometres "
    "on the back and on the front of a tandem. The rider in front is the captain: they steer, brake "
    "and shift gears. The rider behind is the stoker: they pedal, watch the scenery, signal turns and "
    "keep an eye on the traffic behind. Both riders pedal at the same cadence because the cranks are "
    "linked by a timing chain, so a good ride depends on talking: the captain announces bumps, stops, "
    "gear changes and when to stand up on the pedals. Our routes follow the river for forty kilometres, "
    "climb gently through the vineyards and come back along the old railway path, which has no cars. "
    "Helmets, lights, a repair kit and a map are included with every rental. Never promise anything "
    "about the weather, and suggest the morning for families because the afternoon wind from the coast "
    "makes the way back harder. Keep every answer short unless the visitor asks for details."
)


def test_starter_model_screenshot(run, qtbot, starter_gguf, store):
    """Three presets on the real starter model; the window is saved as the README's screenshot."""
    svc = EngineService(dtype=torch.float32)
    assert run(load(svc, starter_gguf))
    v = CompareView(store, svc)
    qtbot.addWidget(v)
    v.resize(1400, 760)
    v.show()
    presets = {p.name: p for p in store.presets.all()}
    configure(v, [presets["Greedy"], presets["Balanced"], presets["Creative"]], [0, 0, 0], max_new_tokens=32)
    v.set_prompt("Write one sentence about riding a tandem bicycle.", STARTER_SYSTEM_PROMPT)
    try:
        assert run(v.run())
        texts = [c.text for c in v.columns]
        assert all(len(t.split()) >= 3 for t in texts) and len(set(texts)) == 3, texts
        # The system prompt fills the first 256-token page: computed once, shared by the later columns.
        assert v.columns[0].stats["prompt_tokens"] > 256
        assert all(c.stats["cached_tokens"] >= 256 for c in v.columns[1:])
        ARTIFACTS.mkdir(exist_ok=True)
        assert v.grab().save(str(ARTIFACTS / "compare.png"))
    finally:
        run(svc.close())
