"""Train Tandem's demo vision model on synthetic shapes, on CPU, and write it as a Hugging Face folder.

Development tool, not part of the app: it uses `transformers` (a test-only dependency of Tandem) to build
and train a small LLaVA-format model (SigLIP vision tower, two-layer projector, Llama text model) and a
sentencepiece tokenizer, then evaluates the saved folder with tools/demo_vision/evaluate.py.

    .venv/bin/python tools/demo_vision/train.py --out assets/demo-vision --minutes 35

Training data is generated on the fly from a seeded stream (tools/demo_vision/shapes.py); every image is
one multi-turn chat holding all of its questions, so each image is encoded once per step. Only the
assistant's tokens are scored. Training stops when the time budget is spent; the learning rate follows a
cosine over that budget, so a short run is a complete (if weaker) run.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import math
import random
import time
from pathlib import Path

import numpy as np
import sentencepiece as spm
import torch
import torch.nn.functional as F
from shapes import COLOURS, IMAGE_SIZE, MAX_OBJECTS, SHAPES, Scene, make_scene, object_map, question_answers, render
from transformers import LlamaConfig, LlavaConfig, LlavaForConditionalGeneration, SiglipVisionConfig

log = logging.getLogger("demo_vision.train")

IMAGE_TOKEN = "<image>"
ROLE_TOKENS = ("<|user|>", "<|assistant|>", "<|system|>")
PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<s>", "</s>"
VOCAB_SIZE = 512
IGNORE = -100

# Roles are single tokens and turns need no separators, which keeps every chat short. A message's
# content is a string or a list of parts; each image part becomes the "<image>" placeholder, which the
# runtime (transformers' processor or Tandem's engine) expands to the image's tokens.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('roles must be system, user or assistant, got ' + message['role']) }}"
    "{% endif %}"
    "<|{{ message['role'] }}|>"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def chat_text(turns: list[tuple[str, str]], with_image: bool = True) -> str:
    """A chat as the template renders it, without BOS/EOS (which are control tokens, not text)."""
    return "".join(
        f"<|user|>{IMAGE_TOKEN if with_image and k == 0 else ''}{q}<|assistant|>{a}" for k, (q, a) in enumerate(turns)
    )


def train_tokenizer(seed: int) -> bytes:
    """A small BPE sentencepiece model over the chats' text; bytes cover anything else a user types."""
    rng = random.Random(f"tokenizer-{seed}")
    lines = [chat_text(question_answers(scene, rng)) for scene in (make_scene(rng) for _ in range(3000))]
    lines.append("<|system|>You are a helpful assistant.")
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=model,
        model_type="bpe",
        vocab_size=VOCAB_SIZE,
        byte_fallback=True,
        user_defined_symbols=[IMAGE_TOKEN, *ROLE_TOKENS],
        # No dummy prefix and no normalisation: encoding a chat piece by piece then gives the same ids as
        # encoding it whole, and transformers' LlamaTokenizer (legacy=False) agrees with sentencepiece.
        add_dummy_prefix=False,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        split_digits=True,
        pad_id=0,
        unk_id=1,
        bos_id=2,
        eos_id=3,
        pad_piece=PAD,
        unk_piece=UNK,
        bos_piece=BOS,
        eos_piece=EOS,
        num_threads=1,
        minloglevel=2,
    )
    return model.getvalue()


def build_config(sp: spm.SentencePieceProcessor, args: argparse.Namespace) -> LlavaConfig:
    """The LLaVA config: SigLIP tower without pooling head, every patch of its last layer, Llama text model."""
    tokens_per_image = (IMAGE_SIZE // args.patch_size) ** 2
    vision = SiglipVisionConfig(
        hidden_size=args.vision_dim,
        intermediate_size=args.vision_dim * 4,
        num_hidden_layers=args.vision_layers,
        num_attention_heads=args.vision_dim // 32,
        image_size=IMAGE_SIZE,
        patch_size=args.patch_size,
        vision_use_head=False,
    )
    text = LlamaConfig(
        vocab_size=sp.get_piece_size(),
        hidden_size=args.text_dim,
        intermediate_size=args.text_dim * 3,
        num_hidden_layers=args.text_layers,
        num_attention_heads=args.text_dim // 32,
        num_key_value_heads=args.text_dim // 32,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True,
        bos_token_id=sp.bos_id(),
        eos_token_id=sp.eos_id(),
        pad_token_id=sp.pad_id(),
    )
    return LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=sp.piece_to_id(IMAGE_TOKEN),
        image_seq_length=tokens_per_image,
        projector_hidden_act="gelu",
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
        tie_word_embeddings=True,
    )


