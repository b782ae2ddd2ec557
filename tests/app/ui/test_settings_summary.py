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


def test_greedy_settings_read_as_greedy_without_the_fields_it_makes_moot():
    # top-k 1 (or temperature 0) takes the argmax after penalties and DRY: temperature, top-p, min-p and the rest
    # change nothing, so they are not listed; what still changes the answer is.
    settings = defaults(
        top_k=1, temperature=1.0, top_p=1.0, min_p=0.2, token_repetition_penalty=1.0, dry_multiplier=0.8
    )
    assert differences(settings, JOB) == ["greedy", "no repetition penalty", "DRY multiplier 0.8"]
    assert differences(defaults(temperature=0.0, top_p=0.5), JOB) == ["greedy"]
    assert summary(settings, None, JOB) == "Custom · greedy · no repetition penalty · DRY multiplier 0.8"
    assert summary(settings, "Greedy", JOB) == "Greedy · no repetition penalty · DRY multiplier 0.8"  # said once
    assert full_summary(defaults(top_k=1), "Greedy", JOB) == "Greedy\nthe defaults"
    assert differences(defaults(top_k=2, temperature=1.0), JOB) == ["temperature 1", "top-k 2"]  # sampling: listed
