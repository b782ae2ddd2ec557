"""Vision from GGUF for LLaVA with a CLIP tower: the projector file made by llama.cpp's legacy scripts (projector
type 'mlp', as most llava-1.5 / BakLLaVA mmproj files in the wild), the text GGUF by convert_hf_to_gguf.py, both
from the llama-cpp-python 0.3.36 sdist. Tandem loading the pair must give the folder's image rows (float32, within
1e-5) and greedy tokens.

How the legacy path runs here (docs/models.md, "Vision from GGUF"): llava_surgery_v2.py splits the folder into
llava.clip / llava.projector, convert_image_encoder_to_gguf.py --clip-model-is-vision writes the mmproj, as
llama.cpp's docs/multimodal/llava.md does for llava-1.6. That script needs the transformers llama.cpp pins
(4.57.6): with transformers 5, CLIPVisionModel has no `.vision_model` and the script stops. So the test fetches
4.57.6 with pip into the same cache as the sdist and runs the scripts with it; the model itself is made by the
venv's transformers. Two things the tiny model is made to fit:
- the legacy script always writes the patch embedding and the projector's matrices as float16, so every weight
  is a float16 value (the folder and the GGUF then hold the same numbers);
- transformers 5 saves the tower as `vision_tower.embeddings...`; every llava-hf folder on the Hub (and what
  the surgery script looks for) has `vision_tower.vision_model.embeddings...`, so the file is saved that way.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from engine.gguf.file import GGUFFile
from engine.models import Model
from engine.vision.handle import vision_of

SDIST = "llama_cpp_python-0.3.36"
LEGACY = f"{SDIST}/vendor/llama.cpp/tools/mtmd/legacy-models/"
# The picture and the greedy answer are test_mmproj.py's (tests are no package: loaded by path).
_spec = importlib.util.spec_from_file_location("mmproj_tests", Path(__file__).with_name("test_mmproj.py"))
_mmproj_tests = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mmproj_tests)
picture, greedy_tokens = _mmproj_tests.picture, _mmproj_tests.greedy_tokens

# What llama.cpp's tools/mtmd/requirements.txt pins for these scripts (transformers 4.57.6 and what it imports).
LEGACY_TRANSFORMERS = ["transformers==4.57.6", "tokenizers==0.22.1", "huggingface-hub==0.36.0"]


def _cache() -> Path:
    return Path(os.environ.get("TANDEM_LLAMA_SRC", Path.home() / ".cache" / "tandem-llama-cpp"))


@pytest.fixture(scope="session")
def legacy(converter) -> dict[str, Path]:
    """The legacy scripts (taken from the sdist the converter fixture fetched) and a folder holding the
    transformers they need, fetched with pip once; skipped with the reason where pip cannot fetch them."""
    cache = _cache()
    scripts = cache / LEGACY
    if not (scripts / "convert_image_encoder_to_gguf.py").is_file():
        archive = cache / f"{SDIST}.tar.gz"
        if not archive.is_file():
            pytest.skip(f"no {archive} to take llama.cpp's legacy LLaVA scripts from")
        with tarfile.open(archive) as tar:
            tar.extractall(cache, members=[m for m in tar.getmembers() if m.name.startswith(LEGACY)], filter="data")
    site = cache / "transformers-4.57.6"
    if not (site / "transformers" / "__init__.py").is_file():
        fetched = subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), *LEGACY_TRANSFORMERS],
            capture_output=True,
            text=True,
        )
        if fetched.returncode != 0:
            shutil.rmtree(site, ignore_errors=True)
            pytest.skip(
                "pip could not fetch transformers 4.57.6, which llama.cpp's legacy convert_image_encoder_to_gguf.py "
                f"needs (with transformers 5 it stops: CLIPVisionModel has no vision_model): {fetched.stderr[-300:]}"
            )
    return {"scripts": scripts, "site": site, "gguf_py": scripts.parents[2] / "gguf-py"}


def build_llava_clip(folder: Path, tokenizer_json: Path) -> None:
    """llava-1.5-7b-hf's shape in small (tests/engine/config/hf_configs): a CLIP tower (quick GELU, class token, 8-pixel
    patches of 32-pixel pictures) read at its second to last layer without the class token, a GELU projector and
    a Llama text model. The tower's own projection_dim (768 there) is not the text width, as in every such file."""
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(tokenizer_json), bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    tok.save_pretrained(folder)
    text = transformers.LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        initializer_range=0.15,  # peaked logits, so greedy argmax is not decided by rounding noise
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    vision = transformers.CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=2,
        image_size=32,
        patch_size=8,
        projection_dim=24,
    )
    config = transformers.LlavaConfig(
        text_config=text.to_dict(),
        vision_config=vision.to_dict(),
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        projector_hidden_act="gelu",
        image_seq_length=16,
    )
    torch.manual_seed(3)
    hf = transformers.LlavaForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "multi_modal_projector" in name:  # random init leaves it tiny: make the image rows matter
                p.normal_(0.0, 0.3)
            elif "norm" in name and p.dim() == 1:  # norms start at exactly 1 and 0: make a misplaced one show
                p.normal_(1.0 if name.endswith("weight") else 0.0, 0.3)
            p.copy_(p.half().float())  # float16 values, which the legacy script's float16 tensors hold exactly
    hf.save_pretrained(folder)
    weights = folder / "model.safetensors"
    tensors = {
        f"vision_tower.vision_model.{k.removeprefix('vision_tower.')}" if k.startswith("vision_tower.") else k: v
        for k, v in load_file(weights).items()
    }
    save_file(tensors, weights, metadata={"format": "pt"})
    transformers.CLIPImageProcessorPil(
        size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
    ).save_pretrained(folder)


