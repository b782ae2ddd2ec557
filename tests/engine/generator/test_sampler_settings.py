"""SamplerSettings: exllamav2's defaults, and every field checked when it is assigned."""

from __future__ import annotations

import pytest
import torch

from engine.generator.sampler_settings import SamplerSettings


def test_defaults_follow_exllamav2() -> None:
    s = SamplerSettings()
    assert (s.temperature, s.top_k, s.top_p, s.min_p, s.token_repetition_penalty) == (
        0.8,
        50,
        0.8,
        0.0,
        1.025,
    )
    assert (s.token_repetition_range, s.mirostat_tau, s.mirostat_eta) == (-1, 1.5, 0.1)
    assert (s.dry_base, s.dry_allowed_length, s.dry_multiplier, s.xtc_threshold) == (1.75, 2, 0.0, 0.1)
    assert s.clone() == s and s.clone() is not s


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.1), ("temperature", float("nan")), ("top_p", 1.5), ("top_p", -0.1),
        ("top_k", -1), ("min_p", 1.01), ("top_a", -0.5), ("tfs", 2.0), ("typical", -1.0),
        ("smoothing_factor", -1.0), ("min_temp", -1.0), ("temp_exponent", 0.0), ("skew", float("inf")),
        ("token_repetition_penalty", 0.0), ("token_repetition_range", -2), ("token_repetition_decay", -1),
        ("mirostat_tau", -1.0), ("mirostat_eta", -0.1), ("dry_multiplier", -1.0), ("dry_base", 0.5),
        ("dry_allowed_length", 0), ("dry_range", -1), ("dry_max_ngram", 0), ("xtc_probability", 1.5),
        ("xtc_threshold", -0.1), ("disallowed_tokens", [-1]), ("token_bias", {-1: 1.0}),
        ("token_bias", torch.zeros(2, 3)), ("dry_sequence_breakers", [""]),
    ],
)  # fmt: skip
def test_out_of_range_settings_raise_value_error(field: str, value) -> None:
    with pytest.raises(ValueError, match=field):
        SamplerSettings(**{field: value})
    s = SamplerSettings()
    with pytest.raises(ValueError, match=field):
        setattr(s, field, value)


@pytest.mark.parametrize(
    "kwargs",
    [dict(temprature=0.5), dict(top_k=2.5), dict(temperature="hot"), dict(mirostat=1), dict(top_p=True),
     dict(dry_sequence_breakers="\n:"), dict(token_bias=[1.0, 2.0])],
)  # fmt: skip
def test_misspelled_or_wrongly_typed_settings_raise_type_error(kwargs: dict) -> None:
    with pytest.raises(TypeError):
        SamplerSettings(**kwargs)


def test_every_field_is_checked() -> None:
    from dataclasses import fields

    for field in fields(SamplerSettings):
        with pytest.raises((TypeError, ValueError), match=field.name):
            SamplerSettings(**{field.name: object()})


def test_misspelled_attribute_is_rejected() -> None:
    s = SamplerSettings()
    with pytest.raises(AttributeError):
        s.temprature = 0.5  # type: ignore[attr-defined]
