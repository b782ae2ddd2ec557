"""Write random-weight GGUF models shaped like Llama-3.2-1B (or a mixture of experts), for speed and memory benchmarks.

    python tools/make_bench_model.py OUT_DIR [--types Q4_K_M,Q4_0,Q8_0] [--layers 16] [--seed 0] [--tokenizer GGUF]
    python tools/make_bench_model.py OUT_DIR --shape qwen3moe [--layers 4]
    python tools/make_bench_model.py OUT_DIR --shape gpt-oss --types MXFP4 [--layers 4]

writes OUT_DIR/bench-<shape>-<type>.gguf for each type and prints each path and size.

`--shape qwen3moe` is Qwen3-30B-A3B's layer (GGUF architecture `qwen3moe`): hidden 2048, 32 query / 4 KV heads of
128 with q/k norms, 128 experts of width 768 with 8 routed per token and no shared expert, rope theta 1e6, an
untied output head, and 4 layers by default (about 1.5 GB in Q4_K_M: the expert tensors of one layer are 340 MB).
The router (ffn_gate_inp) is F32, as llama.cpp keeps it, with random weights so tokens spread over the experts.

`--shape gpt-oss` is gpt-oss-20b's layer (GGUF architecture `gpt-oss`): hidden 2880, 64 query / 8 KV heads of 64
with biases and a sink per head, 32 experts of width 2880 with 4 routed and biases, layers alternating a 128-token
window and full attention, YaRN rope (factor 32 over 4096), 4 layers by default (about 1.8 GB). Its only type,
MXFP4, is the experts' (as released); the other weights are Q8_0, since 2880 is not a whole number of K-quant blocks.

The shape is Llama-3.2-1B's: 16 layers, hidden 2048, 32 query / 8 KV heads of 64, MLP 8192, rope theta
500000, rms eps 1e-5, context 131072 in the metadata (its llama3 rope scaling is left out), tied embeddings
(no output.weight). The tokenizer is the starter model's (SmolLM2-135M-Instruct): every tokenizer.* key is
copied from its GGUF, so the vocabulary has 49152 tokens, not Llama 3's 128256, and the embedding / head is
49152 x 2048 (the model has about 1.07B parameters instead of 1.24B). The text it generates is noise; the
speed and memory of every layer are those of the real model.

Weights are random but valid blocks: random bits, with every float16 scale field set so that the
dequantized weights have an RMS near 0.02 (a trained Llama's), which keeps activations O(1) through all
16 layers (logits of RMS about 1), far from float16's limits. Development tool: nothing in the app or engine imports it.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

# general.file_type values (llama.cpp's llama_ftype) of the types this tool writes.
FILE_TYPES = {"Q4_0": 2, "Q8_0": 7, "Q4_K_M": 15, "MXFP4": 38}

# Byte offsets of the float16 fields (d, and dmin where there is one) in one block of each type (ggml's
# block structs); the rest of a block is integers that any bit pattern makes valid.
F16_FIELDS = {"Q4_0": (0,), "Q8_0": (0,), "Q4_K": (0, 2), "Q6_K": (208,)}

# RMS of a block's dequantized values for random bits and |d| = |dmin| = 1 with random signs, measured
# with gguf.quants.dequantize: Q4_0 d*(q-8); Q8_0 d*int8; Q4_K d*sc*q - dmin*m (6-bit sc, m);
# Q6_K d*int8_sc*(q-32). The scale fields are drawn as WEIGHT_RMS / this, times 0.5..1.5.
UNIT_RMS = {"Q4_0": 4.64, "Q8_0": 73.9, "Q4_K": 323.0, "Q6_K": 1367.0}
WEIGHT_RMS = 0.02


@dataclass(frozen=True)
class TensorPlan:
    """One tensor to write: its GGUF name, logical shape ([rows, cols], or [experts, rows, cols]) and ggml type."""

    name: str
    shape: tuple[int, ...]
    type_name: str


def use_more_bits(layer_idx: int, num_layers: int) -> bool:
    """llama.cpp's rule for the layers whose attn_v / ffn_down get more bits in the *_K_M mixes."""
    return layer_idx < num_layers // 8 or layer_idx >= 7 * num_layers // 8 or (layer_idx - num_layers // 8) % 3 == 2


