"""llama.cpp's `qwen3moe` GGUF against the Hugging Face folder it was converted from: a tiny random
Qwen3MoeForCausalLM, converted by llama.cpp 0.3.36's own convert_hf_to_gguf.py (f32 and q8_0), loaded by Tandem:
float32 logits and greedy tokens, the q8_0 experts kept in their blocks in bfloat16 with a decode step reading
only the routed experts' rows, a Q4_K_M mix of K-quant experts, the dynamic generator over concurrent jobs, and
files missing an expert key."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import transformers

from engine.cache import Cache
from engine.errors import CorruptFileError
from engine.generator.dynamic import DynamicGenerator
from engine.generator.job import DynamicJob
from engine.generator.sampler import SamplerSettings
from engine.model_info import read_model_info
from engine.models import Batch, Model, decode_plan
from engine.models.moe import SparseMoE
from kernels import ops

ROOT = Path(__file__).resolve().parents[3]

# llama.cpp's converter has no dense MLP tensors for qwen3moe (nor does its runtime): every layer is sparse, and
# its runtime renormalises the top-k weights, so the folder does too.
BASE = dict(
    hidden_size=64,  # whole Q8_0 blocks of 32 on every row
    intermediate_size=96,
    moe_intermediate_size=32,  # each expert whole groups of 16 rows: its blocks can stay in the CPU's tiles
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_experts=8,
    num_experts_per_tok=2,
    norm_topk_prob=True,
    max_position_embeddings=512,
    initializer_range=0.15,  # peaked logits, so greedy argmax is not decided by rounding noise
)


@pytest.fixture(scope="module")
def files(converter, known_tokenizer, tmp_path_factory) -> SimpleNamespace:
    """The folder (transformers' model and its files) and the f32 and q8_0 GGUF files converted from it."""
    folder = tmp_path_factory.mktemp("qwen3moe")
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(known_tokenizer), bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tok.save_pretrained(folder)
    ids = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    config = transformers.Qwen3MoeConfig(vocab_size=len(tok), **BASE, **ids)
    torch.manual_seed(5)
    hf = transformers.Qwen3MoeForCausalLM(config).eval()
    hf.save_pretrained(folder)
    for outtype in ("f32", "q8_0"):
        converter(folder, folder / f"{outtype}.gguf", mmproj=False, outtype=outtype)
    return SimpleNamespace(folder=folder, hf=hf, f32=folder / "f32.gguf", q8_0=folder / "q8_0.gguf")


def _q8_0_rounded(hf: torch.nn.Module) -> torch.nn.Module:
    """transformers' model with the weights the q8_0 file holds: what the converter quantizes (matrices, but
    for the F32 router), through gguf's own Q8_0 round trip."""
    import copy

    import gguf

    q8 = gguf.GGMLQuantizationType.Q8_0
    rounded = copy.deepcopy(hf)
    with torch.no_grad():
        for name, p in rounded.named_parameters():
            if p.dim() >= 2 and not name.endswith("mlp.gate.weight"):
                values = gguf.quants.dequantize(gguf.quants.quantize(p.numpy(), q8), q8)
                p.copy_(torch.from_numpy(values).reshape(p.shape))
    return rounded


def _prompt(n: int, seed: int, vocab: int) -> torch.Tensor:
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    cache = Cache(model, max_seq_len=64, page_size=16)
    batch = Batch.build(cache, [[3, 0, 2, 1]], [0], [len(ids)], logits="all")
    return model(ids, batch.positions(), batch).float()


def _greedy(model, prompt: torch.Tensor, steps: int) -> list[int]:
    cache = Cache(model, max_seq_len=64, page_size=16)
    past, inputs, out = 0, prompt, []
    for _ in range(steps):
        batch = Batch.build(cache, [[1, 3, 0, 2]], [past], [len(inputs)])
        inputs = model(inputs, batch.positions(), batch).argmax(-1)
        past = batch.seq_lens_host[0]
        out.append(int(inputs))
    return out


def _hf_greedy(hf, prompt: torch.Tensor, steps: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(prompt[None], max_new_tokens=steps, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt) :].tolist()


def test_the_f32_file_reads_as_the_folder(files):
    ours = Model.load(files.f32, dtype=torch.float32)
    assert all(isinstance(layer.mlp, SparseMoE) for layer in ours.model.layers)
    assert (ours.moe.num_experts, ours.moe.top_k, ours.moe.expert_size, ours.moe.norm_topk_prob) == (8, 2, 32, True)
    for seed, n in ((1, 13), (2, 30)):
        ids = _prompt(n, seed, ours.config.vocab_size)
        with torch.no_grad():
            ref = files.hf(ids[None]).logits[0]
        torch.testing.assert_close(_logits(ours, ids), ref, atol=1e-4, rtol=1e-4, msg=f"{n} tokens")
    prompt = _prompt(9, 3, ours.config.vocab_size)
    assert _greedy(ours, prompt, 16) == _hf_greedy(files.hf, prompt, 16)


def test_the_q8_0_file_holds_the_folders_weights_rounded_to_q8_0(files):
    """Read in float32 (every block expanded), the q8_0 file is transformers' model with gguf's Q8_0 rounding of
    the same weights: the experts' 3-D tensors map expert by expert, gate and up joined as the folder's."""
    ours = Model.load(files.q8_0, dtype=torch.float32)
    rounded = _q8_0_rounded(files.hf)
    ids = _prompt(21, 4, ours.config.vocab_size)
    with torch.no_grad():
        ref = rounded(ids[None]).logits[0]
    torch.testing.assert_close(_logits(ours, ids), ref, atol=1e-4, rtol=1e-4)
    prompt = _prompt(9, 3, ours.config.vocab_size)
    assert _greedy(ours, prompt, 16) == _hf_greedy(rounded, prompt, 16)


def test_q8_0_experts_stay_in_blocks_and_a_decode_step_reads_only_the_routed_ones(files, monkeypatch):
    packed = Model.load(files.q8_0, dtype=torch.bfloat16)
    expanded = Model.load(files.q8_0, dtype=torch.bfloat16, quantized=None)
    for layer in packed.model.layers:
        for experts in (layer.mlp.experts_gate_up, layer.mlp.experts_down):
            # gate and up joined expert by expert: one tensor of blocks, one kernel call per expert
            assert len(experts.block_types) == 1 and experts.block_types[0].startswith("Q8_0"), experts
            assert experts.weight is None
    ids = _prompt(19, 6, packed.config.vocab_size)
    ours, theirs = _logits(packed, ids), _logits(expanded, ids)
    # The block kernels round activations to 8 bits, and routing may pick another expert where two are close:
    # a tenth of the largest logit, and each row's choice the other's best within that.
    atol = 0.1 * theirs.abs().max().item()
    torch.testing.assert_close(ours, theirs, atol=atol, rtol=0)
    chosen = theirs.gather(-1, ours.argmax(-1, keepdim=True)).squeeze(-1)
    assert torch.all(chosen >= theirs.amax(-1) - atol)

    # One decode token: each layer's experts are multiplied on the routed experts' slices of blocks, and no other.
    routed: list[list[int]] = []
    for layer in packed.model.layers:
        route = layer.mlp.route

        def spy_route(x, route=route):
            weights, expert_ids = route(x)
            routed.append(sorted(expert_ids.flatten().tolist()))
            return weights, expert_ids

        monkeypatch.setattr(layer.mlp, "route", spy_route)
    read: list[int] = []
    linear_blocks = ops.linear_blocks

    def spy_linear_blocks(x, blocks, type_name, bias=None):
        read.append(blocks.data_ptr())
        return linear_blocks(x, blocks, type_name, bias)

    monkeypatch.setattr(ops, "linear_blocks", spy_linear_blocks)
    # the modules' step: a recorded one (decode_plan.py) runs the same slices in C (tests/kernels/cpu/test_moe_decode.py)
    monkeypatch.setattr(decode_plan, "covers", lambda batch, inputs: False)
    cache = Cache(packed, max_seq_len=64, page_size=16)
    batch = Batch.build(cache, [[0, 1]], [0], [len(ids)])
    packed(ids, batch.positions(), batch)
    routed.clear()
    read.clear()
    batch = Batch.build(cache, [[0, 1]], [len(ids)], [1])
    packed(ids[:1], batch.positions(), batch)
    for layer, expert_ids in zip(packed.model.layers, routed):
        assert len(expert_ids) == 2 and len(set(expert_ids)) == 2
        for experts in (layer.mlp.experts_gate_up, layer.mlp.experts_down):
            blocks = experts.blocks0
            slice_bytes = blocks.shape[0] // 8 * blocks.shape[1]
            starts = {blocks.data_ptr() + e * slice_bytes for e in range(8)}
            assert sorted(ptr for ptr in read if ptr in starts) == [
                blocks.data_ptr() + e * slice_bytes for e in expert_ids
            ]


def test_a_q4_k_m_files_experts_stay_in_their_k_quant_blocks(tmp_path, starter_gguf):
    """llama.cpp's Q4_K_M mix, as tools/make_bench_model.py writes it (random blocks): gate and up Q4_K, joined;
    down Q4_K, or Q6_K in the layers llama.cpp gives more bits. In bfloat16 they stay in their blocks and give
    what the float32 expansion of the same file gives, within the kernels' rounding."""
    spec = importlib.util.spec_from_file_location("make_bench_model", ROOT / "tools" / "make_bench_model.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # its dataclasses look their module up there
    spec.loader.exec_module(bench)
    shape = {"hidden": 256, "num_heads": 4, "num_kv_heads": 2, "head_dim": 64, "num_experts": 8, "experts_used": 2}
    shape |= {"expert_ffn": 256, "context_length": 2048}
    path = bench.write_bench_model(
        tmp_path / "moe.gguf", "Q4_K_M", 2, shape="qwen3moe", moe=shape, tokenizer_gguf=starter_gguf
    )
    packed = Model.load(path, dtype=torch.bfloat16)
    types = [
        (layer.mlp.experts_gate_up.block_types, layer.mlp.experts_down.block_types) for layer in packed.model.layers
    ]
    # the file's type names (a CPU runs them repacked: "Q4_Kx16")
    assert [([t[:4] for t in gate_up], [t[:4] for t in down]) for gate_up, down in types] == [
        (["Q4_K"], ["Q4_K"]),
        (["Q4_K"], ["Q6_K"]),  # use_more_bits: the last of 2 layers
    ]
    ids = _prompt(21, 9, packed.config.vocab_size)
    ours, theirs = _logits(packed, ids), _logits(Model.load(path, dtype=torch.float32), ids)
    atol = 0.1 * theirs.abs().max().item()
    torch.testing.assert_close(ours, theirs, atol=atol, rtol=0)
    chosen = theirs.gather(-1, ours.argmax(-1, keepdim=True)).squeeze(-1)
    assert torch.all(chosen >= theirs.amax(-1) - atol)


def test_the_generator_runs_concurrent_jobs_as_it_runs_each_alone(files):
    """Four jobs of different lengths, two joining later, over the q8_0 file's blocks in bfloat16: each job's
    greedy tokens are those it gets alone. The f32 file's jobs give transformers' tokens."""
    model = Model.load(files.q8_0, dtype=torch.bfloat16)
    prompts = [_prompt(n, 10 + n, model.config.vocab_size).tolist() for n in (4, 17, 9, 30)]
    together = _run(model, prompts, arrivals=[0, 0, 2, 3])
    for i, prompt in enumerate(prompts):
        assert together[i] == _run(model, [prompt])[0], f"job {i}"
    exact = _run(Model.load(files.f32, dtype=torch.float32), prompts, arrivals=[0, 1, 1, 0])
    for i, prompt in enumerate(prompts):
        assert exact[i] == _hf_greedy(files.hf, torch.tensor(prompt), 8), f"job {i}"


def _run(model, prompts: list[list[int]], arrivals: list[int] | None = None) -> list[list[int]]:
    """Each prompt's 8 greedy tokens from one generator, job i enqueued at iteration arrivals[i]."""
    cache = Cache(model, max_seq_len=16 * 16, page_size=16)
    generator = DynamicGenerator(model, cache, model.tokenizer)
    jobs = [
        DynamicJob(torch.tensor([p]), 8, stop_conditions=[], gen_settings=SamplerSettings.greedy(), identifier=i)
        for i, p in enumerate(prompts)
    ]
    arrivals = arrivals or [0] * len(jobs)
    tokens: dict[int, list[int]] = {i: [] for i in range(len(jobs))}
    step = 0
    while step <= max(arrivals) or generator.num_remaining_jobs():
        generator.enqueue([job for job, at in zip(jobs, arrivals) if at == step])
        for result in generator.iterate():
            if "token_ids" in result:
                tokens[result["identifier"]] += result["token_ids"].flatten().tolist()
        step += 1
        assert step < 500, "the generator did not finish"
    return [tokens[i] for i in range(len(jobs))]


def test_model_info_reads_the_file(files):
    info = read_model_info(files.q8_0)
    assert info.supported and info.engine_architecture == "Qwen3MoeForCausalLM" and info.architecture == "qwen3moe"
    assert (info.num_layers, info.num_kv_heads, info.head_dim) == (3, 2, 16)


@pytest.mark.parametrize("missing", ["expert_count", "expert_used_count", "expert_feed_forward_length"])
def test_a_file_without_an_expert_key_is_refused_naming_it(tmp_path: Path, missing):
    import gguf

    keys = {"expert_count": 8, "expert_used_count": 2, "expert_feed_forward_length": 32}
    writer = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), "qwen3moe")
    writer.add_block_count(1)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(96)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    for key, value in keys.items():
        if key != missing:
            writer.add_uint32(f"qwen3moe.{key}", value)
    writer.add_tensor("token_embd.weight", np.zeros((10, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(CorruptFileError, match=f"qwen3moe.{missing}"):
        Model.load(tmp_path / "bad.gguf", dtype=torch.float32)
