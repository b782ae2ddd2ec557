"""Evaluate a saved demo vision model folder with transformers, on held-out synthetic images.

Development tool (transformers is a test-only dependency of Tandem). Three tasks, greedy decoding, one
question per chat, batched:

  describe  "Describe this image."           every object's colour and shape named (order-insensitive)
  colour    "What colour is the <shape>?"    asked about a shape present exactly once
  count     "How many shapes are there?"     the number word

    .venv/bin/python tools/demo_vision/evaluate.py assets/demo-vision --images 500
"""

from __future__ import annotations

import argparse
import logging
import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch
from shapes import (
    COUNT_QUESTION,
    DESCRIBE_QUESTION,
    NUMBER_WORDS,
    Scene,
    colour_question,
    make_scene,
    normalise_answer,
    parse_description,
    render,
    unique_shapes,
)
from transformers import AutoProcessor, LlavaForConditionalGeneration

log = logging.getLogger("demo_vision.evaluate")

# Training draws scenes from "train-<seed>"; this stream never meets it.
EVAL_STREAM = "eval-heldout"


def eval_scenes(count: int) -> list[Scene]:
    rng = random.Random(EVAL_STREAM)
    return [make_scene(rng) for _ in range(count)]


class Answerer:
    """Batched greedy answers from a saved folder, through transformers' own processor and generate()."""

    def __init__(self, folder: Path):
        self.processor = AutoProcessor.from_pretrained(folder)
        self.processor.tokenizer.padding_side = "left"  # batched generation continues every row at the end
        self.model = LlavaForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()

    def answer(self, scenes: list[Scene], questions: list[str], batch_size: int = 50) -> list[str]:
        answers: list[str] = []
        tokenizer = self.processor.tokenizer
        for start in range(0, len(scenes), batch_size):
            chunk = range(start, min(start + batch_size, len(scenes)))
            prompts = [
                tokenizer.apply_chat_template(
                    [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": questions[i]}]}],
                    add_generation_prompt=True,
                    tokenize=False,
                )
                for i in chunk
            ]
            inputs = self.processor(
                images=[render(scenes[i]) for i in chunk],
                text=prompts,
                padding=True,
                return_tensors="pt",
                add_special_tokens=False,  # the template already wrote BOS
            )
            with torch.inference_mode():
                out = self.model.generate(**inputs, max_new_tokens=32, do_sample=False)
            new = out[:, inputs["input_ids"].shape[1] :]
            answers += tokenizer.batch_decode(new, skip_special_tokens=True)
        return answers


def evaluate_folder(folder: Path, num_images: int = 500, show_errors: int = 5) -> dict:
    """Accuracy of each task on `num_images` held-out images; logs a few wrong answers of each task."""
    start = time.monotonic()
    answerer = Answerer(folder)
    scenes = eval_scenes(num_images)
    # Each task: (scene, question, is the answer right?) for every image it applies to.
    tasks: dict[str, list[tuple[Scene, str, Callable[[str], bool]]]] = {"describe": [], "colour": [], "count": []}
    pick = random.Random(EVAL_STREAM + "-questions")
    for scene in scenes:
        named = Counter((o.colour, o.shape) for o in scene.objects)
        tasks["describe"].append((scene, DESCRIBE_QUESTION, lambda out, named=named: parse_description(out) == named))
        if unique := unique_shapes(scene):
            shape = pick.choice(unique)
            colour = next(o.colour for o in scene.objects if o.shape == shape)
            tasks["colour"].append(
                (scene, colour_question(shape), lambda out, colour=colour: normalise_answer(out) == colour)
            )
        number = NUMBER_WORDS[len(scene.objects)]
        tasks["count"].append((scene, COUNT_QUESTION, lambda out, number=number: normalise_answer(out) == number))

    results: dict = {"images": num_images}
    for name, items in tasks.items():
        task_scenes, questions, checks = zip(*items)
        outputs = answerer.answer(list(task_scenes), list(questions))
        right = [check(out) for check, out in zip(checks, outputs)]
        results[name] = {"correct": sum(right), "total": len(right), "accuracy": sum(right) / max(len(right), 1)}
        wrong = [(q, out, s) for q, out, s, ok in zip(questions, outputs, task_scenes, right) if not ok]
        for q, out, s in wrong[:show_errors]:
            truth = ", ".join(f"{o.colour} {o.shape}" for o in s.objects)
            log.info("  wrong %s: %r -> %r (truth: %s)", name, q, out, truth)
        log.info("%s: %d/%d = %.1f%%", name, sum(right), len(right), 100 * results[name]["accuracy"])
    results["seconds"] = time.monotonic() - start
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description="Evaluate a demo vision model folder on held-out shapes.")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--images", type=int, default=500)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(args.threads)
    results = evaluate_folder(args.folder, args.images)
    for name in ("describe", "colour", "count"):
        r = results[name]
        print(f"{name:9s} {r['correct']:4d}/{r['total']:<4d} {100 * r['accuracy']:.1f}%")
    print(f"({results['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
