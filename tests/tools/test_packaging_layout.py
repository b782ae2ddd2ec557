"""packaging/ holds the build recipe only, and its Linux desktop files are well-formed.

Bad inputs tried: an `__init__.py` dropped into packaging/ (or a sub-folder), a .desktop file missing a
required key or with a wrong app id, a metainfo file whose release is not the project's version; the
desktop-file-validate and appstreamcli validators run when installed.
"""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from app.main import APP_ID

REPO = Path(__file__).resolve().parents[2]
PACKAGING = REPO / "packaging"
DESKTOP = PACKAGING / "linux" / f"{APP_ID}.desktop"
METAINFO = PACKAGING / "linux" / f"{APP_ID}.metainfo.xml"
# Main categories of the freedesktop menu spec: a .desktop file should name at least one.
MAIN_CATEGORIES = {
    "AudioVideo", "Audio", "Video", "Development", "Education", "Game", "Graphics", "Network", "Office",
    "Science", "Settings", "System", "Utility",
}  # fmt: skip


def python_packages_in(folder: Path) -> list[Path]:
    return sorted(folder.rglob("__init__.py"))


def desktop_problems(path: Path) -> list[str]:
    """What is wrong with a .desktop file for Tandem (empty when nothing is)."""
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # keys are case-sensitive
    parser.read(path, encoding="utf-8")
    if not parser.has_section("Desktop Entry"):
        return ["no [Desktop Entry] group"]
    entry = parser["Desktop Entry"]
    problems = [f"missing {key}" for key in ("Type", "Name", "Exec", "Icon", "Categories") if not entry.get(key)]
    if problems:
        return problems
    if entry["Type"] != "Application":
        problems.append(f"Type is {entry['Type']!r}, not 'Application'")
    if entry["Exec"].split()[0] != "tandem":
        problems.append(f"Exec {entry['Exec']!r} does not run tandem")
    if entry["Icon"] != APP_ID:
        problems.append(f"Icon {entry['Icon']!r} is not the app id {APP_ID}")
    if path.name != f"{APP_ID}.desktop":
        problems.append(f"the file is named {path.name}, not after the app id")
    categories = entry["Categories"]
    if not categories.endswith(";") or not MAIN_CATEGORIES & set(categories.split(";")):
        problems.append(f"Categories {categories!r} is not a ;-terminated list with a main category")
    return problems


def project_version() -> str:
    return re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.MULTILINE).group(1)


def metainfo_problems(path: Path) -> list[str]:
    root = ET.parse(path).getroot()  # raises ParseError for malformed XML

    def text(tag: str) -> str:
        element = root.find(tag)
        return (element.text or "").strip() if element is not None else ""

    problems = []
    if root.tag != "component" or root.get("type") != "desktop-application":
        problems.append("the root is not <component type='desktop-application'>")
    if text("id") != APP_ID:
        problems.append(f"id {text('id')!r} is not {APP_ID}")
    for tag in ("name", "summary", "metadata_license"):
        if not text(tag):
            problems.append(f"no <{tag}>")
    if text("project_license") != "Apache-2.0":
        problems.append(f"project_license {text('project_license')!r} is not Apache-2.0")
    if root.find("description/p") is None:
        problems.append("no <description> paragraph")
    launchable = root.find("launchable")
    if launchable is None or launchable.get("type") != "desktop-id" or launchable.text != DESKTOP.name:
        problems.append(f"the launchable does not name {DESKTOP.name}")
    if root.find("content_rating") is None:
        problems.append("no <content_rating>")
    versions = [r.get("version") for r in root.findall("releases/release")]
    if project_version() not in versions:
        problems.append(f"no release {project_version()} (releases: {versions})")
    return problems


def test_packaging_holds_no_python_package():
    found = python_packages_in(PACKAGING)
    assert not found, f"packaging/ must not be a Python package (it would shadow PyPI's packaging): {found}"


def test_an_init_file_in_packaging_would_be_caught(tmp_path):
    shutil.copytree(PACKAGING, tmp_path / "packaging")
    (tmp_path / "packaging" / "linux" / "__init__.py").write_text("")
    assert python_packages_in(tmp_path / "packaging") == [tmp_path / "packaging" / "linux" / "__init__.py"]


def test_import_packaging_from_the_repo_root_is_the_pypi_library():
    out = subprocess.run(
        [sys.executable, "-c", "import packaging.version, sys; print(packaging.version.__file__)"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert "site-packages" in out and not out.startswith(str(PACKAGING))


def test_the_desktop_file_is_well_formed():
    assert desktop_problems(DESKTOP) == []


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (("Icon=io.github.tandem.Tandem\n", ""), "missing Icon"),
        (("Type=Application", "Type=Link"), "Type is 'Link'"),
        (("Icon=io.github.tandem.Tandem", "Icon=tandem"), "is not the app id"),
        (("Categories=Science;ArtificialIntelligence;", "Categories=Chat"), "main category"),
    ],
)
def test_a_broken_desktop_file_is_caught(tmp_path, change, problem):
    broken = tmp_path / DESKTOP.name
    broken.write_text(DESKTOP.read_text().replace(*change))
    assert any(problem in p for p in desktop_problems(broken))


def test_the_metainfo_file_is_well_formed():
    assert metainfo_problems(METAINFO) == []


def test_a_broken_metainfo_file_is_caught(tmp_path):
    broken = tmp_path / METAINFO.name
    broken.write_text(METAINFO.read_text().replace('version="0.1.0"', 'version="0.0.9"'))
    assert any("no release" in p for p in metainfo_problems(broken))
    broken.write_text(METAINFO.read_text().replace("</component>", ""))
    with pytest.raises(ET.ParseError):
        metainfo_problems(broken)


def test_desktop_file_validate_accepts_it():
    if shutil.which("desktop-file-validate") is None:
        pytest.skip("desktop-file-validate is not installed (desktop-file-utils)")
    result = subprocess.run(["desktop-file-validate", str(DESKTOP)], capture_output=True, text=True)
    assert result.returncode == 0 and "error" not in result.stdout, result.stdout


def test_appstreamcli_accepts_the_metainfo():
    if shutil.which("appstreamcli") is None:
        pytest.skip("appstreamcli is not installed (appstream)")
    result = subprocess.run(["appstreamcli", "validate", "--no-net", str(METAINFO)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_spec_and_scripts_name_files_that_exist():
    spec = (PACKAGING / "tandem.spec").read_text()
    compile(spec, "tandem.spec", "exec")  # Python syntax (PyInstaller executes it)
    for relative in ('"launcher.py"', '"tandem-256.png"', '"tandem-512.png"'):
        assert relative in spec
    assert (PACKAGING / "launcher.py").is_file()
    for script in ("build.sh", "check.sh", "linux/install.sh"):
        path = PACKAGING / script
        assert path.stat().st_mode & 0o111, f"{path} is not executable"
        subprocess.run(["bash", "-n", str(path)], check=True)  # shell syntax
