"""Released config.json files, with the keys they leave out, read as transformers reads them.

The files in tests/engine/config/hf_configs/ are shaped like the config.json of the Hugging Face repositories they
are named after (only keys those files have; nested sub-configs as partial as theirs). Each is read by
transformers' AutoConfig and by Tandem (ModelConfig, then the model class built on the meta device), and
every value a Tandem model reads is compared: the text model's shape, norms, rotary frequencies (computed by
transformers' own rotary modules), sliding windows and ties; the vision encoder's shape; the wrapper's token
ids, merge/scale factors, feature layers and projector settings.

Bad inputs tried: sub-configs left out entirely (transformers then builds each wrapper's own defaults,
which differ from the text family's: Idefics3's rms_norm_eps, Mistral 3's whole 24B text model); a nested
text_config without model_type (Gemma 3 and Qwen2-VL use a fixed text class, the others a default family);
text-only configs holding only their shape, and ones missing a shape key (named, not defaulted); a Qwen2-VL config with rope_scaling but no rope_theta;
unsupported vision-language architectures (PaliGemma, Florence-2), which must fail naming the architecture
and listing the supported ones.
"""

from __future__ import annotations

import copy
import importlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from engine.config.model import ModelConfig
from engine.errors import ModelLoadError, UnsupportedArchitectureError
from engine.loading.model import load_model
from engine.models.registry import model_class, supported_architectures
from engine.vision.layers import ACTIVATIONS

CONFIGS = Path(__file__).parent / "hf_configs"
SUPPORTED = [
    "gemma-3-4b-it",
    "gemma-3-27b-it",
    "gemma-3-1b-it",
    "SmolVLM-256M-Instruct",
    "SmolVLM2-2.2B-Instruct",
    "Idefics3-8B-Llama3",
    "Mistral-Small-3.1-24B-Instruct-2503",
    "pixtral-12b",
    "Qwen2.5-VL-7B-Instruct",
    "Qwen2-VL-2B-Instruct",
    "llava-1.5-7b-hf",
    "llava-interleave-qwen-0.5b-hf",
    "Qwen2.5-0.5B-Instruct",
    "Mistral-7B-Instruct-v0.3",
    "Mistral-7B-v0.1",
]
# transformers' rotary module of each text config class, whose inverse frequencies our tables must equal.
ROTARY = {
    "LlamaConfig": ("llama", "LlamaRotaryEmbedding"),
    "MistralConfig": ("mistral", "MistralRotaryEmbedding"),
    "Qwen2Config": ("qwen2", "Qwen2RotaryEmbedding"),
    "Qwen2VLTextConfig": ("qwen2_vl", "Qwen2VLRotaryEmbedding"),
    "Qwen2_5_VLTextConfig": ("qwen2_5_vl", "Qwen2_5_VLRotaryEmbedding"),
    "Gemma3TextConfig": ("gemma3", "Gemma3RotaryEmbedding"),
}


def real(name: str) -> dict[str, Any]:
    return json.loads((CONFIGS / f"{name}.json").read_text(encoding="utf-8"))


