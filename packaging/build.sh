#!/usr/bin/env bash
# Build Tandem's one-folder desktop bundle: dist/tandem/ (and dist/Tandem.app on macOS).
#
#   packaging/build.sh            # uses $VIRTUAL_ENV, else ./.venv, else creates ./.venv
#   PYTHON=/path/to/python packaging/build.sh
#
# Installs the app with its `package` extra (PyInstaller) when PyInstaller or the app is missing from that
# environment, runs PyInstaller with packaging/tandem.spec and prints the bundle's size. torch goes in as
# installed: install the CUDA build of torch first for a GPU bundle.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

if [[ -n "${PYTHON:-}" ]]; then
    PY="$PYTHON"
elif [[ -n "${VIRTUAL_ENV:-}" ]]; then
    PY="$VIRTUAL_ENV/bin/python"
elif [[ -x .venv/bin/python ]]; then
    PY=.venv/bin/python
else
    echo "creating a virtual environment in .venv" >&2
    python3 -m venv .venv
    PY=.venv/bin/python
fi

if ! "$PY" -c "import PyInstaller, app.main" >/dev/null 2>&1; then
    echo "installing Tandem with its package extra into $("$PY" -c 'import sys; print(sys.prefix)')" >&2
    "$PY" -m pip install -e ".[package]"
fi

# The icons are committed; this only fails the build when someone changed the SVG without rendering.
"$PY" tools/render_icons.py --check

start=$(date +%s)
"$PY" -m PyInstaller --noconfirm --distpath dist --workpath build/pyinstaller packaging/tandem.spec
echo "built dist/tandem in $(( $(date +%s) - start )) s"
du -sh dist/tandem
if [[ -d dist/Tandem.app ]]; then
    du -sh dist/Tandem.app
fi
