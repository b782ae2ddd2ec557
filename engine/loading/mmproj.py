"""Vision from GGUF: a text GGUF plus its mmproj file (llama.cpp's multimodal projector) as one vision model.

llama.cpp's converter (`convert_hf_to_gguf.py --mmproj`) writes a vision-language checkpoint's tower and
projector into a file of `general.architecture = "clip"`: `clip.*` metadata (projector type, image and patch
size, widths, mean/std) and `v.*` / `mm.*` tensors. Tandem translates that file back into what the Hugging
Face folder path already loads, so no tower code knows about GGUF:

    text.gguf   --load_gguf-->  text ModelConfig + "model.layers..." tensors  --\\
    mmproj.gguf --family of clip.projector_type--> vision_config, extra keys,  --+--> the family's
                                HF-named tower tensors, processor dict         /     VisionLanguageModel

What the mmproj lacks (the image token, the processor's other options) is the family's Hugging Face default
or read from the text file's vocabulary. engine/loading/mmproj_families/ holds the per-family tables, a module each.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from engine.config.model import ModelConfig
from engine.errors import CorruptFileError, ModelLoadError
from engine.gguf.file import GGUFFile
from engine.gguf.tensors import check_types, dequantize
from engine.loading.mmproj_families import FAMILIES, MmprojError
from engine.loading.mmproj_packed import read_packable, translate_packed

__all__ = ["MmprojError", "VisionPart", "assemble", "find_mmproj", "pair_mmproj", "paired_mmproj", "read_mmproj"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VisionPart:
    """An mmproj translated into the Hugging Face terms of its family's model class."""

    architecture: str  # the vision-language model class, e.g. "Idefics3ForConditionalGeneration"
    extra: dict[str, Any]  # what config.json would hold besides text_config (vision_config, scale_factor, ...)
    tensors: dict[str, torch.Tensor]  # checkpoint names of the family's folder layout
    processor: Any  # the family's image processor, built from the mmproj's metadata
    image_token_id: int


def find_mmproj(text_path: Path) -> Path | None:
    """The `mmproj*.gguf` beside a text GGUF (how llama.cpp, LM Studio and Ollama ship the pair), or None.

    Several candidates (one folder of downloads) narrow to those whose projection width is the text model's
    embedding width; still several is ambiguous: none is picked, and the error says to pass one as `mmproj=`."""
    found = sorted(p for p in text_path.parent.glob("*.gguf") if p.name.lower().startswith("mmproj") and p != text_path)
    if len(found) > 1:
        text = GGUFFile.open(text_path)
        width = text.metadata.get(f"{text.architecture}.embedding_length")
        fitting = [p for p in found if _projection_width(p) == width]
        if len(fitting) == 1:
            return fitting[0]
        raise MmprojError(
            f"{text_path.parent} holds several projector files ({', '.join(p.name for p in found)}) and "
            f"{'none' if not fitting else 'more than one'} fits {text_path.name}'s width; pass the one that "
            "belongs to this model as mmproj=."
        )
    return found[0] if found else None


def _projection_width(path: Path) -> int | None:
    try:
        file = GGUFFile.open(path)
    except ModelLoadError:
        return None  # not a readable projector: never the one picked
    family = FAMILIES.get(file.metadata.get("clip.projector_type", "mlp"))
    if family is None:  # a type Tandem does not run: its key, so that loading it names the type
        return file.metadata.get("clip.vision.projection_dim")
    return family.projection_width(file.metadata, file.tensor_map)


def paired_mmproj(text_path: Path) -> Path | None:
    """The mmproj beside a text GGUF whose projector type Tandem pairs, from headers alone (its width and image
    token are checked at load), or None: what a model card needs to say the model sees images."""
    try:
        found = find_mmproj(text_path)
        meta = GGUFFile.open(found).metadata if found is not None else {}
    except ModelLoadError:
        return None  # several candidates or an unreadable file: loading says which
    is_vision = meta.get("general.architecture") == "clip" and meta.get("clip.has_vision_encoder", False)
    return found if is_vision and meta.get("clip.projector_type", "mlp") in FAMILIES else None


