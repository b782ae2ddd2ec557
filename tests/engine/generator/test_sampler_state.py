"""SamplerState: the job's token history (append, grow, rewind) and its seed."""

from __future__ import annotations

import pytest
import torch

from engine.generator.sampler_state import SamplerState


def test_state_history_seed_and_rewind() -> None:
    state = SamplerState(None, torch.tensor([[5, 6, 7]]), seed=0)
    state.append(8)
    state.append([9, 10])
    state.append(torch.arange(100))  # forces the buffer to grow
    assert state.history[:6].tolist() == [5, 6, 7, 8, 9, 10] and state.history.numel() == 106
    state.truncate(4)
    assert state.history.tolist() == [5, 6, 7, 8]
    with pytest.raises(ValueError, match="truncate"):
        state.truncate(5)
    assert SamplerState(seed=None).seed != SamplerState(seed=None).seed
    for bad in (-1, 2**64, 1.5, True):
        with pytest.raises(ValueError, match="seed"):
            SamplerState(seed=bad)
