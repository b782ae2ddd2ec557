"""The Pixtral vision encoder against transformers' PixtralVisionModel (hidden states of one picture and of
pictures of different sizes in one sequence, truncated towers), its config parsing, and LLaVA with a Pixtral
encoder (Pixtral-12B's layout) being built from LLaVA configs. End-to-end checks of that model (prompt ids,
logits, greedy tokens, jobs) run in test_mistral3.py next to Mistral 3's."""

from __future__ import annotations

import pytest
import torch
import transformers

from engine.config.model import ModelConfig
from engine.errors import ModelLoadError, TensorMismatchError
from engine.models.llava import LlavaForConditionalGeneration
from engine.models.mistral3 import PixtralLlavaForConditionalGeneration
from engine.models.mistral3.pixtral import PixtralVisionConfig, PixtralVisionTower
from engine.models.registry import model_class
from engine.vision.handle import vision_of

HF_CONFIG = transformers.PixtralVisionConfig(
    hidden_size=48,
    intermediate_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,  # head_dim 12: the row and column bands have 3 frequencies each
    patch_size=4,
    image_size=64,
    hidden_act="silu",
    rope_parameters={"rope_type": "axial", "rope_theta": 100.0},
)


@pytest.fixture(scope="module")
def towers():
    torch.manual_seed(0)
    hf = transformers.PixtralVisionModel(HF_CONFIG).eval()
    with torch.no_grad():  # random init leaves the norms at one; make them matter
        for name, p in hf.named_parameters():
            if "norm" in name or "ln_pre" in name:
                p.normal_(1.0, 0.3)
    config = PixtralVisionConfig.from_hf_dict(HF_CONFIG.to_dict())
    with torch.device("meta"):
        ours = PixtralVisionTower(config)
    ours.load_tensors(dict(hf.state_dict()))
    return hf, ours


def _images(*sizes: tuple[int, int], seed: int = 1) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(3, h, w, generator=g) for h, w in sizes]


def _padded(images: list[torch.Tensor]) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """transformers' input for several pictures: zero-padded to one shape, with their sizes."""
    height, width = max(i.shape[1] for i in images), max(i.shape[2] for i in images)
    batch = torch.zeros(len(images), 3, height, width)
    for n, image in enumerate(images):
        batch[n, :, : image.shape[1], : image.shape[2]] = image
    return batch, [tuple(i.shape[1:]) for i in images]


def test_config_parsing_matches_transformers():
    ours = PixtralVisionConfig.from_hf_dict(HF_CONFIG.to_dict())
    assert (ours.head_dim, ours.rope_theta, ours.hidden_act) == (12, 100.0, "silu")
    defaults, ref = PixtralVisionConfig.from_hf_dict({}), transformers.PixtralVisionConfig()
    for name in (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "patch_size",
    ):
        assert getattr(defaults, name) == getattr(ref, name), name
    assert (defaults.image_size, defaults.hidden_act, defaults.head_dim) == (
        ref.image_size,
        ref.hidden_act,
        ref.head_dim,
    )
    assert defaults.rope_theta == ref.rope_parameters["rope_theta"]
    # transformers 4 configs keep rope_theta at the top level.
    assert PixtralVisionConfig.from_hf_dict({"rope_theta": 500.0}).rope_theta == 500.0


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1.0}}, "'linear'"),
        ({"num_attention_heads": 5}, "5 heads"),
        ({"num_attention_heads": 16}, "even size"),  # 48 / 16 = 3
        ({"patch_size": 0}, "patch_size"),
        ({"hidden_size": "wide"}, "hidden_size"),
        ({"hidden_act": "mish7"}, "'mish7'"),
    ],
)
def test_bad_configs_are_named(changes, message):
    with pytest.raises(ModelLoadError, match=message):
        config = PixtralVisionConfig.from_hf_dict({**HF_CONFIG.to_dict(), **changes})
        with torch.device("meta"):
            PixtralVisionTower(config)