def read_mmproj(
    path: Path,
    text_file: GGUFFile,
    text_config: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    quantized: str | None = None,
) -> VisionPart:
    """Translate the mmproj at `path` for the text model of `text_file` / `text_config`. With `quantized="int4"`
    (what the text model was loaded with) its quantized linear weights stay packed, as the text model's do
    (engine/loading/mmproj_packed.py); None dequantizes every tensor to `dtype`.

    Raises MmprojError for a projector type Tandem does not run (naming it and the supported ones) and for an
    mmproj whose embedding width or image token does not fit the text model; CorruptFileError for a file that
    is not an mmproj at all."""
    import gguf  # heavy import kept out of module import time

    file = GGUFFile.open(path)
    meta = file.metadata
    if meta.get("general.architecture") != "clip":
        raise CorruptFileError(
            f"{path} is not a projector file (its general.architecture is "
            f"{meta.get('general.architecture')!r}, not 'clip'). Pass the mmproj*.gguf that came with the model."
        )
    if not meta.get("clip.has_vision_encoder", False):
        raise MmprojError(f"{path} has no vision encoder (an audio-only projector); Tandem reads images only.")
    kind = meta.get("clip.projector_type", "mlp")  # files older than the key are LLaVA's two-layer MLP
    family = FAMILIES.get(kind)
    if family is None:
        raise MmprojError(
            f"{path.name} holds a {kind!r} projector, which Tandem does not run. Supported projector types: "
            f"{', '.join(sorted(FAMILIES))}. Images are off; the text model works."
        )
    width = family.projection_width(meta, file.tensor_map)
    if width != text_config.hidden_size:
        raise MmprojError(
            f"{path.name} projects images to width {width}, but the text model's embeddings are "
            f"{text_config.hidden_size} wide: this mmproj belongs to another model. Use the mmproj of the same "
            "model (and size) as the text GGUF."
        )
    vocab = text_file.metadata.get("tokenizer.ggml.tokens") or []
    try:
        image_token_id = vocab.index(family.image_token)
    except ValueError:
        raise MmprojError(
            f"{path.name} is a {kind} projector, whose prompts mark images with {family.image_token!r}, but "
            f"{text_file.path.name}'s vocabulary has no such token: the two files are not one model."
        ) from None
    check_types(path, file.tensors, gguf)
    packable = read_packable(file.tensors, dtype, device) if quantized == "int4" else {}
    floats = {
        t.name: dequantize(t, gguf).to(device=device, dtype=dtype) for t in file.tensors if t.name not in packable
    }
    source = f"{path.name} metadata"
    try:
        extra, tensors, processor = translate_packed(
            lambda raw: family.translate(meta, raw, text_file.metadata, source), floats, packable, gguf
        )
    except KeyError as e:
        raise CorruptFileError(
            f"{path} lacks {e.args[0]}, which every {kind} projector file has. The file is incomplete or was "
            "written by another converter; get another copy."
        ) from None
    return VisionPart(family.architecture_of(meta), extra, tensors, processor, image_token_id)


def assemble(
    part: VisionPart, text_config: ModelConfig, text_tensors: dict[str, Any], checkpoint_parts: tuple
) -> tuple[ModelConfig, dict[str, Any]]:
    """The vision-language config and checkpoint: the text config under the family's architecture (as
    config.json's text_config would give it), and the text tensors renamed into the family's layout beside
    the tower's."""
    config = replace(
        text_config,
        architecture=part.architecture,
        text_architecture=text_config.architecture,
        image_token_id=part.image_token_id,
        extra=part.extra,
    )
    tensors = dict(part.tensors)
    for name, value in text_tensors.items():
        # The first checkpoint prefix that routes `name` (a text model's own name) to the language model.
        prefix, inner = next(
            (p, i) for p, where, i in checkpoint_parts if where == "language_model" and name.startswith(i)
        )
        tensors[prefix + name[len(inner) :]] = value
    return config, tensors


def pair_mmproj(
    text_path: Path,
    mmproj: str | Path | None,
    text_config: ModelConfig,
    text_tensors: dict[str, Any],
    dtype: torch.dtype,
    device: torch.device,
    has_rope_freq_factors: bool = False,
    quantized: str | None = None,
) -> tuple[ModelConfig, dict[str, Any], Any, str | None]:
    """The config and checkpoint to build for a text GGUF and its mmproj (`mmproj`, else the one beside it):
    `(config, tensors, image processor or None, why images are off or None)`. `quantized` is the text model's
    (see `read_mmproj`).

    Without a usable mmproj the text config and tensors come back unchanged, with the reason when there was
    an mmproj (unsupported, mismatched, several candidates): the text model stays usable. An explicitly named
    mmproj that does not exist or is not a projector file raises instead: that is a mistake in the call."""
    from engine.errors import MissingFileError
    from engine.models.registry import model_class

    try:
        if mmproj is not None:
            mmproj = Path(mmproj).expanduser()
            if not mmproj.is_file():
                raise MissingFileError(f"mmproj {mmproj} does not exist. Pass the mmproj*.gguf of this model.")
        else:
            mmproj = find_mmproj(text_path)
            if mmproj is None:
                return text_config, text_tensors, None, None
        if has_rope_freq_factors:
            # The vision-language classes build their text model from the config alone (no llama3 rope table).
            raise MmprojError(
                f"{text_path.name} uses llama3-style rope scaling (rope_freqs.weight), which Tandem does not "
                "pair with a projector yet. Load the Hugging Face folder for images."
            )
        part = read_mmproj(mmproj, GGUFFile.open(text_path), text_config, dtype, device, quantized)
    except MmprojError as e:
        log.warning("%s: images are off: %s", text_path.name, e)
        return text_config, text_tensors, None, str(e)
    config, tensors = assemble(part, text_config, text_tensors, model_class(part.architecture).checkpoint_parts)
    log.info("paired %s with its projector %s as %s", text_path.name, mmproj.name, part.architecture)
    return config, tensors, part.processor, None