def tensor_type(name: str, type_name: str, layer_idx: int, num_layers: int) -> str:
    """The ggml type of a 2-D weight `name` (in layer `layer_idx`) in a file of `type_name`."""
    if type_name != "Q4_K_M":
        return type_name
    # llama.cpp's Q4_K_M for a llama model with tied embeddings (llama-quant.cpp): token_embd doubles as
    # the output head, so it gets the head's Q6_K; attn_v and ffn_down are Q6_K in the use_more_bits
    # layers; every other 2-D weight is Q4_K.
    if name == "token_embd.weight":
        return "Q6_K"
    if name.endswith((".attn_v.weight", ".ffn_down.weight", ".ffn_down_exps.weight")) and use_more_bits(
        layer_idx, num_layers
    ):
        return "Q6_K"
    if name == "output.weight":
        return "Q6_K"
    return "Q4_K"


def plan_tensors(
    type_name: str,
    num_layers: int,
    vocab_size: int,
    hidden: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    ffn_hidden: int,
) -> list[TensorPlan]:
    """Every tensor of the model in llama.cpp's names and order, norms F32."""
    q_dim, kv_dim = num_heads * head_dim, num_kv_heads * head_dim
    embd_type = tensor_type("token_embd.weight", type_name, 0, num_layers)
    plans = [TensorPlan("token_embd.weight", (vocab_size, hidden), embd_type)]
    for i in range(num_layers):
        weights = {
            "attn_q": (q_dim, hidden),
            "attn_k": (kv_dim, hidden),
            "attn_v": (kv_dim, hidden),
            "attn_output": (hidden, q_dim),
            "ffn_gate": (ffn_hidden, hidden),
            "ffn_up": (ffn_hidden, hidden),
            "ffn_down": (hidden, ffn_hidden),
        }
        plans.append(TensorPlan(f"blk.{i}.attn_norm.weight", (hidden,), "F32"))
        for short, shape in weights.items():
            if short == "ffn_gate":
                plans.append(TensorPlan(f"blk.{i}.ffn_norm.weight", (hidden,), "F32"))
            name = f"blk.{i}.{short}.weight"
            plans.append(TensorPlan(name, shape, tensor_type(name, type_name, i, num_layers)))
    plans.append(TensorPlan("output_norm.weight", (hidden,), "F32"))
    return plans


# Qwen3-30B-A3B's shape, per layer (the `qwen3moe` rows of the bench).
QWEN3_MOE = dict(
    hidden=2048, num_heads=32, num_kv_heads=4, head_dim=128, ffn_hidden=6144, num_experts=128, experts_used=8,
    expert_ffn=768, rope_theta=1e6, rms_eps=1e-6, context_length=40960,
)  # fmt: skip


# gpt-oss-20b's shape, per layer (the `gpt-oss` rows of the bench).
GPT_OSS = dict(
    hidden=2880, num_heads=64, num_kv_heads=8, head_dim=64, num_experts=32, experts_used=4, expert_ffn=2880,
    rope_theta=150000.0, rms_eps=1e-5, context_length=131072, sliding_window=128, yarn_factor=32.0,
    yarn_original=4096,
)  # fmt: skip


