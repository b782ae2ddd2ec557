"""Building and loading the C kernels (kernels/cpu/build.py): the cached library is reused, a compiler that
fails or is missing leaves the ops on the torch twins with one warning and no half-written file, and
TANDEM_NO_CPU_KERNELS turns the kernels off."""

from __future__ import annotations

import logging
import platform
import shutil

import pytest

from kernels.cpu import build


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """An empty kernel cache folder and no remembered libraries, restored afterwards."""
    monkeypatch.setenv("TANDEM_KERNEL_CACHE", str(tmp_path / "kernels"))
    monkeypatch.delenv("TANDEM_NO_CPU_KERNELS", raising=False)  # a run of the suite with the kernels off
    monkeypatch.delenv("TANDEM_CPU_KERNEL_ARCH", raising=False)
    build.load.cache_clear()
    build.function.cache_clear()
    yield tmp_path / "kernels"
    build.load.cache_clear()
    build.function.cache_clear()


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_builds_once_and_reuses_the_cached_library(fresh):
    # elementwise compiles in half a second; paged_decode's unrolled instances take 16 s on a 2-core AVX2 CPU
    assert build.load("elementwise") is not None
    (library,) = fresh.glob("elementwise-*.so")
    built_at = library.stat().st_mtime_ns
    build.load.cache_clear()
    assert build.load("elementwise") is not None
    assert list(fresh.glob("elementwise-*.so")) == [library] and library.stat().st_mtime_ns == built_at
    assert not list(fresh.glob("*.tmp"))


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_a_kernel_built_in_parts_is_one_library(fresh, monkeypatch):
    # for the portable target, which builds in seconds: its second part is empty (on AVX2, paged_decode's float32
    # and bfloat16 instances are the two parts, each reading the other's table; every attention test loads them)
    monkeypatch.setenv("TANDEM_CPU_KERNEL_ARCH", "x86-64")
    assert build.PARTS["paged_decode"] == 2
    library = build.load("paged_decode")
    assert library is not None and library.paged_decode_attention
    assert [p.suffix for p in fresh.iterdir()] == [".so"]  # the parts' objects are gone


def test_a_failing_compiler_falls_back_with_a_warning(fresh, monkeypatch, caplog):
    monkeypatch.setenv("CC", "false")  # exits 1 without writing anything
    with caplog.at_level(logging.WARNING, logger="kernels.cpu.build"):
        assert build.load("paged_decode") is None
    assert "using the torch twin" in caplog.text and "exited with 1" in caplog.text
    assert not list(fresh.glob("*"))


def test_a_missing_compiler_falls_back_quietly(fresh, monkeypatch, caplog):
    monkeypatch.setenv("CC", "no-such-compiler-here")
    assert build.load("paged_decode") is None and not caplog.text


@pytest.mark.skipif(shutil.which("cc") is None or platform.machine() != "x86_64", reason="needs cc on x86-64")
def test_another_target_architecture_gets_its_own_build(fresh, monkeypatch):
    # TANDEM_CPU_KERNEL_ARCH=x86-64-v3 builds the portable paths on an AVX-512 machine (how the other CPU paths
    # are checked, docs/development.md); a library built for one target is never loaded for another.
    assert build.load("elementwise") is not None
    build.load.cache_clear()
    monkeypatch.setenv("TANDEM_CPU_KERNEL_ARCH", "x86-64")
    assert build.load("elementwise") is not None
    assert len(list(fresh.glob("elementwise-*.so"))) == 2


def test_the_switch_turns_the_kernels_off(fresh, monkeypatch):
    monkeypatch.setenv("TANDEM_NO_CPU_KERNELS", "1")
    assert build.load("paged_decode") is None and not fresh.exists()


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_loading_a_model_on_the_cpu_prepares_every_kernel(fresh, tiny_folder, monkeypatch):
    # one test for both (build.prepare() is what the load calls): each builds every kernel from scratch, here
    # for the portable target, which compiles in seconds (paged_decode's AVX2 instances take 16 s on two cores)
    from engine import Model

    monkeypatch.setenv("TANDEM_CPU_KERNEL_ARCH", "x86-64")

    Model.load(tiny_folder)
    assert sorted(p.name.split("-")[0] for p in fresh.glob("*.so")) == sorted(build.KERNELS)


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_an_edited_header_gets_a_fresh_build(fresh, monkeypatch, tmp_path):
    sources = tmp_path / "sources"
    shutil.copytree(build._SOURCES, sources, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    monkeypatch.setattr(build, "_SOURCES", sources)
    assert build.load("elementwise") is not None
    with (sources / "bf16.h").open("a") as header:
        header.write("/* edited */\n")
    build.load.cache_clear()
    assert build.load("elementwise") is not None
    assert len(list(fresh.glob("elementwise-*.so"))) == 2
