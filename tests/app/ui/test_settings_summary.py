"""The one-line summary of a settings dict (the compare columns' folded settings)."""

from __future__ import annotations

from app.service.generation import COMPARE_MAX_NEW_TOKENS, complete_settings
from app.ui.settings_summary import SHOWN_FIELDS, differences, full_summary, summary

JOB = {"seed": 0, "max_new_tokens": COMPARE_MAX_NEW_TOKENS}


def defaults(**changes):
    return {**complete_settings(None), "seed": 0, "max_new_tokens": COMPARE_MAX_NEW_TOKENS, **changes}


def test_the_defaults_are_custom_with_nothing_to_add():
    assert summary(defaults(), None, JOB) == "Custom"
    assert full_summary(defaults(), None, JOB) == "Custom\nthe defaults"


def test_job_fields_first_then_basics_then_the_panels_order():
    settings = defaults(top_k=5, temperature=0.2, seed=None, max_new_tokens=64, dry_multiplier=0.8)
    assert differences(settings, JOB) == [
        "random seed",
        "64 tokens",
        "temperature 0.2",
        "top-k 5",
        "DRY multiplier 0.8",
    ]
    assert summary(settings, "Mine", JOB) == "Mine · random seed · 64 tokens · temperature 0.2 · +2 more"
    assert SHOWN_FIELDS == 3


def test_values_read_as_the_panel_shows_them():
    settings = defaults(top_k=0, temperature_last=True, disallowed_tokens=[13, 42], token_repetition_range=1024)
    assert differences(settings, JOB) == [
        "temperature last",
        "top-k off",  # the panel's special text for 0
        "repetition range 1024",
        "disallowed [13, 42]",
    ]
    # Without job defaults a seed or length never shows.
    assert differences(defaults(seed=3), {}) == []
