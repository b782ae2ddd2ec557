"""The model catalogue: describing models on disk, choosing Hub files, downloading (and failing to, offline).

Downloads run the real huggingface_hub client against a local HTTP server that speaks the Hub's file
protocol for one repo (the tiny model's folder); "offline" is a hub endpoint nobody listens on.
Bad inputs tried: a missing path, a folder without config.json, a .gguf of garbage, a .txt file, a repo id
without an owner, a repo with only .bin weights, a repo with several .gguf files and no file name, a file
name the repo does not have, HF_HUB_OFFLINE=1, an unreachable endpoint.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import http.server
import json
import threading
import time

import pytest
import torch

from app.service import EngineService, HubDownloadError, describe_model, download_from_hub
from app.service.catalog import choose_hub_files, model_display_name
from app.service.workers import LOADER, in_worker
from engine.errors import CorruptFileError, MissingFileError, ModelLoadError

REPO = "tandem-test/tiny"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
UNREACHABLE = "http://127.0.0.1:9"  # the discard port: connection refused at once


# --- describe --------------------------------------------------------------------------------------------


def test_describe_a_hugging_face_folder(tiny_folder):
    info = describe_model(tiny_folder)
    assert info["format"] == "huggingface" and info["architecture"] == "LlamaForCausalLM"
    assert info["supported"] is True and info["can_see_images"] is False
    assert info["context_length"] == 1024
    assert info["size_bytes"] == (tiny_folder / "model.safetensors").stat().st_size
    assert info["name"] == tiny_folder.name and info["path"] == str(tiny_folder)


def test_describe_the_starter_gguf(starter_gguf):
    info = describe_model(starter_gguf)
    assert info["format"] == "gguf" and info["architecture"] == "llama" and info["supported"] is True
    assert info["quantization"] == "Q4_1" and info["context_length"] == 8192
    assert info["size_bytes"] == starter_gguf.stat().st_size
    assert info["name"] == "SmolLM2-135M-Instruct.Q4_1"


def test_describe_rejects_what_is_not_a_model(tmp_path, tiny_folder):
    with pytest.raises(MissingFileError, match="gone.gguf"):
        describe_model(tmp_path / "gone.gguf")
    with pytest.raises(ModelLoadError, match="no config.json"):
        describe_model(tmp_path)
    corrupt = tmp_path / "junk.gguf"
    corrupt.write_bytes(b"GGUF" + bytes(100))
    with pytest.raises(CorruptFileError, match="junk.gguf"):
        describe_model(corrupt)
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(ModelLoadError, match="not a .gguf file"):
        describe_model(text)
    bad_config = tmp_path / "bad"
    bad_config.mkdir()
    (bad_config / "config.json").write_text("{not json")
    with pytest.raises(CorruptFileError, match="config.json"):
        describe_model(bad_config)


def test_the_starters_catalog_card_is_the_file_itself(starter_gguf, monkeypatch, tmp_path):
    from app.service.catalog import model_info, starter_info
    from engine.model_info import read_model_info

    assert starter_info() == dataclasses.replace(read_model_info(starter_gguf), path=starter_info().path)
    monkeypatch.setenv("TANDEM_DATA_DIR", str(tmp_path / "fresh"))  # a machine where it is not downloaded yet
    card = model_info(starter_info().path)
    assert not card.path.exists() and card.quantization == "Q4_1" and card.num_parameters == 134_515_008


def test_display_names(tmp_path):
    assert model_display_name(tmp_path / "Qwen3-0.6B") == "Qwen3-0.6B"
    assert model_display_name("/m/SmolLM2.Q4_1.gguf") == "SmolLM2.Q4_1"


# --- choosing files --------------------------------------------------------------------------------------------


def test_choose_files_of_a_model_folder():
    files = {
        "config.json": 1,
        "generation_config.json": 1,
        "model-00001-of-00002.safetensors": 9,
        "model-00002-of-00002.safetensors": 9,
        "model.safetensors.index.json": 1,
        "tokenizer.json": 2,
        "tokenizer.model": 2,
        "tokenizer_config.json": 1,
        "chat_template.jinja": 1,
        "pytorch_model.bin": 18,
        "onnx/model.onnx": 18,
        "original/consolidated.safetensors": 18,
        "README.md": 1,
        ".gitattributes": 1,
    }
    assert choose_hub_files(files, "o/m") == [
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
        "tokenizer.model",
        "tokenizer_config.json",
    ]


def test_choose_gguf_files():
    assert choose_hub_files({"README.md": 1, "m.Q4_K_M.gguf": 5}, "o/m") == ["m.Q4_K_M.gguf"]
    several = {"m.Q4_K_M.gguf": 5, "m.Q8_0.gguf": 9}
    with pytest.raises(HubDownloadError, match=r"2 GGUF files \(m.Q4_K_M.gguf, m.Q8_0.gguf\)"):
        choose_hub_files(several, "o/m")
    assert choose_hub_files(several, "o/m", filename="m.Q8_0.gguf") == ["m.Q8_0.gguf"]
    with pytest.raises(HubDownloadError, match="no file 'm.Q2.gguf'"):
        choose_hub_files(several, "o/m", filename="m.Q2.gguf")
    with pytest.raises(HubDownloadError, match="only other formats"):
        choose_hub_files({"config.json": 1, "pytorch_model.bin": 9}, "o/m")
    with pytest.raises(HubDownloadError, match="neither a model folder"):
        choose_hub_files({"README.md": 1}, "o/m")


# --- downloading ---------------------------------------------------------------------------------------------


@pytest.fixture
def hub(tiny_folder, monkeypatch):
    """A local server answering like the Hub for REPO, serving the tiny model's files; yields the request log."""
    requests: list[tuple[str, str]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            requests.append((self.command, self.path))

        def _file(self):
            prefix = f"/{REPO}/resolve/{COMMIT}/"
            path = tiny_folder / self.path[len(prefix) :]
            return path if self.path.startswith(prefix) and path.is_file() else None

        def _send(self, body: bytes, headers: dict, with_body: bool):
            self.send_response(200)
            for key, value in {"Content-Length": str(len(body)), **headers}.items():
                self.send_header(key, value)
            self.end_headers()
            if with_body:
                self.wfile.write(body)

        def _answer(self, with_body: bool):
            if self.path.startswith(f"/api/models/{REPO}"):
                siblings = [{"rfilename": p.name, "size": p.stat().st_size} for p in sorted(tiny_folder.iterdir())]
                body = json.dumps({"id": REPO, "sha": COMMIT, "siblings": siblings}).encode()
                return self._send(body, {"Content-Type": "application/json"}, with_body)
            path = self._file()
            if path is None:
                self.send_response(404)
                self.end_headers()
                return
            data = path.read_bytes()
            headers = {"ETag": f'"{hashlib.sha256(data).hexdigest()}"', "X-Repo-Commit": COMMIT}
            self._send(data, headers, with_body)

        def do_GET(self):
            self._answer(True)

        def do_HEAD(self):
            self._answer(False)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    yield requests
    server.shutdown()
    server.server_close()


def test_download_a_model_folder(hub, tiny_folder, tmp_path):
    progress = []
    target = download_from_hub(REPO, tmp_path, progress.append)
    assert target == tmp_path / "tandem-test--tiny"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (target / name).read_bytes() == (tiny_folder / name).read_bytes()
    assert progress[0] == 0.0 and progress[-1] == 1.0
    assert all(a <= b for a, b in zip(progress, progress[1:]))
    assert any(0.0 < p < 1.0 for p in progress)
    # Asked again, complete files are checked, not fetched again.
    hub.clear()
    assert download_from_hub(REPO, tmp_path) == target
    assert not any(cmd == "GET" and "/resolve/" in path for cmd, path in hub)


def test_download_unknown_repo_names_it(hub, tmp_path):
    with pytest.raises(HubDownloadError, match="tandem-test/nothing was not found on http://127.0.0.1"):
        download_from_hub("tandem-test/nothing", tmp_path)


@pytest.mark.timing
def test_offline_download_fails_fast_with_a_clear_message(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_ENDPOINT", UNREACHABLE)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    start = time.perf_counter()
    with pytest.raises(HubDownloadError) as info:
        download_from_hub("HuggingFaceTB/SmolLM2-135M-Instruct", tmp_path / "models", timeout=5)
    assert time.perf_counter() - start < 10
    message = str(info.value)
    assert "offline" in message and UNREACHABLE in message and "HuggingFaceTB/SmolLM2-135M-Instruct" in message
    assert not (tmp_path / "models").exists()  # nothing half-made


def test_hub_offline_mode_and_bad_repo_ids_fail_at_once(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_ENDPOINT", UNREACHABLE)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubDownloadError, match="HF_HUB_OFFLINE"):
        download_from_hub("owner/model", tmp_path)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    for repo_id in ("just-a-name", "a/b/c", "", "owner/has space"):
        with pytest.raises(HubDownloadError, match="not a Hub repo id"):
            download_from_hub(repo_id, tmp_path)


# --- download, then load: the one path (the model manager's) ------------------------------------------------


def run(loop, coro):
    return loop.run_until_complete(asyncio.wait_for(coro, 60))


def test_a_download_on_a_loader_thread_then_loads(loop, hub, tmp_path):
    service = EngineService(dtype=torch.float32)
    progress, threads = [], set()

    def report(fraction):
        progress.append(fraction)
        threads.add(threading.get_ident())

    folder = run(loop, in_worker(download_from_hub, REPO, tmp_path, report, pool=LOADER))
    assert folder == tmp_path / "tandem-test--tiny" and threading.get_ident() not in threads
    assert all(a <= b for a, b in zip(progress, progress[1:])) and progress[-1] == 1.0
    service.load_model(folder, "tiny")
    assert run(loop, service.wait_loaded())
    assert service.model_name == "tiny" and service.model_path == folder
    run(loop, service.close())


def test_a_download_offline_fails_fast_and_keeps_the_model(loop, tiny_folder, monkeypatch, tmp_path):
    service = EngineService(dtype=torch.float32)
    service.load_model(tiny_folder, "tiny")
    assert run(loop, service.wait_loaded())
    monkeypatch.setenv("HF_ENDPOINT", UNREACHABLE)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    start = time.perf_counter()
    with pytest.raises(HubDownloadError, match="offline"):
        run(loop, in_worker(download_from_hub, "HuggingFaceTB/SmolLM2-135M-Instruct", tmp_path, pool=LOADER))
    assert time.perf_counter() - start < 15
    assert service.model_name == "tiny"
    run(loop, service.close())