def pixels(images: list) -> torch.Tensor:
    """Images as the SigLIP processor gives them: [batch, 3, H, W], rescaled to [0, 1], then (x - 0.5) / 0.5."""
    array = np.stack([np.asarray(img) for img in images])  # [batch, H, W, 3] uint8
    return torch.from_numpy(array).permute(0, 3, 1, 2).float().div(255.0).sub(0.5).div(0.5).contiguous()


def patch_targets(scene: Scene, patch_size: int) -> torch.Tensor:
    """[num_patches, 3]: colour, shape and left-to-right rank (each 1-based) of the object covering most of
    each patch, or 0s where no object covers 15% of it. Row-major patch order, as SigLIP flattens its grid."""
    grid = scene.size // patch_size
    owners = object_map(scene)[: grid * patch_size, : grid * patch_size]
    patches = owners.reshape(grid, patch_size, grid, patch_size).transpose(0, 2, 1, 3).reshape(grid * grid, -1)
    coverage = np.stack([(patches == k).mean(axis=1) for k in range(1, len(scene.objects) + 1)], axis=1)
    colours, shapes = list(COLOURS), list(SHAPES)
    table = np.array(
        [[colours.index(o.colour) + 1, shapes.index(o.shape) + 1, i + 1] for i, o in enumerate(scene.objects)]
    )
    covered = coverage.max(axis=1) >= 0.15
    return torch.from_numpy(np.where(covered[:, None], table[coverage.argmax(axis=1)], 0))