def legacy_mmproj(legacy: dict[str, Path], folder: Path, out: Path) -> None:
    """llama.cpp's docs/multimodal/llava.md steps: surgery, a vit folder of the tower with its config, the
    encoder converter (float32 where it allows)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(legacy["site"]), str(legacy["gguf_py"])])}

    def run(script: str, *args: str) -> None:
        done = subprocess.run([sys.executable, str(legacy["scripts"] / script), *args], env=env, capture_output=True)
        if done.returncode != 0:
            raise AssertionError(f"{script} failed on {folder.name}:\n{done.stderr.decode()[-2000:]}")

    run("llava_surgery_v2.py", "-C", "-m", str(folder))
    vit = folder / "vit"
    vit.mkdir()
    shutil.move(folder / "llava.clip", vit / "pytorch_model.bin")
    shutil.move(folder / "llava.projector", vit / "llava.projector")
    vision = json.loads((folder / "config.json").read_text())["vision_config"]
    (vit / "config.json").write_text(json.dumps({**vision, "architectures": ["CLIPVisionModel"]}))
    args = ["-m", str(vit), "--llava-projector", str(vit / "llava.projector"), "--output-dir", str(vit)]
    run("convert_image_encoder_to_gguf.py", *args, "--clip-model-is-vision", "--use-f32")
    shutil.move(vit / "mmproj-model-f32.gguf", out)
    shutil.rmtree(vit)


@pytest.fixture(scope="module")
def pair(converter, legacy, known_tokenizer, tmp_path_factory):
    """(folder model, GGUF-pair model, folder); text.gguf and mmproj-llava.gguf lie in the folder."""
    folder = tmp_path_factory.mktemp("llava-clip")
    build_llava_clip(folder, known_tokenizer)
    converter(folder, folder / "text.gguf", mmproj=False)
    legacy_mmproj(legacy, folder, folder / "mmproj-llava.gguf")
    from_folder = Model.load(folder, dtype=torch.float32)
    from_gguf = Model.load(folder / "text.gguf", dtype=torch.float32, mmproj=folder / "mmproj-llava.gguf")
    return from_folder, from_gguf, folder


def test_the_legacy_file_is_what_tandem_reads(pair):
    """What the script writes and Tandem undoes: type 'mlp', CLIP's projection_dim in place of the text width, the
    tower cut after the layer LLaVA reads, fc1 named ffn_down."""
    _, _, folder = pair
    file = GGUFFile.open(folder / "mmproj-llava.gguf")
    meta, shapes = file.metadata, {t.name: tuple(t.shape) for t in file.tensors}
    assert meta["clip.projector_type"] == "mlp" and meta["clip.vision.projection_dim"] == 24
    assert meta["clip.vision.block_count"] == 2 and "v.blk.2.ln1.weight" not in shapes
    assert shapes["v.blk.0.ffn_down.weight"] == (32, 48)  # innermost first: 32 in, 48 out, so fc1
    assert "v.post_ln.weight" not in shapes and "v.class_embd" in shapes


@pytest.mark.parametrize("size", [(32, 32), (61, 40), (20, 14)])
def test_image_rows_match_the_folder(pair, size):
    from_folder, from_gguf, _ = pair
    assert type(from_gguf) is type(from_folder) and from_gguf.vision_error is None
    img = picture(size, seed=1)
    ours = from_gguf.vision.get_image_embeddings(image=img)
    ref = from_folder.vision.get_image_embeddings(image=img)
    assert ours.num_tokens == ref.num_tokens == from_gguf.vision.count_image_tokens(img) == 16
    torch.testing.assert_close(ours.embeddings, ref.embeddings, rtol=0, atol=1e-5)


def test_greedy_tokens_of_an_image_prompt_match_the_folder(pair):
    from_folder, from_gguf, _ = pair
    img = picture((61, 40), seed=2)
    tokens = greedy_tokens(from_gguf, img)
    assert len(tokens) == 24 and tokens == greedy_tokens(from_folder, img)
    assert tokens != greedy_tokens(from_gguf, picture((61, 40), seed=5))  # the picture decides the answer


def test_the_mmproj_beside_the_text_file_is_found_and_the_card_sees_images(pair):
    from engine.model_info import read_model_info

    from_folder, _, folder = pair
    found = Model.load(folder / "text.gguf", dtype=torch.float32)
    assert type(found) is type(from_folder) and vision_of(found) is not None
    assert read_model_info(folder / "text.gguf").can_see_images


def test_the_width_check_reads_the_projector_not_clip_projection_dim(pair, starter_gguf):
    _, _, folder = pair
    model = Model.load(starter_gguf, dtype=torch.float32, mmproj=folder / "mmproj-llava.gguf")
    assert vision_of(model) is None
    assert "width 64" in model.vision_error and "576 wide" in model.vision_error


def _with_tensor(src: Path, dst: Path, name: str, values: np.ndarray) -> Path:
    """`src` (a GGUF) written again with one more float32 tensor, by the installed gguf package."""
    import gguf

    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, reader.fields["general.architecture"].contents())
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            writer.add_array(key, field.contents())
        else:
            writer.add_key_value(key, field.contents(), field.types[0])
    for t in reader.tensors:
        writer.add_tensor(t.name, np.array(t.data), raw_shape=list(reversed(t.shape.tolist())), raw_dtype=t.tensor_type)
    writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def test_a_llava_1_6_projector_leaves_a_text_model_with_the_reason(pair, tmp_path):
    _, _, folder = pair
    bad = _with_tensor(
        folder / "mmproj-llava.gguf", tmp_path / "mmproj.gguf", "model.image_newline", np.zeros(64, np.float32)
    )
    model = Model.load(folder / "text.gguf", dtype=torch.float32, mmproj=bad)
    assert vision_of(model) is None and "LLaVA 1.6" in model.vision_error
    assert model.tokenizer.decode(model.tokenizer.encode("Hello")[0]) == "Hello"
