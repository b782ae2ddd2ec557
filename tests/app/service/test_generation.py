"""GenerationSettings, the one settings value: the store's JSON form both ways, old dicts, bounds, and the
engine's SamplerSettings; and tokens_per_second, the one rate."""

from __future__ import annotations

import json

import pytest

from app.service.answer_stats import eos_stats, tokens_per_second
from app.service.generation import (
    DEFAULT_MAX_NEW_TOKENS,
    MAX_SEED,
    GenerationSettings,
    complete_settings,
    sampler_part,
    with_json_mode,
)
from engine import SamplerSettings


def test_the_stored_form_round_trips_through_json():
    settings = GenerationSettings.from_dict(
        {"temperature": 0.7, "top_k": 20, "token_bias": {5: 2.5}, "disallowed_tokens": [3, 1], "seed": 9}
    ).replace(json_mode=True, max_new_tokens=77)
    stored = json.loads(json.dumps(settings.to_dict()))  # string token-bias keys, as the store gives them back
    assert stored["json_mode"] is True and stored["token_bias"] == {"5": 2.5}
    again = GenerationSettings.from_dict(stored)
    assert again == settings
    assert again.sampler() == SamplerSettings(temperature=0.7, top_k=20, token_bias={5: 2.5}, disallowed_tokens=[1, 3])
    assert (again.seed, again.max_new_tokens, again.json_mode) == (9, 77, True)


def test_old_and_partial_dicts_take_the_defaults_and_json_mode_is_written_only_when_on():
    old = GenerationSettings.from_dict({"temperature": 0.3, "a_setting_from_a_newer_version": 1})
    assert old.temperature == 0.3 and old.top_k == SamplerSettings().top_k
    assert old.seed is None and old.max_new_tokens == DEFAULT_MAX_NEW_TOKENS and not old.json_mode
    assert "json_mode" not in old.to_dict()
    assert GenerationSettings.from_dict(None) == GenerationSettings()
    assert old.to_dict() == complete_settings({"temperature": 0.3})  # the panel's completed form
    assert sampler_part(old.to_dict()) == sampler_part({"temperature": 0.3, "seed": 5, "max_new_tokens": 3})
    assert with_json_mode({"top_k": 2}, True) == {"top_k": 2, "json_mode": True}
    assert with_json_mode({"top_k": 2, "json_mode": True}, False) == {"top_k": 2}


def test_bad_values_are_refused_with_what_was_wrong():
    with pytest.raises(ValueError, match="seed must be between 0 and"):
        GenerationSettings(seed=MAX_SEED + 1)
    with pytest.raises(ValueError, match="max_new_tokens must be between 1"):
        GenerationSettings.from_dict({"max_new_tokens": 0})
    with pytest.raises(ValueError, match="token_bias keys must be token ids"):
        GenerationSettings().replace(token_bias={"five": 1.0})
    # A stored dict is read tolerantly (an old chat must open): an unreadable token_bias is dropped, logged.
    assert GenerationSettings.from_dict({"token_bias": {"five": 1.0}}).token_bias is None
    with pytest.raises(ValueError):
        GenerationSettings.from_dict({"top_p": 1.5})  # the engine's own check
    with pytest.raises(AttributeError, match="no setting 'temprature'"):
        _ = GenerationSettings().temprature


def test_the_value_is_frozen_and_its_sampler_a_copy():
    settings = GenerationSettings()
    with pytest.raises(AttributeError):
        settings.seed = 3
    sampler = settings.sampler()
    sampler.temperature = 0.1
    assert settings.temperature == SamplerSettings().temperature
    seeded = settings.seeded()
    assert 0 <= seeded.seed <= MAX_SEED and seeded.seeded() is seeded and settings.seed is None


def test_tokens_per_second_counts_the_decode_steps_time_generate_spans():
    # time_generate runs from the first token to the last: 11 tokens in 2 s are 10 steps, 5 per second.
    assert tokens_per_second(11, 2.0) == 5.0
    assert tokens_per_second(1, 2.0) is None and tokens_per_second(5, 0.0) is None
    stats = eos_stats({"new_tokens": 11, "time_generate": 2.0, "eos_reason": "stop_token"}, json_mode=True)
    assert stats["tokens_per_second"] == 5.0 and stats["json_mode"] is True
