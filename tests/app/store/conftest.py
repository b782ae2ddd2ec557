"""A real store file under tmp_path; TANDEM_DATA_DIR points there so nothing touches the user's folder."""

from __future__ import annotations

import pytest

from app.store import Store


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_DATA_DIR", str(tmp_path))
    opened = Store(tmp_path / "tandem.sqlite3")
    yield opened
    opened.close()
