"""Harmony (gpt-oss's chat format) for tests: a tiny byte-level BPE tokenizer whose harmony markers are special
tokens, a harmony chat template written for these tests, and a tiny Llama that writes one harmony reply.

Random weights never write harmony, so the model is made to: its one layer adds nothing (zero output
projections), its embeddings are orthonormal rows and its output rows are the embedding rows of each token's
predecessor, so greedy decoding follows a fixed successor of every token. After the prompt's last token
("assistant", of `<|start|>assistant`) it writes REPLY_TEXT and stops at <|return|>. A successor chain never
repeats a token, so the second message's header is one plain token of the vocabulary (HEADER_FINAL): its text
is the header's, which is all the parser sees. Loaded by path (tests are not a package):

    spec = importlib.util.spec_from_file_location("harmony_models", ROOT / "tests" / "harmony_models.py")
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers
from tokenizers import AddedToken, decoders, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

from engine.models import Model
from engine.tokenizer.tokenizer import Tokenizer

MARKERS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>", "<|constrain|>"]
HEADER_FINAL = "assistant<|channel|>final<|message|>"
THINKING = "The user wants colours."
ANSWER = "Red green blue"
REPLY_TEXT = f"<|channel|>analysis<|message|>{THINKING}<|end|><|start|>{HEADER_FINAL}{ANSWER}"

# Written for these tests from the format's rules: the system message states the reasoning effort, earlier
# assistant turns keep only their final message, and the prompt ends with `<|start|>assistant`.
HARMONY_TEMPLATE = (
    "{%- set effort = reasoning_effort if reasoning_effort is defined else 'medium' -%}"
    "<|start|>system<|message|>Reasoning: {{ effort }}\n\n# Channels: analysis, commentary, final.<|end|>"
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' -%}<|start|>developer<|message|>{{ m.content }}<|end|>"
    "{%- elif m.role == 'assistant' -%}<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>"
    "{%- else -%}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}"
)

# "high" is a word of its own in this vocabulary and "low" is not, so the two efforts' prompts differ in length.
_CORPUS = [f"assistant analysis final user system developer Reasoning high {THINKING} {ANSWER} Colours? Hi Hello!"] * 30


def build_harmony_tokenizer(folder: Path, template: str = HARMONY_TEMPLATE) -> Tokenizer:
    """The tokenizer (special harmony markers, HEADER_FINAL a plain added token) saved in `folder` with
    `template` as its chat template; <|endoftext|> is its eos, so only the harmony format stops at <|return|>."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>", *MARKERS],
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS, trainer)
    tok.add_tokens([AddedToken(HEADER_FINAL, special=False, normalized=False)])
    tok.save(str(folder / "tokenizer.json"))
    config = {"eos_token": "<|endoftext|>", "add_bos_token": False, "chat_template": template}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return Tokenizer.load(folder)


def reply_ids(tokenizer: Tokenizer) -> list[int]:
    """REPLY_TEXT's token ids, then <|return|>."""
    ids = tokenizer.encode(REPLY_TEXT, encode_special_tokens=True).flatten().tolist()
    return ids + [tokenizer.piece_to_id("<|return|>")]


def build_harmony_llama(folder: Path, template: str = HARMONY_TEMPLATE) -> Model:
    """save_harmony_llama's model, loaded in float32."""
    save_harmony_llama(folder, template)
    return Model.load(folder, dtype=torch.float32)


def save_harmony_llama(folder: Path, template: str = HARMONY_TEMPLATE) -> None:
    """Save the tokenizer above and a Llama that answers any prompt ending in `<|start|>assistant` with
    REPLY_TEXT and <|return|> under greedy decoding (see the module docstring) in `folder`."""
    tokenizer = build_harmony_tokenizer(folder, template)
    reply = reply_ids(tokenizer)
    prompt_end = tokenizer.encode("<|start|>assistant", encode_special_tokens=True).flatten().tolist()[-1]
    chain = [prompt_end, *reply]
    assert len(set(chain)) == len(chain), f"a token repeats in the reply, so it has two successors: {chain}"
    vocab = tokenizer.vocab_size
    hidden = 64 * -(-vocab // 64)  # room for one orthonormal row per token
    cfg = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tokenizer.piece_to_id("<|endoftext|>"),
    )
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    rows = torch.linalg.qr(torch.randn(hidden, hidden))[0][:vocab]  # [vocab, hidden], orthonormal
    with torch.no_grad():
        hf.model.embed_tokens.weight.copy_(rows)
        for layer in hf.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        head = torch.zeros(vocab, hidden)
        for before, after in zip(chain, chain[1:]):
            head[after] += rows[before]
        hf.lm_head.weight.copy_(head)
    hf.save_pretrained(folder)
