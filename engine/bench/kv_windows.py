"""The sliding-window rows of `python -m engine bench --only kv`: KV cache bytes of one long chat on Gemma 3's
shapes, with the sliding layers' pages given back (engine/cache/window.py) and kept, in bfloat16.

The bytes are what engine.cache.Cache allocates: the model is built on the meta device with each size's shape
(layers, KV heads, head size, window, five sliding layers to one full), so nothing is read or allocated, and the
cache's own sizing rules count the pages and window slots. Shapes are from the released configs.
"""

from __future__ import annotations

from typing import Any

import torch

# name: (layers, query heads, KV heads, head size, hidden size, window)
GEMMA3_SHAPES = {
    "Gemma 3 1B": (26, 4, 1, 256, 1152, 512),
    "Gemma 3 4B": (34, 8, 4, 256, 2560, 1024),
    "Gemma 3 12B": (48, 16, 8, 256, 3840, 1024),
    "Gemma 3 27B": (62, 32, 16, 128, 5376, 1024),
}
CONTEXT = 32768
NOTE = (
    "Sliding-window rows: bytes of a 32k-token KV cache (bfloat16) on Gemma 3's shapes built on the meta device: "
    "the default window pool (4 jobs' windows and prompt chunks), a pool for one job, and every page kept."
)


def _meta_model(shape: tuple[int, ...]):
    from engine.config.model import ModelConfig
    from engine.models.gemma3.text import Gemma3ForCausalLM

    layers, heads, kv_heads, head_dim, hidden, window = shape
    config = ModelConfig.from_hf_dict(
        {
            "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": 256,
            "hidden_size": hidden, "intermediate_size": 4 * hidden, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
            "sliding_window": window, "sliding_window_pattern": 6, "torch_dtype": "bfloat16",
        }
    )  # fmt: skip
    with torch.device("meta"):
        return Gemma3ForCausalLM(config).to(torch.bfloat16)


def measure(page_size: int = 256) -> dict[str, Any]:
    """Per shape: the cache's bytes with the default window pool, with one job's, and with every page kept."""
    from engine.cache import Cache
    from engine.cache.cache import WINDOW_CHUNK

    out: dict[str, Any] = {}
    for name, shape in GEMMA3_SHAPES.items():
        model = _meta_model(shape)
        one_job = shape[-1] + WINDOW_CHUNK + 2 * page_size
        out[name] = {
            "tokens": CONTEXT,
            "default_pool": Cache(model, CONTEXT, page_size=page_size).num_bytes,
            "one_job_pool": Cache(model, CONTEXT, page_size=page_size, sliding_tokens=one_job).num_bytes,
            "every_page": Cache(model, CONTEXT, page_size=page_size, sliding_tokens=CONTEXT).num_bytes,
        }
    return out


def rows(measured: dict[str, Any]) -> list[dict[str, str]]:
    table = []
    for name, sizes in measured.items():
        kept = sizes["every_page"]
        gib = [f"{sizes[k] / 2**30:.2f}" for k in ("default_pool", "one_job_pool", "every_page")]
        saved = [f"{1 - sizes[k] / kept:.0%}" for k in ("default_pool", "one_job_pool")]
        table.append(
            {
                "metric": f"{name} KV cache, {sizes['tokens'] // 1024}k tokens: default pool / one job's / all pages",
                "ours": f"{' / '.join(gib)} GiB",
                "target": "less memory",
                "result": f"{' / '.join(saved)} saved",
            }
        )
    return table