@pytest.mark.parametrize("size", [(12, 20), (16, 4), (13, 22)], ids=["wide", "tall", "partial-patches"])
def test_one_picture_hidden_states_match(towers, size):
    hf, ours = towers
    (image,) = _images(size)
    with torch.no_grad():
        ref = hf(image[None], output_hidden_states=True).hidden_states
    got = ours.hidden_states([image])
    assert len(got) == len(ref) == HF_CONFIG.num_hidden_layers + 1
    assert got[-1].shape == ((size[0] // 4) * (size[1] // 4), HF_CONFIG.hidden_size)
    for i, (r, g) in enumerate(zip(ref, got)):
        torch.testing.assert_close(g, r[0], atol=1e-5, rtol=1e-5, msg=f"hidden state {i}")


def test_pictures_of_different_sizes_attend_only_to_themselves(towers):
    hf, ours = towers
    images = _images((12, 20), (16, 8), (4, 4), seed=2)
    batch, sizes = _padded(images)
    with torch.no_grad():
        ref = hf(batch, image_sizes=sizes, output_hidden_states=True).hidden_states
    got = ours.hidden_states(images)
    for i, (r, g) in enumerate(zip(ref, got)):
        torch.testing.assert_close(g, r[0], atol=1e-5, rtol=1e-5, msg=f"hidden state {i}")
    # Block-diagonal attention: together equals one by one.
    alone = torch.cat([ours([image]) for image in images])
    torch.testing.assert_close(ours(images), alone, atol=1e-5, rtol=1e-5)


def test_truncated_tower_gives_the_first_hidden_states(towers):
    hf, ours = towers
    config = PixtralVisionConfig.from_hf_dict(HF_CONFIG.to_dict())
    with torch.device("meta"):
        short = PixtralVisionTower(config, num_layers=1)
    short.load_tensors(dict(hf.state_dict()))  # tensors of the layers not built are ignored
    images = _images((8, 12))
    assert len(short.transformer.layers) == 1
    for a, b in zip(short.hidden_states(images), ours.hidden_states(images)[:2]):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    with pytest.raises(ValueError, match="num_layers=4"):
        PixtralVisionTower(config, num_layers=4)


def test_bad_pictures_are_named(towers):
    _, ours = towers
    with pytest.raises(ValueError, match="smaller than one 4px patch"):
        ours([torch.zeros(3, 3, 8)])
    with pytest.raises(ValueError, match=r"\[3, height, width\]"):
        ours([torch.zeros(1, 8, 8)])
    with pytest.raises(ValueError, match="at least one image"):
        ours([])


def test_missing_tensor_is_named(towers):
    hf, _ = towers
    tensors = {k: v for k, v in hf.state_dict().items() if k != "transformer.layers.2.feed_forward.up_proj.weight"}
    with torch.device("meta"):
        tower = PixtralVisionTower(PixtralVisionConfig.from_hf_dict(HF_CONFIG.to_dict()))
    with pytest.raises(TensorMismatchError, match=r"layers\.2\.feed_forward\.up_proj\.weight.*Pixtral"):
        tower.load_tensors(tensors)


# --- LLaVA with a Pixtral encoder (Pixtral-12B) ---------------------------------------------------------------


def _llava_config(**top) -> ModelConfig:
    d = transformers.LlavaConfig(vision_config={"model_type": "pixtral"}, **top).to_dict()
    return ModelConfig.from_hf_dict({**d, "architectures": ["LlavaForConditionalGeneration"]})


def test_llava_with_a_pixtral_config_is_pixtral_12b_shaped():
    ref = transformers.LlavaConfig(vision_config={"model_type": "pixtral"}, vision_feature_select_strategy="full")
    config = _llava_config(vision_feature_select_strategy="full")
    assert model_class(config.architecture) is LlavaForConditionalGeneration
    with torch.device("meta"):
        model = LlavaForConditionalGeneration(config)
    assert isinstance(model, PixtralLlavaForConditionalGeneration)
    assert model.config.architecture == "LlavaForConditionalGeneration"
    assert vision_of(model) is model.vision is model.vision_model
    assert model.image_token_id == ref.image_token_index
    assert model.token_patch == ref.vision_config.patch_size and model.merge_size == 1
    # LLaVA's default layer (second to last), so the last encoder layer is not built.
    assert model.feature_layers == (ref.vision_config.num_hidden_layers + 1 + ref.vision_feature_layer,)
    assert len(model.vision_tower.transformer.layers) == ref.vision_config.num_hidden_layers - 1
    assert model.multi_modal_projector.linear_1.bias is not None  # LLaVA's projector bias default
    side = ref.vision_config.image_size // ref.vision_config.patch_size
    assert model.tokens_per_image == side * (side + 1)


def test_llava_with_pixtral_refuses_dropping_the_first_patch():
    with pytest.raises(ModelLoadError, match="vision_feature_select_strategy is 'default'"):
        with torch.device("meta"):
            LlavaForConditionalGeneration(_llava_config())


def test_clip_llava_is_still_built_by_its_own_class():
    config = ModelConfig.from_hf_dict({"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava"})
    with torch.device("meta"):
        model = LlavaForConditionalGeneration(config)
    assert type(model) is LlavaForConditionalGeneration
