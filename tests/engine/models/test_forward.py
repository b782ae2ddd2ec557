"""Forward-pass inputs: embeddings in place of token ids give the same logits."""

from __future__ import annotations

import torch

from engine.cache import Cache
from engine.models import Batch


def test_input_embeddings_equal_token_ids(tiny_model):
    ids = torch.tensor([5, 9, 11, 40, 2, 7])
    cache = Cache(tiny_model, max_seq_len=64, page_size=16)
    batch = Batch.build(cache, [[0], [1]], [0, 0], [4, 2], logits="all")
    by_ids = tiny_model(ids, batch.positions(), batch)
    by_embeds = tiny_model(tiny_model.embed(ids), batch.positions(), batch)
    torch.testing.assert_close(by_ids, by_embeds)
