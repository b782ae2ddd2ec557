"""CLIP and SigLIP vision encoders against transformers' CLIPVisionModel / SiglipVisionModel (fp32)."""

from __future__ import annotations

import pytest
import torch
import transformers
from safetensors.torch import load_file

from engine.errors import ModelLoadError, TensorMismatchError, UnsupportedArchitectureError
from engine.models.llava.clip import ClipVisionTower, VisionConfig
from engine.models.llava.siglip import SiglipVisionTower
from engine.models.llava.towers import vision_tower_class

CASES = {
    "clip": (
        transformers.CLIPVisionConfig,
        transformers.CLIPVisionModel,
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=3,
            num_attention_heads=4,
            image_size=28,
            patch_size=7,
        ),
    ),
    "clip-gelu": (
        transformers.CLIPVisionConfig,
        transformers.CLIPVisionModel,
        dict(
            hidden_size=48,
            intermediate_size=40,
            num_hidden_layers=2,
            num_attention_heads=3,
            image_size=30,
            patch_size=10,
            hidden_act="gelu",
            layer_norm_eps=1e-6,
        ),
    ),
    "siglip": (
        transformers.SiglipVisionConfig,
        transformers.SiglipVisionModel,
        # With the pooling head, whose tensors the tower must skip.
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=3,
            num_attention_heads=2,
            image_size=32,
            patch_size=8,
        ),
    ),
}


def _load_tower(folder, hf_config, **kwargs):
    cls = vision_tower_class(hf_config.model_type)
    with torch.device("meta"):
        tower = cls.from_hf_dict(hf_config.to_dict(), **kwargs)
    tower.load_tensors(load_file(folder / "model.safetensors"))
    return tower.eval().requires_grad_(False)


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request, tmp_path_factory):
    config_cls, model_cls, kwargs = CASES[request.param]
    torch.manual_seed(0)
    hf = model_cls(config_cls(**kwargs)).eval()
    folder = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(folder)
    return request.param, hf, _load_tower(folder, hf.config), folder


def _pixels(config, n=2):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 3, config.image_size, config.image_size, generator=g)


def test_hidden_states_match(pair):
    name, hf, ours, _ = pair
    pixels = _pixels(hf.config)
    with torch.no_grad():
        ref = hf(pixel_values=pixels, output_hidden_states=True)
        got = ours.hidden_states(pixels)
        last = ours(pixels)
    assert len(got) == len(ref.hidden_states) == hf.config.num_hidden_layers + 1
    for i, (g, r) in enumerate(zip(got, ref.hidden_states)):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-5, msg=f"{name}: hidden state {i}")
    torch.testing.assert_close(last, ref.last_hidden_state, atol=1e-5, rtol=1e-5, msg=f"{name}: last hidden state")
    assert ours.num_positions == ref.last_hidden_state.shape[1]


def test_truncated_tower_matches_first_layers(pair):
    name, hf, full, folder = pair
    short = _load_tower(folder, hf.config, num_layers=1, post_layernorm=False)
    assert len(short.encoder.layers) == 1 and short.post_layernorm is None
    pixels = _pixels(hf.config, n=1)
    with torch.no_grad():
        got, ref = short.hidden_states(pixels), full.hidden_states(pixels)[:2]
    assert len(got) == 2
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, atol=0, rtol=0)


def test_wrong_image_size_is_rejected(pair):
    _, hf, ours, _ = pair
    size = hf.config.image_size + hf.config.patch_size
    with pytest.raises(ValueError, match=f"{size}x{size}"):
        ours.hidden_states(torch.zeros(1, 3, size, size))


@pytest.mark.parametrize(
    "cls, hf_cls",
    [(ClipVisionTower, transformers.CLIPVisionConfig), (SiglipVisionTower, transformers.SiglipVisionConfig)],
)
def test_config_defaults_are_transformers(cls, hf_cls):
    # A vision_config that omits keys means transformers' defaults for its model_type.
    ours = VisionConfig.from_hf_dict({}, cls.DEFAULTS)
    ref = hf_cls()
    for field in vars(ours):
        assert getattr(ours, field) == getattr(ref, field), field


def test_bad_checkpoints_and_configs(tmp_path):
    config = transformers.CLIPVisionConfig(**CASES["clip"][2])
    torch.manual_seed(0)
    tensors = {k: v.clone() for k, v in transformers.CLIPVisionModel(config).state_dict().items()}

    def build(d=None):
        with torch.device("meta"):
            return ClipVisionTower.from_hf_dict(d or config.to_dict())

    wrong = dict(tensors)
    wrong["encoder.layers.1.mlp.fc1.weight"] = torch.zeros(65, 32)
    with pytest.raises(TensorMismatchError, match=r"fc1\.weight.*\(65, 32\)"):
        build().load_tensors(wrong)
    missing = {k: v for k, v in tensors.items() if "layers.2.self_attn.k_proj" not in k}
    with pytest.raises(TensorMismatchError, match=r"layers\.2\.self_attn\.k_proj"):
        build().load_tensors(missing)
    with pytest.raises(ModelLoadError, match="hidden_act.*'swish9'"):
        build({**config.to_dict(), "hidden_act": "swish9"})
    with pytest.raises(ModelLoadError, match="patch_size='big'"):
        build({**config.to_dict(), "patch_size": "big"})
    with pytest.raises(UnsupportedArchitectureError, match="'pixtral'"):
        vision_tower_class("pixtral")


def test_vision_model_prefix_loads_the_same(pair):
    # Checkpoints written by transformers < 5 (and CLIPModel checkpoints) nest the tower under "vision_model.".
    name, hf, ours, folder = pair
    tensors = {f"vision_model.{k}": v for k, v in load_file(folder / "model.safetensors").items()}
    with torch.device("meta"):
        prefixed = type(ours).from_hf_dict(hf.config.to_dict())
    prefixed.load_tensors(tensors)
    pixels = _pixels(hf.config, n=1)
    with torch.no_grad():
        torch.testing.assert_close(prefixed(pixels), ours(pixels), atol=0, rtol=0, msg=name)