def both(d: dict[str, Any], tmp_path: Path) -> tuple[Any, torch.nn.Module]:
    """(transformers' config, our model built on the meta device) from one config.json."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(d), encoding="utf-8")
    hf = transformers.AutoConfig.from_pretrained(tmp_path)
    config = ModelConfig.from_file(path)
    with torch.device("meta"):
        model = model_class(config.architecture)(config)
    return hf, model


def hf_inv_freq(text_config: Any, layer_type: str | None = None) -> torch.Tensor:
    module, name = ROTARY[type(text_config).__name__]
    rotary = getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"), name)
    rotary = rotary(config=text_config)
    return getattr(rotary, f"{layer_type}_inv_freq" if layer_type else "inv_freq").float()


def text_differences(hf: Any, model: Any) -> dict[str, tuple[Any, Any]]:
    """Fields of the text model that differ, as {name: (ours, transformers')}."""
    tc = hf.get_text_config()
    lm = getattr(model, "language_model", model)
    ours = lm.config
    head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
    pairs = {
        "vocab_size": (ours.vocab_size, tc.vocab_size),
        "hidden_size": (ours.hidden_size, tc.hidden_size),
        "intermediate_size": (ours.intermediate_size, tc.intermediate_size),
        "num_hidden_layers": (ours.num_hidden_layers, tc.num_hidden_layers),
        "num_attention_heads": (ours.num_attention_heads, tc.num_attention_heads),
        "num_key_value_heads": (ours.num_key_value_heads, tc.num_key_value_heads),
        "head_dim": (ours.head_dim, head_dim),
        "rms_norm_eps": (ours.rms_norm_eps, tc.rms_norm_eps),
        "attention_bias": (ours.attention_bias, getattr(tc, "attention_bias", type(tc).__name__.startswith("Qwen2"))),
        "mlp_bias": (ours.mlp_bias, getattr(tc, "mlp_bias", False)),
        # The wrapper's flag decides the tie in transformers (LLaVA and Qwen2-VL copy the text model's into it).
        "tie_word_embeddings": (model.config.tie_word_embeddings, hf.tie_word_embeddings),
        "torch_dtype": (model.config.torch_dtype, None if hf.dtype is None else str(hf.dtype).removeprefix("torch.")),
    }
    if type(tc).__name__ == "Gemma3TextConfig":
        s = lm.settings
        pairs |= {
            "query_pre_attn_scalar": (s.query_pre_attn_scalar, tc.query_pre_attn_scalar),
            "sliding_window": (s.sliding_window, tc.sliding_window),
            "layer_types": (s.is_sliding, tuple(t == "sliding_attention" for t in tc.layer_types)),
            "hidden_activation": (s.hidden_activation, tc.hidden_activation),
            "full_inv_freq": (lm.rope.inv_freq, hf_inv_freq(tc, "full_attention")),
            "sliding_inv_freq": (lm.local_rope.inv_freq, hf_inv_freq(tc, "sliding_attention")),
        }
        if not hasattr(model, "language_model"):  # transformers caps logits in Gemma3ForCausalLM only
            pairs["final_logit_softcapping"] = (s.final_logit_softcapping, tc.final_logit_softcapping)
    else:
        # transformers keeps `sliding_window` in Qwen2 configs but applies it only with use_sliding_window.
        window = getattr(tc, "sliding_window", None) if getattr(tc, "use_sliding_window", True) else None
        pairs["sliding_window"] = (ours.sliding_window, window)
        pairs["inv_freq"] = (lm.rope.inv_freq, hf_inv_freq(tc))
    return {k: v for k, v in pairs.items() if not _same(*v)}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return a.shape == b.shape and torch.allclose(a.float(), b.float(), rtol=1e-6, atol=0)
    return a == b


def vision_differences(hf: Any, model: Any) -> dict[str, tuple[Any, Any]]:
    """Fields of the vision side and the wrapper that differ, as {name: (ours, transformers')}."""
    vc = hf.vision_config
    kind = type(model).__name__
    pairs: dict[str, tuple[Any, Any]] = {"image_token_id": (model.image_token_id, hf.image_token_id)}
    if kind.startswith("Qwen2"):
        ours = model.vision_config
        v2_5 = kind.startswith("Qwen2_5")
        pairs |= {
            "depth": (ours.depth, vc.depth),
            "num_heads": (ours.num_heads, vc.num_heads),
            "width": (ours.hidden_size, vc.hidden_size if v2_5 else vc.embed_dim),
            "out_width": (ours.out_hidden_size, vc.out_hidden_size if v2_5 else vc.hidden_size),
            "intermediate_size": (
                ours.intermediate_size,
                vc.intermediate_size if v2_5 else vc.embed_dim * vc.mlp_ratio,
            ),
            "hidden_act": (ours.hidden_act, vc.hidden_act),
            "in_channels": (ours.in_channels, vc.in_channels),
            "patch_size": (ours.patch_size, vc.patch_size),
            "temporal_patch_size": (ours.temporal_patch_size, vc.temporal_patch_size),
            "spatial_merge_size": (ours.spatial_merge_size, vc.spatial_merge_size),
            "window_size": (ours.window_size, vc.window_size if v2_5 else None),
            "fullatt_block_indexes": (ours.fullatt_block_indexes, tuple(vc.fullatt_block_indexes) if v2_5 else ()),
            "vision_start_token_id": (model.vision_start_token_id, hf.vision_start_token_id),
            "vision_end_token_id": (model.vision_end_token_id, hf.vision_end_token_id),
            # transformers' rotary module falls back to [16, 24, 24] where the config has no sections.
            "mrope_section": (
                model.mrope_section,
                hf.get_text_config().rope_parameters.get("mrope_section", [16, 24, 24]),
            ),
        }
        return {k: v for k, v in pairs.items() if not _same(*v)}
    ours = model.vision_tower.config
    names = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_channels"]
    names += ["image_size", "patch_size", "hidden_act"]
    names += ["rope_theta"] if vc.model_type == "pixtral" else ["layer_norm_eps"]
    for name in names:
        theirs = vc.rope_parameters["rope_theta"] if name == "rope_theta" else getattr(vc, name)
        pairs[f"vision.{name}"] = (getattr(ours, name), theirs)
    if kind.startswith("Gemma3"):
        pairs |= {
            "mm_tokens_per_image": (model.mm_tokens_per_image, hf.mm_tokens_per_image),
            "boi_token_id": (model.boi_token_id, hf.boi_token_index),
            "eoi_token_id": (model.eoi_token_id, hf.eoi_token_index),
        }
    elif kind.startswith("Idefics3"):
        pairs["scale_factor"] = (model.scale_factor, hf.scale_factor)
    else:  # LLaVA, Pixtral-12B, Mistral 3
        layers = hf.vision_feature_layer if isinstance(hf.vision_feature_layer, list) else [hf.vision_feature_layer]
        projector = model.multi_modal_projector
        pairs |= {
            "vision_feature_layer": (model.feature_layers, tuple(i % (vc.num_hidden_layers + 1) for i in layers)),
            "projector_hidden_act": (projector.act, ACTIVATIONS[hf.projector_hidden_act]),
            "multimodal_projector_bias": (projector.linear_1.bias is not None, hf.multimodal_projector_bias),
        }
        if hasattr(model, "select_strategy"):
            pairs["vision_feature_select_strategy"] = (model.select_strategy, hf.vision_feature_select_strategy)
        if kind.startswith("Mistral3"):
            pairs["spatial_merge_size"] = (model.merge_size, hf.spatial_merge_size)
    return {k: v for k, v in pairs.items() if not _same(*v)}


def check(d: dict[str, Any], tmp_path: Path) -> None:
    hf, model = both(d, tmp_path)
    assert text_differences(hf, model) == {}
    if hasattr(model, "vision"):
        assert vision_differences(hf, model) == {}


@pytest.mark.parametrize("name", SUPPORTED)
def test_released_config_reads_as_transformers_reads_it(name, tmp_path):
    check(real(name), tmp_path)


VLMS = [n for n in SUPPORTED if "vision_config" in real(n)]


@pytest.mark.parametrize("name", VLMS)
def test_left_out_text_config_takes_the_wrappers_defaults(name, tmp_path):
    d = real(name)
    d.pop("text_config", None)
    if d["model_type"] in ("qwen2_vl", "qwen2_5_vl"):  # their text keys stand at the top level
        d = {k: v for k, v in d.items() if k in ("architectures", "model_type", "vision_config")}
    if d["model_type"] in ("qwen2_vl", "qwen2_5_vl"):
        # The vision model must put out rows as wide as the default text model's (8192).
        d["vision_config"]["out_hidden_size" if d["model_type"] == "qwen2_5_vl" else "hidden_size"] = 8192
    check(d, tmp_path)


@pytest.mark.parametrize("name", VLMS)
def test_left_out_vision_config_takes_the_wrappers_defaults(name, tmp_path):
    d = real(name)
    del d["vision_config"]
    if d["model_type"] in ("qwen2_vl", "qwen2_5_vl"):
        # The default vision model puts out rows of 3584, so the text model must be that wide (Qwen2.5-VL-7B's).
        d |= {"hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4}
    if d["model_type"] == "gemma3":
        d["mm_tokens_per_image"] = 49  # the default SigLIP has 14 x 14 patches, which pool to 7 x 7, not 16 x 16
    check(d, tmp_path)


@pytest.mark.parametrize("name", ["gemma-3-4b-it", "Mistral-Small-3.1-24B-Instruct-2503", "SmolVLM-256M-Instruct"])
def test_nested_text_config_without_model_type(name, tmp_path):
    d = real(name)
    d["text_config"].pop("model_type")
    check(d, tmp_path)


def test_qwen2_vl_with_a_nested_text_config_without_model_type(tmp_path):
    flat = real("Qwen2.5-VL-7B-Instruct")
    text = {k: v for k, v in flat.items() if k not in ("architectures", "model_type", "vision_config")}
    nested = {k: flat[k] for k in ("architectures", "vision_config", "torch_dtype", "image_token_id")}
    check({**nested, "model_type": "qwen2_5_vl", "text_config": text}, tmp_path)


def test_qwen2_vl_rope_scaling_without_rope_theta_takes_the_family_theta(tmp_path):
    d = real("Qwen2-VL-2B-Instruct")
    del d["rope_theta"]  # transformers then uses Qwen2-VL's own default, 1e6, not the usual 1e4
    check(d, tmp_path)


# Text-only configs with their shape and nothing else: every other key is the family's default. (transformers
# writes the shape of a top-level config always; a file without it is damaged, which must be named.)
SHAPE = {"vocab_size": 320, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 6}
PARTIAL_TEXT = {
    "gemma3_text": {**SHAPE, "num_attention_heads": 4, "rope_scaling": {"factor": 8.0, "rope_type": "linear"}},
    "qwen2": {**SHAPE, "num_attention_heads": 32},
    "mistral": {**SHAPE, "num_attention_heads": 8},
    "llama": {**SHAPE, "num_attention_heads": 4},
}
ARCHITECTURES = {"gemma3_text": "Gemma3", "qwen2": "Qwen2", "mistral": "Mistral", "llama": "Llama"}


@pytest.mark.parametrize("family", sorted(PARTIAL_TEXT))
def test_partial_text_only_config_takes_the_family_defaults(family, tmp_path):
    d = {"architectures": [f"{ARCHITECTURES[family]}ForCausalLM"], "model_type": family, **PARTIAL_TEXT[family]}
    check(copy.deepcopy(d), tmp_path)


@pytest.mark.parametrize("family", sorted(PARTIAL_TEXT))
def test_text_only_config_without_its_shape_is_named(family):
    d = {"architectures": [f"{ARCHITECTURES[family]}ForCausalLM"], "model_type": family, **PARTIAL_TEXT[family]}
    del d["hidden_size"]
    with pytest.raises(ModelLoadError, match="'hidden_size'"):
        ModelConfig.from_hf_dict(d)


def test_gemma3_text_only_ties_its_head_by_default(tmp_path):
    # gemma-3-1b-it says nothing about ties; Gemma3TextConfig ties, and the checkpoint has no lm_head.
    _, model = both(real("gemma-3-1b-it"), tmp_path)
    assert model.config.tie_word_embeddings is True


@pytest.mark.parametrize(
    ("name", "architecture"),
    [
        ("paligemma-3b-pt-224", "PaliGemmaForConditionalGeneration"),
        ("Florence-2-base", "Florence2ForConditionalGeneration"),
    ],
)
def test_unsupported_vision_language_model_names_itself_and_the_supported_ones(name, architecture, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(real(name)), encoding="utf-8")
    with pytest.raises(UnsupportedArchitectureError) as err:
        load_model(tmp_path)
    message = str(err.value)
    assert repr(architecture) in message
    for supported in supported_architectures():
        assert supported in message