def plan_gpt_oss_tensors(num_layers: int, vocab_size: int, shape: dict) -> list[TensorPlan]:
    """A gpt-oss model's tensors in llama.cpp's names: experts MXFP4, other matrices Q8_0, the rest F32."""
    hidden, heads, kv_heads, dim = shape["hidden"], shape["num_heads"], shape["num_kv_heads"], shape["head_dim"]
    experts, width = shape["num_experts"], shape["expert_ffn"]
    plans = [TensorPlan("token_embd.weight", (vocab_size, hidden), "Q8_0")]
    for i in range(num_layers):
        plans.append(TensorPlan(f"blk.{i}.attn_norm.weight", (hidden,), "F32"))
        for short, (rows, cols) in {
            "attn_q": (heads * dim, hidden),
            "attn_k": (kv_heads * dim, hidden),
            "attn_v": (kv_heads * dim, hidden),
            "attn_output": (hidden, heads * dim),
        }.items():
            plans.append(TensorPlan(f"blk.{i}.{short}.weight", (rows, cols), "Q8_0"))
            plans.append(TensorPlan(f"blk.{i}.{short}.bias", (rows,), "F32"))
        plans.append(TensorPlan(f"blk.{i}.attn_sinks.weight", (heads,), "F32"))
        plans.append(TensorPlan(f"blk.{i}.post_attention_norm.weight", (hidden,), "F32"))
        plans.append(TensorPlan(f"blk.{i}.ffn_gate_inp.weight", (experts, hidden), "F32"))
        plans.append(TensorPlan(f"blk.{i}.ffn_gate_inp.bias", (experts,), "F32"))
        for short, (rows, cols) in {
            "ffn_gate_exps": (width, hidden),
            "ffn_up_exps": (width, hidden),
            "ffn_down_exps": (hidden, width),
        }.items():
            plans.append(TensorPlan(f"blk.{i}.{short}.weight", (experts, rows, cols), "MXFP4"))
            plans.append(TensorPlan(f"blk.{i}.{short}.bias", (experts, rows), "F32"))
    plans.append(TensorPlan("output_norm.weight", (hidden,), "F32"))
    plans.append(TensorPlan("output.weight", (vocab_size, hidden), "Q8_0"))
    return plans


def plan_moe_tensors(type_name: str, num_layers: int, vocab_size: int, shape: dict) -> list[TensorPlan]:
    """A qwen3moe model's tensors in llama.cpp's names and order: norms and the router F32."""
    hidden, heads, kv_heads, dim = shape["hidden"], shape["num_heads"], shape["num_kv_heads"], shape["head_dim"]
    experts, width = shape["num_experts"], shape["expert_ffn"]
    plans = [TensorPlan("token_embd.weight", (vocab_size, hidden), "Q4_K" if type_name == "Q4_K_M" else type_name)]
    for i in range(num_layers):
        plans.append(TensorPlan(f"blk.{i}.attn_norm.weight", (hidden,), "F32"))
        for short, tensor_shape in {
            "attn_q": (heads * dim, hidden),
            "attn_k": (kv_heads * dim, hidden),
            "attn_v": (kv_heads * dim, hidden),
            "attn_output": (hidden, heads * dim),
        }.items():
            name = f"blk.{i}.{short}.weight"
            plans.append(TensorPlan(name, tensor_shape, tensor_type(name, type_name, i, num_layers)))
        plans.append(TensorPlan(f"blk.{i}.attn_q_norm.weight", (dim,), "F32"))
        plans.append(TensorPlan(f"blk.{i}.attn_k_norm.weight", (dim,), "F32"))
        plans.append(TensorPlan(f"blk.{i}.ffn_norm.weight", (hidden,), "F32"))
        plans.append(TensorPlan(f"blk.{i}.ffn_gate_inp.weight", (experts, hidden), "F32"))
        for short, tensor_shape in {
            "ffn_gate_exps": (experts, width, hidden),
            "ffn_up_exps": (experts, width, hidden),
            "ffn_down_exps": (experts, hidden, width),
        }.items():
            name = f"blk.{i}.{short}.weight"
            plans.append(TensorPlan(name, tensor_shape, tensor_type(name, type_name, i, num_layers)))
    plans.append(TensorPlan("output_norm.weight", (hidden,), "F32"))
    plans.append(TensorPlan("output.weight", (vocab_size, hidden), tensor_type("output.weight", type_name, 0, 1)))
    return plans


