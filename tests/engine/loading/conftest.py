"""Tiny GGUF files written the way llama.cpp's converter writes them, from tiny random transformers models; and
llama.cpp's own converter, for the tests that convert tiny Hugging Face folders with it."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch

from kernels.torch_ref.gguf_blocks import F16_FIELDS

# GGUF `general.architecture` for each transformers class, as llama.cpp's converter names them.
GGUF_ARCH = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}


# A small byte-level BPE vocabulary (GPT-2 kind): specials, lowercase letters, a space marker, merges.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "t h", "Ġt h", "h e", "Ġth e", "i n", "a n", "e r"]


def tiny_vocab() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges) of a valid byte-level BPE vocabulary with an odd size."""
    tokens = SPECIAL_TOKENS + [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["Ġ", ",", "."]
    tokens += ["".join(m.split()) for m in MERGES]
    types = [3] * len(SPECIAL_TOKENS) + [1] * (len(tokens) - len(SPECIAL_TOKENS))  # 3 = control, 1 = normal
    return tokens, types, MERGES


VOCAB_SIZE = len(tiny_vocab()[0])


def tiny_model(architecture: str, seed: int = 0, **config) -> torch.nn.Module:
    """A random transformers model; every tensor (norms and biases too) random, so a swap is visible."""
    import transformers

    cls = getattr(transformers, architecture)
    hf_config = cls.config_class(vocab_size=VOCAB_SIZE, bos_token_id=1, eos_token_id=2, pad_token_id=0, **config)
    torch.manual_seed(seed)
    model = cls(hf_config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    return model


def llama_permute(w: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's converter row order for llama q/k: each head's two rotary halves interleaved."""
    return w.reshape(num_heads, 2, w.shape[0] // num_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def random_blocks(rows: int, cols: int, qtype_name: str, rng: np.random.Generator) -> np.ndarray:
    """Valid random quantized blocks: random bits with small finite float16 scales."""
    import gguf

    qtype = gguf.GGMLQuantizationType[qtype_name]
    block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(rows * cols // block_size, type_size), dtype=np.uint8)
    for offset in F16_FIELDS[qtype_name]:
        scales = rng.uniform(-0.05, 0.05, size=blocks.shape[0]).astype(np.float16)
        blocks[:, offset : offset + 2] = scales.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, cols // block_size * type_size)


@dataclass
class TinyGGUF:
    """A written GGUF file and what went into it."""

    path: Path
    model: torch.nn.Module
    qtype: str
    # GGUF tensor name -> the exact bytes/values written (before quantization for float types)
    written: dict[str, np.ndarray] = field(default_factory=dict)


def write_gguf(
    path: Path,
    model: torch.nn.Module,
    qtype: str = "F32",
    *,
    skip: tuple[str, ...] = (),
    replace: dict[str, np.ndarray] | None = None,
    raw_types: dict[str, str] | None = None,
    extra_tensors: dict[str, np.ndarray] | None = None,
    extra_metadata: dict[str, object] | None = None,
    drop_metadata: tuple[str, ...] = (),
    endianess: str = "LITTLE",
) -> TinyGGUF:
    """Write `model` as llama.cpp's convert_hf_to_gguf.py would with `--outtype qtype`.

    Names from gguf's own tensor name map, llama q/k rows permuted, 1-D tensors and norms as F32,
    output.weight only when embeddings are untied. `qtype` is any type gguf.quants can quantize; a
    K-quant, IQ4_NL or IQ4_XS writes valid random blocks instead (gguf cannot quantize to them). `skip` leaves
    GGUF tensors out, `replace` writes other data under a GGUF name, `raw_types` writes random
    blocks of another type under a GGUF name, `drop_metadata` leaves keys out: for the bad-input tests.
    """
    import gguf

    cfg = model.config
    arch = GGUF_ARCH[type(model).__name__]
    model_arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    name_map = gguf.get_tensor_name_map(model_arch, cfg.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), arch, endianess=gguf.GGUFEndian[endianess])

    writer.add_name("tiny-" + arch)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    head_dim = getattr(cfg, "head_dim", None)
    if head_dim is not None:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    if arch == "llama":  # the Llama converter also writes these two
        writer.add_vocab_size(cfg.vocab_size)
        writer.add_rope_dimension_count(head_dim or cfg.hidden_size // cfg.num_attention_heads)
    tokens, types, merges = tiny_vocab()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(cfg.bos_token_id)
    writer.add_eos_token_id(cfg.eos_token_id)
    writer.add_pad_token_id(cfg.pad_token_id)
    for key, value in (extra_metadata or {}).items():
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_uint32(key, value)

    out = TinyGGUF(path=path, model=model, qtype=qtype)
    rng = np.random.default_rng(0)
    qt = gguf.GGMLQuantizationType[qtype]
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        base, suffix = hf_name.rsplit(".", 1)
        name = f"{name_map.get_name(base)}.{suffix}"
        if name in skip:
            continue
        data = tensor.detach().float().numpy()
        if arch == "llama" and name.split(".")[-2] in ("attn_q", "attn_k"):
            heads = cfg.num_attention_heads if ".attn_q." in name else cfg.num_key_value_heads
            data = llama_permute(data, heads)
        if replace and name in replace:
            data = replace[name]
        if raw_types and name in raw_types:
            raw_qt = gguf.GGMLQuantizationType[raw_types[name]]
            block_size, type_size = gguf.GGML_QUANT_SIZES[raw_qt]
            if raw_types[name] in F16_FIELDS:  # valid blocks: finite scales
                blocks = random_blocks(data.shape[0], data.shape[-1], raw_types[name], rng)
            else:
                blocks = rng.integers(0, 256, size=(data.shape[0], data.shape[-1] // block_size * type_size))
            out.written[name] = blocks.astype(np.uint8)
            writer.add_tensor(name, blocks.astype(np.uint8), raw_dtype=raw_qt)
        elif data.ndim <= 1 or name.endswith("_norm.weight") or qt == gguf.GGMLQuantizationType.F32:
            out.written[name] = data.astype(np.float32)
            writer.add_tensor(name, data.astype(np.float32))
        elif qt == gguf.GGMLQuantizationType.F16:
            out.written[name] = data
            writer.add_tensor(name, data.astype(np.float16))
        elif qtype.endswith("_K") or qtype.startswith("IQ4_"):
            blocks = random_blocks(data.shape[0], data.shape[1], qtype, rng)
            out.written[name] = blocks
            writer.add_tensor(name, blocks, raw_dtype=qt)
        else:
            out.written[name] = data
            writer.add_tensor(name, gguf.quants.quantize(data, qt), raw_dtype=qt)
    for name, data in (extra_tensors or {}).items():
        writer.add_tensor(name, data)
    for key in drop_metadata:
        del writer.kv_data[0][key]
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


class GGUFKit:
    """What the GGUF tests build with: tiny models, files written from them, llama.cpp's q/k order."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.count = 0
        self.model = tiny_model
        self.permute = llama_permute

    def write(self, model: torch.nn.Module, qtype: str = "F32", **options) -> TinyGGUF:
        """Write `folder/model<n>-<qtype>.gguf`; options as for `write_gguf`."""
        self.count += 1
        return write_gguf(self.folder / f"model{self.count}-{qtype}.gguf", model, qtype, **options)


@pytest.fixture
def gguf_kit(tmp_path) -> GGUFKit:
    return GGUFKit(tmp_path)


SDIST = "llama_cpp_python-0.3.36"


def _converter_script() -> Path:
    """llama.cpp's convert_hf_to_gguf.py from the llama-cpp-python sdist, fetched with pip once into
    $TANDEM_LLAMA_SRC (default ~/.cache/tandem-llama-cpp, where ../shared/tools/build-llama-cpp.sh puts it)."""
    cache = Path(os.environ.get("TANDEM_LLAMA_SRC", Path.home() / ".cache" / "tandem-llama-cpp"))
    script = cache / SDIST / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py"
    if script.is_file():
        return script
    cache.mkdir(parents=True, exist_ok=True)
    archive = cache / f"{SDIST}.tar.gz"
    if not archive.is_file():
        fetched = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", str(cache)]
            + ["llama-cpp-python==0.3.36"],
            capture_output=True,
            text=True,
        )
        if fetched.returncode != 0 or not archive.is_file():
            pytest.skip(
                f"pip could not fetch the llama-cpp-python 0.3.36 sdist (llama.cpp's converter): "
                f"{fetched.stderr.strip()[-300:]}"
            )
    with tarfile.open(archive) as tar:
        # Only the converter and its own gguf-py: the C++ sources are not needed here.
        wanted = (
            f"{SDIST}/vendor/llama.cpp/convert_hf_to_gguf.py",
            f"{SDIST}/vendor/llama.cpp/conversion/",
            f"{SDIST}/vendor/llama.cpp/gguf-py/",
            f"{SDIST}/vendor/llama.cpp/models/",
        )
        members = [m for m in tar.getmembers() if m.name.startswith(wanted)]
        tar.extractall(cache, members=members, filter="data")
    return script


@pytest.fixture(scope="session")
def converter() -> Callable[..., None]:
    """`converter(folder, out, mmproj, outtype="f32")`: llama.cpp 0.3.36's own convert_hf_to_gguf.py run on a
    Hugging Face folder (with --mmproj the projector file), skipping the test where pip cannot fetch it."""
    return partial(_convert, _converter_script())


def _convert(script: Path, folder: Path, out: Path, mmproj: bool, outtype: str = "f32") -> None:
    """Run the converter on `folder` with its own gguf-py, not the installed one."""
    env = {**os.environ, "PYTHONPATH": str(script.parent / "gguf-py")}
    args = [sys.executable, str(script), str(folder), "--outfile", str(out), "--outtype", outtype]
    done = subprocess.run(args + (["--mmproj"] if mmproj else []), env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise AssertionError(f"convert_hf_to_gguf.py failed on {folder.name}:\n{done.stderr[-2000:]}")


@pytest.fixture(scope="session")
def known_tokenizer(starter_hf_tokenizer, tmp_path_factory) -> Path:
    """The starter's SmolLM2 tokenizer as tokenizer.json: the converter names a BPE tokenizer by hashing how it
    splits a test text, and refuses the tiny trained ones of tests/conftest.py; SmolLM2's it knows."""
    folder = tmp_path_factory.mktemp("smollm2-tokenizer")
    starter_hf_tokenizer.save_pretrained(folder)
    return folder / "tokenizer.json"
