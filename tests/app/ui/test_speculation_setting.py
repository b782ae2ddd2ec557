"""The model manager's speculation setting on the real engine (tiny model), a real qasync loop and SQLite:
choosing it saves it in the store and rebuilds the service's generator (answers then report drafted tokens
in their stats), and a manager opened after a restart hands the saved setting to a fresh service.

Bad inputs tried: a draft deeper than the loaded model allows (the spin box stops at its layers - 1), a
stored setting naming an unknown mode (read as off), layer counts typed before any model is loaded.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from app.service import EngineService
from app.service.speculation import SETTING_KEY, Speculation
from app.store import Store
from app.ui.chat_tab import ChatTab
from app.ui.model_manager import ModelManager
from app.ui.speculation_box import SPECULATION_DELAY_MS


async def load(svc: EngineService, folder) -> bool:
    svc.load_model(folder, "tiny")  # on the loop: the service's tasks belong to it
    return await svc.wait_loaded()


@pytest.fixture
def service(run, tiny_folder):
    svc = EngineService(dtype=torch.float32)
    assert run(load(svc, tiny_folder))
    yield svc
    run(svc.close())


async def choose(manager, mode: str, status: str, wait_for) -> None:
    """Pick `mode` in the combo (it applies at once) and wait until the manager says `status`."""
    manager.speculation_combo.setCurrentIndex(manager.speculation_combo.findData(mode))
    assert manager.service.speculation.mode == mode and manager.store.get_setting(SETTING_KEY)["mode"] == mode
    await wait_for(lambda: status in manager.speculation_label.text(), what=status)


def test_choosing_speculation_saves_it_and_answers_report_drafts(qtbot, run, ui, app_store, service):
    manager = ModelManager(app_store, service)
    qtbot.addWidget(manager)
    assert manager.speculation() == Speculation() and not manager.draft_layers_spin.isEnabled()
    assert manager.speculation_label.text() == "Speculation off for tiny."

    run(choose(manager, "ngram", "N-gram speculation for tiny.", ui.wait_for))
    # The spin box shows 1 (all the tiny model's layers but one); n-gram keeps the saved depth for deeper models.
    assert service.speculation == Speculation("ngram", 8) and manager.draft_layers_spin.value() == 1

    chat = app_store.create_chat("spec", settings=ui.greedy_settings(service, 24))
    tab = ChatTab(app_store, service, chat.id)
    qtbot.addWidget(tab)

    async def ask(text: str) -> dict:
        tab.input.setPlainText(text)
        assert tab.send()
        await ui.wait_for(lambda: not tab.is_streaming, what="the answer")
        return app_store.messages(chat.id)[-1].stats

    stats = run(ask("One two three four five six"))
    drafted = stats["accepted_draft_tokens"] + stats["rejected_draft_tokens"]
    assert drafted > 0 and "of drafted tokens accepted" in tab.message_widgets()[-1].stats_label.text()

    run(choose(manager, "draft", "first 1 of 2 layers", ui.wait_for))
    assert manager.draft_layers_spin.isEnabled() and manager.draft_layers_spin.maximum() == 1  # 2 layers
    assert app_store.get_setting(SETTING_KEY) == {"mode": "draft", "draft_layers": 1}
    stats = run(ask("Seven eight nine"))
    assert stats["accepted_draft_tokens"] + stats["rejected_draft_tokens"] > 0

    run(choose(manager, "off", "Speculation off for tiny.", ui.wait_for))
    assert "accepted_draft_tokens" not in run(ask("Ten"))


def test_saved_setting_reaches_a_fresh_service_through_the_manager(qtbot, run, ui, data_dir, tiny_folder):
    async def before_load(store: Store, svc: EngineService) -> ModelManager:
        manager = ModelManager(store, svc)  # nothing loaded yet: layer counts up to the spin box's bound
        qtbot.addWidget(manager)
        assert manager.speculation() == Speculation() == svc.speculation  # the stored value is unreadable: off
        await choose(manager, "draft", "applies when a model is loaded", ui.wait_for)
        assert svc.speculation == Speculation("draft", 8)  # the default depth, the spin box's first value
        manager.draft_layers_spin.setValue(5)  # applied once the spin box settles
        assert svc.speculation == Speculation("draft", 8)
        await asyncio.sleep((SPECULATION_DELAY_MS + 300) / 1000)
        return manager

    with Store() as store:
        store.set_setting(SETTING_KEY, {"mode": "warp", "draft_layers": 3})
        svc = EngineService(dtype=torch.float32)
        try:
            run(before_load(store, svc))
            assert svc.speculation == Speculation("draft", 5) and store.get_setting(SETTING_KEY)["draft_layers"] == 5
        finally:
            run(svc.close())

    async def after_restart(store: Store, svc: EngineService) -> dict:
        assert await load(svc, tiny_folder)
        manager = ModelManager(store, svc)  # the service was made without the setting: the manager hands it over
        qtbot.addWidget(manager)
        assert svc.speculation == Speculation("draft", 5)
        await ui.wait_for(lambda: "first 1 of 2 layers" in manager.speculation_label.text(), what="applied")
        assert manager.draft_layers_spin.value() == 1  # shown as what runs: the model has 2 layers
        job = svc.start_job(svc.encode_chat([{"role": "user", "content": "hi"}]), {}, max_new_tokens=6, seed=1)
        return [r async for r in job][-1]

    with Store() as store:  # a restart: a new store on the same file, a new service
        svc = EngineService(dtype=torch.float32)
        try:
            assert "accepted_draft_tokens" in run(after_restart(store, svc))
        finally:
            run(svc.close())