def random_blocks(rows: int, cols: int, type_name: str, rng: np.random.Generator) -> np.ndarray:
    """Valid random blocks of a [rows, cols] weight, as uint8 [rows, bytes per row]."""
    import gguf

    block_size, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
    if cols % block_size:
        raise ValueError(f"a row of {cols} values is not a whole number of {type_name} blocks ({block_size} values)")
    num_blocks = rows * cols // block_size
    blocks = rng.integers(0, 256, size=(num_blocks, type_size), dtype=np.uint8)  # [num_blocks, type_size]
    if type_name == "MXFP4":
        # byte 0 is the block's exponent e (scale 2^(e - 128) over levels up to 12, RMS about 5.9): e = 120
        # gives an RMS near WEIGHT_RMS; the 16 bytes of 4-bit codes after it are any bits
        blocks[:, 0] = rng.integers(119, 122, size=num_blocks, dtype=np.uint8)
        return blocks.reshape(rows, cols // block_size * type_size)
    scale = WEIGHT_RMS / UNIT_RMS[type_name]
    for offset in F16_FIELDS[type_name]:
        # random signs: the weights average zero even where dmin*m would shift them
        values = scale * rng.uniform(0.5, 1.5, num_blocks) * rng.choice((-1.0, 1.0), num_blocks)
        blocks[:, offset : offset + 2] = values.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, cols // block_size * type_size)


@lru_cache(maxsize=1)
def tokenizer_fields(gguf_path: Path) -> list[tuple[str, object, object, object]]:
    """(key, value, value type, array item type) of every tokenizer.* key in a GGUF file.

    Cached: parsing a GGUF with a 49152-token vocabulary takes seconds, and each written type needs it.
    """
    import gguf

    reader = gguf.GGUFReader(gguf_path, "r")
    fields = []
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            fields.append((key, field.contents(), field.types[0], sub_type))
    return fields


def write_bench_model(
    path: str | Path,
    type_name: str,
    num_layers: int = 16,
    seed: int = 0,
    *,
    shape: str = "1b",
    moe: dict | None = None,
    hidden: int = 2048,
    num_heads: int = 32,
    num_kv_heads: int = 8,
    head_dim: int = 64,
    ffn_hidden: int = 8192,
    context_length: int = 131072,
    rope_theta: float = 500000.0,
    rms_eps: float = 1e-5,
    tokenizer_gguf: str | Path | None = None,
) -> Path:
    """Write a random-weight model of `type_name` (Q4_0, Q8_0 or Q4_K_M) to `path` and return the path.
    `shape`: "1b" (Llama-3.2-1B's layer, sized by the keyword arguments) or "qwen3moe" (QWEN3_MOE, with the
    entries of `moe` in place of its own: tests write small ones).

    The tokenizer (and so the vocabulary size) comes from `tokenizer_gguf`, the starter model by default.
    Tensors are generated and written one at a time, so memory holds at most one (~110 MB for the
    Q8_0 embedding).
    """
    import gguf

    if type_name not in FILE_TYPES:
        raise ValueError(f"unknown type {type_name!r}; choose from {', '.join(FILE_TYPES)}")
    if tokenizer_gguf is None:
        from engine.loading.starter import fetch_starter

        tokenizer_gguf = fetch_starter()
    tokenizer = tokenizer_fields(Path(tokenizer_gguf).resolve())
    vocab_size = len(next(value for key, value, _, _ in tokenizer if key == "tokenizer.ggml.tokens"))

    path = Path(path)
    gpt_oss = shape == "gpt-oss"
    if gpt_oss != (type_name == "MXFP4"):
        raise ValueError("MXFP4 is the gpt-oss shape's type, and the only one it takes")
    spec = {**(GPT_OSS if gpt_oss else QWEN3_MOE), **(moe or {})}
    moe = shape in ("qwen3moe", "gpt-oss")
    if moe:
        hidden, num_heads, num_kv_heads, head_dim = (
            spec[k] for k in ("hidden", "num_heads", "num_kv_heads", "head_dim")
        )
        ffn_hidden, rope_theta, rms_eps = (
            spec.get("ffn_hidden", spec["expert_ffn"]),
            spec["rope_theta"],
            spec["rms_eps"],
        )
        context_length = spec["context_length"]
    elif shape != "1b":
        raise ValueError(f"unknown shape {shape!r}; choose 1b, qwen3moe or gpt-oss")
    writer = gguf.GGUFWriter(path, shape if moe else "llama")
    writer.add_name(path.stem)
    writer.add_file_type(FILE_TYPES[type_name])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_block_count(num_layers)
    writer.add_context_length(context_length)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn_hidden)
    writer.add_head_count(num_heads)
    writer.add_head_count_kv(num_kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(rms_eps)
    writer.add_rope_freq_base(rope_theta)
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(vocab_size)
    if moe:
        writer.add_expert_count(spec["num_experts"])
        writer.add_expert_used_count(spec["experts_used"])
        writer.add_expert_feed_forward_length(spec["expert_ffn"])
    if gpt_oss:
        writer.add_sliding_window(spec["sliding_window"])
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(spec["yarn_factor"])
        writer.add_rope_scaling_orig_ctx_len(spec["yarn_original"])
    for key, value, value_type, sub_type in tokenizer:
        writer.add_key_value(key, value, value_type, sub_type)

    if gpt_oss:
        plans = plan_gpt_oss_tensors(num_layers, vocab_size, spec)
    elif moe:
        plans = plan_moe_tensors(type_name, num_layers, vocab_size, spec)
    else:
        plans = plan_tensors(type_name, num_layers, vocab_size, hidden, num_heads, num_kv_heads, head_dim, ffn_hidden)
    for plan in plans:
        if plan.type_name == "F32":
            writer.add_tensor_info(plan.name, plan.shape, np.dtype(np.float32), 4 * int(np.prod(plan.shape)))
        else:
            qtype = gguf.GGMLQuantizationType[plan.type_name]
            block_size, type_size = gguf.GGML_QUANT_SIZES[qtype]
            *outer, cols = plan.shape
            byte_shape = (*outer, cols // block_size * type_size)  # the writer turns it back into the values' shape
            size = int(np.prod(byte_shape))
            writer.add_tensor_info(plan.name, byte_shape, np.dtype(np.uint8), size, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for plan in plans:
        if plan.type_name == "F32":
            writer.write_tensor_data(_float_values(plan, rng))
        else:
            *outer, cols = plan.shape
            blocks = random_blocks(int(np.prod(outer)), cols, plan.type_name, rng)
            writer.write_tensor_data(blocks.reshape(*outer, -1))
    writer.close()
    return path


def _float_values(plan: TensorPlan, rng: np.random.Generator) -> np.ndarray:
    """Norms 1, biases and sinks 0, a router random (so each token picks its own experts)."""
    if plan.name.endswith((".bias", "attn_sinks.weight")):
        return np.zeros(plan.shape, dtype=np.float32)
    if len(plan.shape) == 2:
        return rng.normal(0.0, WEIGHT_RMS, plan.shape).astype(np.float32)
    return np.ones(plan.shape, dtype=np.float32)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path, help="folder for the bench-1b-<type>.gguf files")
    parser.add_argument("--types", default="Q4_K_M,Q4_0,Q8_0", help="comma-separated: Q4_K_M, Q4_0, Q8_0")
    parser.add_argument(
        "--shape",
        choices=("1b", "qwen3moe", "gpt-oss"),
        default="1b",
        help="Llama-3.2-1B's, Qwen3-30B-A3B's or gpt-oss-20b's",
    )
    parser.add_argument("--layers", type=int, default=None, help="number of transformer blocks (16; qwen3moe: 4)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--tokenizer", type=Path, default=None, help="a GGUF file whose tokenizer.* keys to copy (default: the starter)"
    )
    args = parser.parse_args(argv)
    type_names = [t.strip() for t in args.types.split(",") if t.strip()]
    unknown = [t for t in type_names if t not in FILE_TYPES]
    if unknown:
        parser.error(f"unknown type(s) {', '.join(unknown)}; choose from {', '.join(FILE_TYPES)}")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for type_name in type_names:
        start = time.perf_counter()
        path = args.out_dir / f"bench-{args.shape}-{type_name}.gguf"
        layers = args.layers or (16 if args.shape == "1b" else 4)
        path = write_bench_model(path, type_name, layers, args.seed, shape=args.shape, tokenizer_gguf=args.tokenizer)
        size = path.stat().st_size
        print(f"{path}  {size / 2**20:.1f} MiB ({size} bytes)  in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
