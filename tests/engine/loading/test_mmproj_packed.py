"""Vision from GGUF with a quantized mmproj: the tower's and projector's quantized linear weights stay packed (the
text model's `Linear` and block kernels), and the image rows match the same file dequantized by the gguf package
in float32 within the kernels' rounding.

The pairs are the tiny models of test_mmproj.py, converted by llama.cpp's converter, with the mmproj's linear
weights then quantized by the gguf package (Q8_0, Q4_0, Q5_1, Q4_1 in turn, so a fused q/k/v mixes types):
Pixtral reorders its q/k rows at load, Qwen2-VL joins q, k and v, so both of the families' row moves are
covered. A weight is quantized where its rows are whole 32-value blocks (the converter's own rule), so a
tower Linear is expected packed exactly when its in_features is a multiple of 32.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from engine.gguf.file import GGUFFile
from engine.gguf.tensors import dequantize
from engine.loading.mmproj_packed import read_packable, translate_packed
from engine.models import Model
from engine.models.linear import Linear

from .test_mmproj import BUILDERS, picture

TYPES = ("Q8_0", "Q4_0", "Q5_1", "Q4_1")
CPU = torch.device("cpu")


def quantize_linears(src: Path, dst: Path) -> dict[str, str]:
    """`src` (a float32 mmproj) written again with its 2-D linear weights quantized by the gguf package, the
    types taken in turn; embeddings, convolutions, norms and biases as they were. GGUF name -> type written."""
    import gguf

    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, reader.fields["general.architecture"].contents())
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_array(name, field.contents())
        else:
            writer.add_key_value(name, field.contents(), kind)
    written = {}
    for t in reader.tensors:
        data = np.array(t.data)
        shape = list(reversed(t.shape.tolist()))
        is_linear = len(shape) == 2 and t.name.endswith(".weight") and "_embd" not in t.name
        if is_linear and shape[1] % 32 == 0 and t.tensor_type == gguf.GGMLQuantizationType.F32:
            qtype = gguf.GGMLQuantizationType[TYPES[len(written) % len(TYPES)]]
            writer.add_tensor(t.name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)
            written[t.name] = qtype.name
        else:
            writer.add_tensor(t.name, data, raw_shape=shape, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return written


@pytest.fixture(scope="module", params=["pixtral", "qwen2_vl"])
def quantized_pair(request, converter, known_tokenizer, tmp_path_factory):
    """(packed: bfloat16 on the CPU, reference: float32 from gguf's dequantizer, folder): one quantized mmproj."""
    name = request.param
    folder = tmp_path_factory.mktemp(f"{name}-quantized")
    BUILDERS[name](folder, known_tokenizer)
    converter(folder, folder / "text.gguf", mmproj=False)
    converter(folder, folder / "float-mmproj.gguf", mmproj=True)
    written = quantize_linears(folder / "float-mmproj.gguf", folder / f"mmproj-{name}-q.gguf")
    assert len(set(written.values())) == len(TYPES)
    (folder / "float-mmproj.gguf").unlink()  # one projector beside the text file: the quantized one
    packed = Model.load(folder / "text.gguf", dtype=torch.bfloat16, device=CPU)
    reference = Model.load(folder / "text.gguf", dtype=torch.float32, device=CPU)
    return packed, reference, folder


def tower_linears(model) -> dict[str, Linear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, Linear) and not n.startswith("language_model.")}


def test_quantized_tower_and_projector_linears_stay_packed(quantized_pair):
    packed, reference, _ = quantized_pair
    assert packed.vision_error is None
    linears = tower_linears(packed)
    assert any(".layers." in n or ".blocks." in n for n in linears) and any(
        "merger" in n or "projector" in n for n in linears
    )
    for name, module in linears.items():
        expect_packed = module.in_features % 32 == 0
        assert module.is_quantized == expect_packed, f"{name}: {module.extra_repr()}"
        # no bfloat16 copy beside the blocks: the weight parameter is gone
        assert ("weight" in module._parameters) != expect_packed, name
    assert not any(m.is_quantized for m in tower_linears(reference).values())  # float32: all dequantized


def test_each_packed_linear_is_the_weight_gguf_dequantizes(quantized_pair):
    """The identity through each packed Linear gives back its weight's columns: the rows in the order the folder
    has them (Pixtral's q/k unpermuted, Qwen2-VL's q, k, v joined), each value within bfloat16 rounding."""
    packed, reference, _ = quantized_pair
    ref_linears = tower_linears(reference)
    for name, module in tower_linears(packed).items():
        if not module.is_quantized:
            continue
        ref = ref_linears[name]
        eye = torch.eye(module.in_features)
        ours = module(eye.to(torch.bfloat16)).float()  # [K, N]: row i is W[:, i] + b
        expected = ref(eye)
        torch.testing.assert_close(ours, expected, rtol=1 / 64, atol=expected.abs().max().item() / 128, msg=name)


@pytest.mark.parametrize("size", [(61, 40), (250, 130)])
def test_image_rows_match_the_dequantized_reference(quantized_pair, size):
    packed, reference, _ = quantized_pair
    img = picture(size, seed=1)
    ours = packed.vision.get_image_embeddings(image=img)
    ref = reference.vision.get_image_embeddings(image=img)
    assert ours.num_tokens == ref.num_tokens == packed.vision.count_image_tokens(img)
    error = (ours.embeddings.float() - ref.embeddings).norm() / ref.embeddings.norm()
    # bfloat16 activations, 8-bit ones where the block kernels quantize x: about 1 % here
    assert error < 0.03
    other = reference.vision.get_image_embeddings(image=picture(size, seed=2)).embeddings
    assert (other - ref.embeddings).norm() / ref.embeddings.norm() > 10 * error  # the check tells pictures apart


def _packable(folder: Path):
    import gguf

    path = next(folder.glob("mmproj-*.gguf"))
    tensors = GGUFFile.open(path).tensors
    return read_packable(tensors, torch.bfloat16, CPU), {t.name: t for t in tensors}, gguf


def test_a_weight_the_family_transposes_is_dequantized_and_the_others_stay_packed(quantized_pair):
    _, _, folder = quantized_pair
    packable, tensors, gguf = _packable(folder)
    first, *others = sorted(packable)

    def translate(raw):  # renames all, and also stores `first` transposed (as a projector matrix might be)
        return {"width": raw[first].shape[1]}, {**{f"ckpt.{n}": raw[n] for n in raw}, "ckpt.t": raw[first].t()}, None

    extra, out, _ = translate_packed(translate, {}, packable, gguf)
    assert extra == {"width": packable[first].weight.shape[1]}
    expected = dequantize(tensors[first], gguf).to(torch.bfloat16)
    torch.testing.assert_close(out["ckpt.t"], expected.t(), rtol=0, atol=0)
    torch.testing.assert_close(out[f"ckpt.{first}"], expected, rtol=0, atol=0)
    for n in others:
        assert type(out[f"ckpt.{n}"]) is type(packable[n].weight), n


def test_a_family_that_cannot_run_on_stand_ins_gets_every_weight_as_floats(quantized_pair):
    _, _, folder = quantized_pair
    packable, tensors, gguf = _packable(folder)

    def translate(raw):  # reads values: float-only arithmetic on the row numbers fails
        scale = torch.linalg.vector_norm(next(iter(raw.values())))
        return {}, {n: v for n, v in raw.items()}, scale

    _, out, scale = translate_packed(translate, {}, packable, gguf)
    for n in packable:
        torch.testing.assert_close(out[n], dequantize(tensors[n], gguf).to(torch.bfloat16), rtol=0, atol=0)
    assert scale.dtype == torch.bfloat16
