"""Greedy answers to one image prompt from Tandem and from llama.cpp's llama-server, on the same GGUF pair.

    python tools/compare_mmproj_llama_cpp.py TEXT.gguf MMPROJ.gguf [--server PATH] [--size 80x64] [--tokens 16]

Starts llama-server (built by ../shared/tools/build-llama-cpp.sh; `--server` or $LLAMA_SERVER, its libraries
found beside it) with `--mmproj` on a free local port, asks both for the greedy continuation of a ChatML prompt
holding a seeded noise picture, prints both token lists and exits 0 when they are equal, 1 when not. The picture's
sides should need no resizing by either side (multiples of the model's patch grid, within its pixel limits):
llama.cpp resizes with its own filters, so a resized picture may differ by rounding.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from engine.cache import Cache
from engine.generator.dynamic import DynamicGenerator
from engine.generator.job import DynamicJob
from engine.generator.sampler import SamplerSettings
from engine.models import Model

BEFORE, AFTER = "<|im_start|>user\n", "What is in the picture?<|im_end|>\n<|im_start|>assistant\n"


def picture(width: int, height: int) -> Image.Image:
    rng = np.random.default_rng(2)
    img = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
    ImageDraw.Draw(img).ellipse((width // 5, height // 6, width * 3 // 4, height * 4 // 5), fill="red")
    return img


def tandem_tokens(text: Path, mmproj: Path, img: Image.Image, num_tokens: int) -> list[int]:
    model = Model.load(text, dtype=torch.float32, mmproj=mmproj)
    if model.vision_error:
        raise SystemExit(f"Tandem did not pair the files: {model.vision_error}")
    emb = model.vision.get_image_embeddings(image=img)
    image = getattr(emb, "prompt_text", emb.text_alias)  # with the model's own wrapping, as llama.cpp adds it
    ids = model.tokenizer.encode(BEFORE + image + AFTER, encode_special_tokens=True, embeddings=[emb])
    job = DynamicJob(ids, num_tokens, gen_settings=SamplerSettings.greedy(), identifier=0, embeddings=[emb])
    gen = DynamicGenerator(model, Cache(model, max_seq_len=2048, page_size=16), model.tokenizer)
    gen.enqueue(job)
    out: list[int] = []
    while gen.num_remaining_jobs():
        out += [t for r in gen.iterate() if "token_ids" in r for t in r["token_ids"][0].tolist()]
    return out


def _get(url: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.load(response)


def llama_cpp_tokens(server: Path, text: Path, mmproj: Path, img: Image.Image, num_tokens: int) -> list[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "LD_LIBRARY_PATH": str(server.parent)}
    args = [str(server), "-m", str(text), "--mmproj", str(mmproj), "--port", str(port), "-c", "2048", "-t", "1"]
    proc = subprocess.Popen(args + ["--no-warmup"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(120):
            if proc.poll() is not None:
                raise SystemExit(f"llama-server exited: {proc.stderr.read().decode()[-1500:]}")
            try:
                if _get(f"{url}/health").get("status") == "ok":
                    break
            except OSError:
                time.sleep(0.5)
        # The server names its media marker per run; the image goes where it stands.
        marker = _get(f"{url}/props")["media_marker"]
        buffer = io.BytesIO()
        img.save(buffer, format="PNG")
        prompt = {
            "prompt_string": BEFORE + marker + AFTER,
            "multimodal_data": [base64.b64encode(buffer.getvalue()).decode()],
        }
        body = {"prompt": prompt, "n_predict": num_tokens, "samplers": ["top_k"], "top_k": 1, "return_tokens": True}
        return _get(f"{url}/completion", {**body, "cache_prompt": False})["tokens"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("text", type=Path)
    parser.add_argument("mmproj", type=Path)
    parser.add_argument("--server", type=Path, default=os.environ.get("LLAMA_SERVER"))
    parser.add_argument("--size", default="80x64", help="the picture's WIDTHxHEIGHT")
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args()
    if args.server is None or not args.server.is_file():
        raise SystemExit("pass --server PATH/llama-server (or set $LLAMA_SERVER); build-llama-cpp.sh builds it")
    width, height = (int(v) for v in args.size.lower().split("x"))
    img = picture(width, height)
    ours = tandem_tokens(args.text, args.mmproj, img, args.tokens)
    theirs = llama_cpp_tokens(args.server, args.text, args.mmproj, img, args.tokens)
    print(f"Tandem:    {ours}\nllama.cpp: {theirs}\n{'equal' if ours == theirs else 'DIFFERENT'}")
    return 0 if ours == theirs else 1


if __name__ == "__main__":
    sys.exit(main())