class PatchHeads(torch.nn.Module):
    """Training-only linear probes on the vision tower's output patches (not saved with the model).

    A tower trained from scratch through the language loss alone learns slowly; asking every patch for
    the colour, shape and rank of the object under it gives the tower a dense signal from the first step.
    """

    def __init__(self, width: int):
        super().__init__()
        self.heads = torch.nn.ModuleList(
            torch.nn.Linear(width, n + 1) for n in (len(COLOURS), len(SHAPES), MAX_OBJECTS)
        )

    def loss(self, features: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """features [batch, patches, width], targets [batch, patches, 3] -> mean cross-entropy of the heads."""
        losses = [
            F.cross_entropy(head(features).float().flatten(0, 1), targets[..., k].flatten())
            for k, head in enumerate(self.heads)
        ]
        return sum(losses) / len(losses)


def sincos_positions(grid: int, width: int) -> torch.Tensor:
    """[grid * grid, width] 2-D sine/cosine position codes (x in the first half, y in the second).

    They initialise SigLIP's learned position embeddings: with random ones a tower trained from scratch
    takes long to learn which patches are neighbours, and shapes and left/right order both need that.
    """
    quarter = width // 4
    frequencies = 1.0 / (100.0 ** (torch.arange(quarter, dtype=torch.float32) / quarter))
    ys, xs = torch.meshgrid(
        torch.arange(grid, dtype=torch.float32), torch.arange(grid, dtype=torch.float32), indexing="ij"
    )
    codes = []
    for coordinate in (xs.flatten(), ys.flatten()):
        angles = coordinate[:, None] * frequencies  # [grid * grid, quarter]
        codes += [angles.sin(), angles.cos()]
    return torch.cat(codes, dim=1)


class ChatEncoder:
    """Turns a scene's question/answer turns into ids and labels (labels only on assistant tokens + EOS)."""

    def __init__(self, sp: spm.SentencePieceProcessor, tokens_per_image: int, patch_size: int):
        self.sp = sp
        self.patch_size = patch_size
        self.image_id = sp.piece_to_id(IMAGE_TOKEN)
        self.tokens_per_image = tokens_per_image

    def encode(self, turns: list[tuple[str, str]]) -> tuple[list[int], list[int]]:
        """Ids of the chat as the template renders it, the image placeholder expanded; and their labels."""
        ids, labels = [self.sp.bos_id()], [IGNORE]
        for k, (question, answer) in enumerate(turns):
            prompt = self.sp.encode(f"<|user|>{IMAGE_TOKEN if k == 0 else ''}{question}<|assistant|>")
            if k == 0:
                at = prompt.index(self.image_id)
                prompt[at : at + 1] = [self.image_id] * self.tokens_per_image
            reply = [*self.sp.encode(answer), self.sp.eos_id()]
            ids += prompt + reply
            labels += [IGNORE] * len(prompt) + reply
        return ids, labels

    def batch(self, scenes: list[Scene], rng: random.Random) -> dict[str, torch.Tensor]:
        """Model inputs (right-padded), labels, pixels and patch targets for one chat per scene."""
        rows = [self.encode(question_answers(scene, rng)) for scene in scenes]
        length = max(len(ids) for ids, _ in rows)
        input_ids = torch.full((len(rows), length), self.sp.pad_id(), dtype=torch.long)  # [batch, length]
        labels = torch.full((len(rows), length), IGNORE, dtype=torch.long)
        mask = torch.zeros((len(rows), length), dtype=torch.long)
        for i, (ids, labs) in enumerate(rows):
            input_ids[i, : len(ids)] = torch.tensor(ids)
            labels[i, : len(ids)] = torch.tensor(labs)
            mask[i, : len(ids)] = 1
        return {
            "input_ids": input_ids,
            "attention_mask": mask,
            "labels": labels,
            "pixel_values": pixels([render(scene) for scene in scenes]),
            "patch_targets": torch.stack([patch_targets(scene, self.patch_size) for scene in scenes]),
        }


class ThreadTuner:
    """Chooses 1 or `max_threads` torch threads by measured step time, re-measuring every `period` steps.

    On a small machine shared with other processes, two threads can be slower than one: every parallel
    region waits for whichever thread the OS has descheduled. Which is faster changes as the load does.
    """

    def __init__(self, max_threads: int, period: int = 100, probe: int = 4):
        self.choices = sorted({1, max_threads})
        self.period, self.probe = period, probe
        self.step, self.best = 0, self.choices[-1]
        self.samples: dict[int, list[float]] = {}

    def threads(self) -> int:
        """The thread count for the next step (probing each choice at the start of every period)."""
        at = self.step % self.period
        if len(self.choices) > 1 and at < self.probe * len(self.choices):
            return self.choices[at // self.probe]
        return self.best

    def record(self, threads: int, seconds: float) -> None:
        """Note how long the step run with `threads` took; after the last probe, keep the faster choice."""
        at = self.step % self.period
        self.step += 1
        if len(self.choices) == 1 or at >= self.probe * len(self.choices):
            return
        if at % self.probe:  # the first step after a switch pays for waking threads: not counted
            self.samples.setdefault(threads, []).append(seconds)
        if at == self.probe * len(self.choices) - 1:
            self.best = min(self.samples, key=lambda t: sorted(self.samples[t])[len(self.samples[t]) // 2])
            self.samples.clear()


def learning_rate(args: argparse.Namespace, progress: float) -> float:
    """Linear warm-up over the first 3% of the time budget, then a cosine down to 5% of the peak."""
    if progress < 0.03:
        return args.lr * progress / 0.03
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, (progress - 0.03) / 0.97)))
    return args.lr * (0.05 + 0.95 * cosine)


def train(model: LlavaForConditionalGeneration, encoder: ChatEncoder, args: argparse.Namespace) -> dict:
    """Train until `args.minutes` have passed; returns step count, seconds per step and the final losses."""
    heads = PatchHeads(model.config.vision_config.hidden_size)
    # The projector reads the last encoder layer's output (vision_feature_layer -1); the heads read it too.
    captured: list[torch.Tensor] = []
    last_layer = model.model.vision_tower.encoder.layers[-1]
    hook = last_layer.register_forward_hook(lambda _module, _inputs, output: captured.append(output))
    params = [*model.named_parameters(), *(("heads." + n, p) for n, p in heads.named_parameters())]
    optimizer = torch.optim.AdamW(
        [
            {"params": [p for n, p in params if p.dim() >= 2 and "embed" not in n], "weight_decay": 0.05},
            {"params": [p for n, p in params if p.dim() < 2 or "embed" in n], "weight_decay": 0.0},
        ],
        lr=args.lr,
        betas=(0.9, 0.98),
    )
    rng = random.Random(f"train-{args.seed}")
    budget = args.minutes * 60.0
    start = time.monotonic()
    step, vision_steps, smoothed = 0, 0, torch.zeros(2)
    model.train()
    tuner = ThreadTuner(args.threads)
    while (elapsed := time.monotonic() - start) < budget:
        threads = tuner.threads()
        torch.set_num_threads(threads)
        vision_only = elapsed < args.vision_warmup * budget
        lr = learning_rate(args, elapsed / budget)
        if not vision_only:
            # The language model starts from scratch here: warm up again over 3% of the budget.
            lr *= min(1.0, (elapsed / budget - args.vision_warmup) / 0.03)
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch_size = args.vision_batch_size if vision_only else args.batch_size
        batch = encoder.batch([make_scene(rng) for _ in range(batch_size)], rng)
        labels, targets = batch.pop("labels"), batch.pop("patch_targets")
        captured.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            if vision_only:
                # Warm-up: only the tower and its probes, several times cheaper per image than the whole model.
                model.model.vision_tower(batch["pixel_values"])
            else:
                logits = model(**batch).logits  # [batch, length, vocab]
            patch_loss = heads.loss(captured[-1], targets)
        if vision_only:
            text_loss = torch.zeros(())
        else:
            # Position t predicts token t + 1; the loss is taken in fp32.
            text_loss = F.cross_entropy(
                logits[:, :-1].float().reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=IGNORE
            )
        optimizer.zero_grad(set_to_none=True)
        (text_loss + args.patch_loss * patch_loss).backward()
        torch.nn.utils.clip_grad_norm_([p for _, p in params], 1.0)
        optimizer.step()
        step += 1
        vision_steps += vision_only
        tuner.record(threads, time.monotonic() - start - elapsed)
        losses = torch.stack([text_loss.detach(), patch_loss.detach()])
        smoothed = losses if step == 1 else 0.95 * smoothed + 0.05 * losses
        if step % args.log_every == 0:
            log.info(
                "step %d  %.0fs  lr %.2e  text loss %.4f  patch loss %.4f  (%.2f s/step, %d threads)",
                *(step, elapsed, lr, smoothed[0], smoothed[1], elapsed / step, tuner.best),
            )
    seconds = time.monotonic() - start
    hook.remove()
    model.eval()
    return {
        "steps": step,
        "vision_steps": vision_steps,
        "seconds": seconds,
        "seconds_per_step": seconds / max(step, 1),
        "final_loss": float(smoothed[0]),
        "final_patch_loss": float(smoothed[1]),
    }


def write_folder(
    out: Path, model: LlavaForConditionalGeneration, sp_model: bytes, sp: spm.SentencePieceProcessor
) -> None:
    """Save weights, config and every tokenizer/processor file transformers and Tandem's engine read."""
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    (out / "tokenizer.model").write_bytes(sp_model)
    added = {
        str(sp.piece_to_id(piece)): {
            "content": piece,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "single_word": False,
            "special": True,
        }
        for piece in (PAD, UNK, BOS, EOS, IMAGE_TOKEN, *ROLE_TOKENS)
    }
    tokenizer_config = {
        "tokenizer_class": "LlamaTokenizer",
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": UNK,
        "pad_token": PAD,
        "image_token": IMAGE_TOKEN,
        "add_bos_token": False,  # the chat template writes BOS itself
        "add_eos_token": False,
        "add_prefix_space": False,
        "legacy": False,
        "model_max_length": 512,
        "added_tokens_decoder": added,
        "chat_template": CHAT_TEMPLATE,
    }
    _write_json(out / "tokenizer_config.json", tokenizer_config)
    _write_json(
        out / "special_tokens_map.json",
        {"bos_token": BOS, "eos_token": EOS, "unk_token": UNK, "pad_token": PAD, "image_token": IMAGE_TOKEN},
    )
    _write_json(
        out / "preprocessor_config.json",
        {
            "image_processor_type": "SiglipImageProcessor",
            "processor_class": "LlavaProcessor",
            "do_convert_rgb": True,
            "do_resize": True,
            "size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
            "resample": 3,  # bicubic
            "do_rescale": True,
            "rescale_factor": 1 / 255,
            "do_normalize": True,
            "image_mean": [0.5, 0.5, 0.5],
            "image_std": [0.5, 0.5, 0.5],
        },
    )
    _write_json(
        out / "processor_config.json",
        {
            "processor_class": "LlavaProcessor",
            "patch_size": model.config.vision_config.patch_size,
            "vision_feature_select_strategy": "full",
            "image_token": IMAGE_TOKEN,
            "num_additional_image_tokens": 0,
        },
    )
    _write_json(
        out / "generation_config.json",
        {
            "bos_token_id": sp.bos_id(),
            "eos_token_id": sp.eos_id(),
            "pad_token_id": sp.pad_id(),
            "do_sample": False,
            "max_new_tokens": 32,
        },
    )


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def readme(config: LlavaConfig, stats: dict, results: dict | None, args: argparse.Namespace) -> str:
    """The model card: what the model is, how it was made, and how well it does."""
    vision, text = config.vision_config, config.text_config
    if results is None:
        table = "Not evaluated (trained with `--eval-images 0`).\n"
    else:
        rows = [
            ("describe", "Describe this image.", "names every object's colour and shape (any order)"),
            ("colour", "What colour is the `<shape>`?", "the colour of a shape present exactly once"),
            ("count", "How many shapes are there?", "the number word"),
        ]
        table = "| task | question | correct when | accuracy |\n|---|---|---|---|\n"
        for name, question, rule in rows:
            r = results[name]
            table += f"| {name} | {question} | {rule} | {r['correct']}/{r['total']} = {100 * r['accuracy']:.1f}% |\n"
    facts = {
        "shapes": ", ".join(SHAPES),
        "colours": ", ".join(COLOURS),
        "v_layers": vision.num_hidden_layers,
        "v_width": vision.hidden_size,
        "size": vision.image_size,
        "patch": vision.patch_size,
        "tokens": config.image_seq_length,
        "t_layers": text.num_hidden_layers,
        "t_width": text.hidden_size,
        "params": stats["num_params"] / 1e6,
        "vocab": text.vocab_size,
        "image_id": config.image_token_index,
        "seed": args.seed,
        "minutes": stats["seconds"] / 60,
        "budget": args.minutes,
        "steps": stats["steps"],
        "vision_steps": stats["vision_steps"],
        "warmup": round(100 * args.vision_warmup),
        "v_batch": args.vision_batch_size,
        "batch": args.batch_size,
        "per_step": stats["seconds_per_step"],
        "lr": args.lr,
        "bf16": "on" if args.bf16 else "off",
        "threads": args.threads,
        "loss": stats["final_loss"],
        "images": results["images"] if results else 0,
        "table": table,
    }
    return README_TEMPLATE.format(**facts)


README_TEMPLATE = """# Tandem demo vision model

A tiny vision-language model that Tandem bundles so image chat works without a download. Tandem's own
script trained it from scratch, on CPU, on synthetic pictures of one to three coloured shapes on plain,
noisy, striped or gradient grey backgrounds. It answers three kinds of question about such pictures and
knows nothing else.

- Shapes: {shapes}.
- Colours: {colours}.

- Architecture: `LlavaForConditionalGeneration` (transformers format): a SigLIP vision tower ({v_layers}
  layers, width {v_width}, {size}x{size} images in {patch}-pixel patches = {tokens} image tokens, no pooling
  head; the projector reads the last layer's output for every patch), a two-layer GELU projector and a
  Llama text model ({t_layers} layers, width {t_width}, tied embeddings). {params:.2f}M parameters, float32.
- Tokenizer: sentencepiece BPE (`tokenizer.model`), {vocab} pieces with byte fallback; `<image>` (id
  {image_id}), `<|user|>`, `<|assistant|>` and `<|system|>` are single tokens.
- Prompt: the chat template in `tokenizer_config.json`; one question with an image renders as
  `<s><|user|><image>Describe this image.<|assistant|>` and the answer ends with `</s>`. The `<image>`
  placeholder stands for {tokens} image tokens (transformers' `LlavaProcessor` expands it; Tandem's engine
  puts the image's embedding rows there).
- Images: resized to {size}x{size} (bicubic), scaled to [0, 1], normalised with mean 0.5 and std 0.5
  (`preprocessor_config.json`).

## Training

`tools/demo_vision/train.py` (a development tool; it uses transformers, a test-only dependency of Tandem)
trained this model with seed {seed} for {minutes:.1f} minutes on CPU (up to {threads} threads), bf16 autocast {bf16}:
{steps} steps, {vision_steps} of them (the first {warmup}% of the time) training only the vision tower on
batches of {v_batch} images, the rest the whole model on batches of {batch} ({per_step:.2f} s/step on average).
Images are generated on the fly; each one is a single multi-turn chat holding all of its questions, and
only the assistant's tokens are scored. Training-only linear probes ask every output patch of the vision
tower for the colour, shape and left-to-right rank of the object under it (they are not part of the saved
model). AdamW, peak learning rate {lr:g}, cosine decay over the time budget. Final training loss
{loss:.4f}. Regenerate (the result varies a little with the machine's speed, since training stops on
time):

    .venv/bin/python tools/demo_vision/train.py --out assets/demo-vision --minutes {budget:g} --seed {seed}

## Results

Greedy decoding with transformers on {images} held-out generated images (a random stream training never
draws from), one question per chat:

{table}
## Licence

Apache-2.0, like Tandem: the weights and the tokenizer were made by the project's own script from
synthetic data only.
"""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder to write the model to")
    parser.add_argument("--minutes", type=float, default=35.0, help="training time budget (wall clock)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-images", type=int, default=500, help="held-out images to evaluate (0: skip)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--vision-batch-size", type=int, default=32, help="batch size of the vision warm-up")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--patch-size", type=int, default=16)
    parser.add_argument("--vision-dim", type=int, default=128)
    parser.add_argument("--vision-layers", type=int, default=4)
    parser.add_argument("--text-dim", type=int, default=192)
    parser.add_argument("--text-layers", type=int, default=3)
    parser.add_argument("--patch-loss", type=float, default=1.0, help="weight of the per-patch probe loss")
    parser.add_argument(
        "--vision-warmup", type=float, default=0.4, help="fraction of the budget training only the vision tower"
    )
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True, help="bf16 autocast")
    parser.add_argument("--threads", type=int, default=2, help="most torch threads (1 is tried too, see ThreadTuner)")
    parser.add_argument("--log-every", type=int, default=20)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    sp_model = train_tokenizer(args.seed)
    sp = spm.SentencePieceProcessor(model_proto=sp_model)
    config = build_config(sp, args)
    model = LlavaForConditionalGeneration(config)
    with torch.no_grad():
        positions = model.model.vision_tower.embeddings.position_embedding.weight
        positions.copy_(sincos_positions(IMAGE_SIZE // args.patch_size, positions.shape[1]))
    num_params = sum(p.numel() for p in model.parameters())
    log.info(
        "vocab %d, %.2fM parameters, %d image tokens", sp.get_piece_size(), num_params / 1e6, config.image_seq_length
    )
    stats = train(model, ChatEncoder(sp, config.image_seq_length, args.patch_size), args)
    stats.update(num_params=num_params, batch_size=args.batch_size, minutes=args.minutes, seed=args.seed)
    log.info(
        "trained %d steps in %.0fs (%.2f s/step), loss %.4f",
        stats["steps"],
        stats["seconds"],
        stats["seconds_per_step"],
        stats["final_loss"],
    )
    write_folder(args.out, model, sp_model, sp)
    results = None
    if args.eval_images:
        from evaluate import evaluate_folder

        results = evaluate_folder(args.out, args.eval_images)
    (args.out / "README.md").write_text(readme(config, stats, results, args))
    log.info("wrote %s", args.out)


if __name__ == "__main__":
    main()
