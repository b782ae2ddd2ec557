"""The memory a model needs at a context, and the refusal when it is more than is free (engine/memory_fit.py).

Cards here are made by hand in the shape of Llama-3.1-8B Q4_K_M (32 layers, 8 KV heads of 128) so the figures
are those a user sees; test_model_info.py reads cards from real files.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.errors import ModelLoadError
from engine.memory_fit import (
    CONTEXT_STEP,
    OVERHEAD_BYTES,
    NotEnoughMemoryError,
    check_memory,
    format_bytes,
    kv_bytes_per_token,
    largest_context,
    memory_need,
)
from engine.model_info import ModelInfo

GB = 10**9


def card(**changes) -> ModelInfo:
    fields = dict(
        path=Path("/models/bench-8b-Q4_K_M.gguf"),
        name="bench-8b-Q4_K_M",
        format="gguf",
        architecture="llama",
        engine_architecture="LlamaForCausalLM",
        size_bytes=4_920_000_000,
        num_parameters=8_030_000_000,
        quantization="Q4_K_M",
        context_length=131072,
        can_see_images=False,
        num_layers=32,
        num_kv_heads=8,
        head_dim=128,
        packed_bytes=4_900_000_000,
        num_float_parameters=266_240,
    )
    return ModelInfo(**{**fields, **changes})


def test_need_is_weights_plus_one_chats_cache_plus_overhead():
    assert kv_bytes_per_token(32, 8, 128, 2) == 131072  # 128 KiB a token in bfloat16
    need = memory_need(card(), 8192, itemsize=2)
    assert need.kv_bytes == 2 * 32 * 8 * 128 * 8192 * 2
    assert need.weights_bytes == 4_900_000_000 + 2 * 266_240  # blocks as stored, norms in bfloat16
    assert need.total_bytes == need.weights_bytes + need.kv_bytes + OVERHEAD_BYTES
    assert format_bytes(need.total_bytes) == "6.2 GB"
    dequantized = memory_need(card(), 8192, itemsize=4, keeps_blocks=False)  # e.g. float32
    assert dequantized.weights_bytes == 4 * 8_030_000_000


def test_a_model_that_does_not_fit_is_refused_with_what_to_do():
    with pytest.raises(NotEnoughMemoryError) as caught:
        check_memory(card(), 8192, int(3.2 * GB), itemsize=2)
    error = caught.value
    assert isinstance(error, ModelLoadError)  # the app shows it like any failed load
    assert str(error).startswith(
        "bench-8b-Q4_K_M.gguf needs about 6.2 GB at a 8,192-token context but 3.2 GB is free. Close other "
        "programs, or pick a smaller quantization or model."
    )
    assert error.fitting_context == 0  # the weights alone (4.9 GB) do not fit: no context is offered

    with pytest.raises(NotEnoughMemoryError) as caught:
        check_memory(card(), 8192, int(5.5 * GB), itemsize=2)
    fitting = caught.value.fitting_context
    assert 0 < fitting < 8192 and fitting % CONTEXT_STEP == 0
    assert (
        f"pick a smaller context, or a smaller quantization or model. It fits with a context of up to {fitting:,}"
        in (str(caught.value))
    )
    assert (
        memory_need(card(), fitting, 2).total_bytes
        <= 5.5 * GB
        < memory_need(card(), fitting + CONTEXT_STEP, 2).total_bytes
    )
    assert check_memory(card(), fitting, int(5.5 * GB), itemsize=2).context_tokens == fitting  # fits: no error


def test_what_fits_is_bounded_by_the_models_own_context_and_unknown_memory_refuses_nothing():
    assert largest_context(card(context_length=4096), 100 * GB, itemsize=2) == 4096
    assert largest_context(card(), 100 * GB, itemsize=2) == 131072
    assert check_memory(card(), 131072, None, itemsize=2).kv_bytes == 16 * 2**30  # free memory not known
    unknown_shape = card(num_layers=None)  # an architecture the engine cannot parse: weights and overhead only
    assert memory_need(unknown_shape, 8192, 2).kv_bytes == 0


def test_sizes_read_like_a_file_manager():
    assert [format_bytes(n) for n in (6_123_000_000, 812_300_000, 96_000, 10)] == ["6.1 GB", "812 MB", "96 KB", "1 KB"]


def test_sliding_layers_count_their_window_pool_as_the_cache_allocates_it(tmp_path):
    """A Gemma 3 folder's card: two of four layers slide; its cache bytes are a real Cache's, and the largest
    context grows past what counting every layer at every token allows."""
    import torch
    import transformers

    from engine.cache import Cache
    from engine.model_info import read_model_info
    from engine.models import Model

    config = transformers.Gemma3TextConfig(
        vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=32, sliding_window=512,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        max_position_embeddings=131072,
    )  # fmt: skip
    transformers.Gemma3ForCausalLM(config).save_pretrained(tmp_path)
    info = read_model_info(tmp_path)
    assert (info.num_sliding_layers, info.sliding_window) == (2, 512)
    model = Model.load(tmp_path, dtype=torch.bfloat16)
    for tokens in (4096, 32768):
        assert memory_need(info, tokens, 2).kv_bytes == Cache(model, tokens, page_size=CONTEXT_STEP).num_bytes
    plain = kv_bytes_per_token(4, 2, 32, 2)
    free = OVERHEAD_BYTES + info.weights_bytes(2) + plain * 20_000
    assert largest_context(info, free, 2) > 20_000
    assert largest_context(info, free, 2) % CONTEXT_STEP == 0
    assert memory_need(info, largest_context(info, free, 2), 2).total_bytes <= free


def test_a_mistral_slides_on_every_layer():
    info = card(num_sliding_layers=32, sliding_window=4096, context_length=32768)
    assert memory_need(info, 32768, 2).kv_bytes < memory_need(card(context_length=32768), 32768, 2).kv_bytes
    assert memory_need(info, 4096, 2).kv_bytes == memory_need(card(), 4096, 2).kv_bytes  # all within the pool


def test_gpt_oss_counts_only_the_layers_its_layer_types_make_sliding(tmp_path):
    import transformers

    from engine.model_info import read_model_info

    config = transformers.GptOssConfig(
        vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"] * 2,
    )  # fmt: skip
    transformers.GptOssForCausalLM(config).save_pretrained(tmp_path)
    info = read_model_info(tmp_path)
    assert (info.num_layers, info.num_sliding_layers, info.sliding_window) == (4, 2, 8)
