"""tools/bench_report.py on a JSON file the real bench wrote (the tiny model, ours beside transformers): the page
names the machine, the command, commit and date, and holds both sides' rows; one section per machine, the newest
run of a command wins.

Bad inputs tried: a file from an older bench (no machine block), a file that is not JSON.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from engine.bench import compare as bench
from engine.bench.machine import describe_machine

_SPEC = importlib.util.spec_from_file_location(
    "bench_report", Path(__file__).resolve().parents[2] / "tools" / "bench_report.py"
)
report = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = report
_SPEC.loader.exec_module(report)


@pytest.fixture(scope="module")
def bench_json(tiny_folder, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bench") / "tiny.json"
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(
        [str(tiny_folder), "--dtype", "float32", "--threads", "1", "--new-tokens", "4", "--jobs", "2",
         "--max-prompt-tokens", "32", "--history-tokens", "64", "--page-size", "16", "--only", "core",
         "--no-hf-batched", "--json", str(out)]
    )  # fmt: skip
    assert bench.run(args) == 0
    return out


def _row(page: str, label: str) -> list[str]:
    line = next(line for line in page.splitlines() if line.startswith(f"| {label}"))
    return [cell.strip() for cell in line.split("|")[1:-1]]


def test_the_page_names_the_machine_the_run_and_both_sides(bench_json, tmp_path):
    out = tmp_path / "benchmarks.md"
    assert report.main([str(bench_json), "--out", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    data = json.loads(bench_json.read_text())

    machine = describe_machine()
    assert f"## {machine['cpu']}" in page and f"{machine['cpus']} CPUs" in page
    if machine["cpu_family_model"]:
        assert machine["cpu_family_model"] in page
    assert f"CPU flags: {' '.join(machine['flags'])}" in page
    run = data["run"]
    assert run["command"].startswith("python -m engine bench ") and "--only core" in run["command"]
    assert f"`{run['command']}`" in page and run["date"] in page
    if run["commit"]:
        assert f"commit {run['commit'][:12]}" in page

    assert _row(page, "metric")[:3] == ["metric", "ours", "transformers"]
    decode = _row(page, "single-stream decode tok/s")
    assert float(decode[1].replace(",", "")) > 0 and float(decode[2].replace(",", "")) > 0
    assert "peak RSS of the whole process" in page and report.NO_FIGURES not in page


def test_llama_cpp_sits_beside_ours_and_machines_get_a_section_each(bench_json):
    first = report.read_bench(bench_json)
    with_llama = copy.deepcopy(first)
    for row in with_llama["rows"]:
        row["llama.cpp"] = "7.0"  # the column the bench adds where llama-cpp-python ran
    with_llama["run"]["date"] = "9999-01-01 00:00 UTC"  # the newer run of the same command
    other = copy.deepcopy(first)
    other["machine"] = {**first["machine"], "cpu": "Other CPU", "flags": ["avx2"]}
    page = report.render([first, with_llama, other])
    assert page.count("### ") == 2 and "## Other CPU" in page
    start = page.index(f"## {first['machine']['cpu']}")
    ours_section = page[start : page.index("## Other CPU", start) if page.index("## Other CPU") > start else None]
    assert _row(ours_section, "metric")[:4] == ["metric", "ours", "llama.cpp", "transformers"]
    assert "9999-01-01 00:00 UTC" in ours_section and first["run"]["date"] not in ours_section


def test_without_files_the_place_for_figures_is_marked(tmp_path):
    out = tmp_path / "benchmarks.md"
    assert report.main(["--out", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    assert page.startswith("# Benchmarks") and report.NO_FIGURES in page and "python -m engine bench" in page


def test_files_it_cannot_use_are_refused_by_name(bench_json, tmp_path, capsys):
    old = json.loads(bench_json.read_text())
    del old["machine"], old["run"]
    old_path = tmp_path / "old.json"
    old_path.write_text(json.dumps(old))
    out = tmp_path / "benchmarks.md"
    assert report.main([str(old_path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "old.json: has no run, machine block" in err and "older bench" in err and not out.exists()
    garbage = tmp_path / "table.txt"
    garbage.write_text("| metric | ours |")
    assert report.main([str(garbage), "--out", str(out)]) == 2
    assert "table.txt: not a bench JSON file" in capsys.readouterr().err
