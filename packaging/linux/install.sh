#!/usr/bin/env bash
# Install the built bundle for one user (or system-wide with PREFIX=/usr/local, as root):
#
#   packaging/linux/install.sh [PREFIX]      # PREFIX defaults to ~/.local
#
#   PREFIX/lib/tandem/                       the bundle (dist/tandem)
#   PREFIX/bin/tandem                        a link to its executable
#   PREFIX/share/applications/io.github.tandem.Tandem.desktop   (Exec points at PREFIX/bin/tandem)
#   PREFIX/share/metainfo/io.github.tandem.Tandem.metainfo.xml
#   PREFIX/share/icons/hicolor/{16x16..512x512,scalable}/apps/io.github.tandem.Tandem.{png,svg}
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PREFIX="${1:-$HOME/.local}"
APP_ID=io.github.tandem.Tandem

if [[ ! -x "$ROOT/dist/tandem/tandem" ]]; then
    echo "no bundle at $ROOT/dist/tandem: build it first with packaging/build.sh" >&2
    exit 1
fi

mkdir -p "$PREFIX/lib" "$PREFIX/bin"
rm -rf "$PREFIX/lib/tandem"
cp -a "$ROOT/dist/tandem" "$PREFIX/lib/tandem"
ln -sfn "$PREFIX/lib/tandem/tandem" "$PREFIX/bin/tandem"

# Absolute Exec/TryExec: ~/.local/bin is not on every desktop session's PATH.
mkdir -p "$PREFIX/share/applications"
sed -e "s|^Exec=tandem|Exec=$PREFIX/bin/tandem|" -e "s|^TryExec=tandem|TryExec=$PREFIX/bin/tandem|" \
    "$ROOT/packaging/linux/$APP_ID.desktop" > "$PREFIX/share/applications/$APP_ID.desktop"
install -Dm644 "$ROOT/packaging/linux/$APP_ID.metainfo.xml" "$PREFIX/share/metainfo/$APP_ID.metainfo.xml"
for size in 16 24 32 48 64 128 256 512; do
    install -Dm644 "$ROOT/assets/icons/tandem-$size.png" \
        "$PREFIX/share/icons/hicolor/${size}x${size}/apps/$APP_ID.png"
done
install -Dm644 "$ROOT/assets/icons/tandem.svg" "$PREFIX/share/icons/hicolor/scalable/apps/$APP_ID.svg"

# Refresh the desktop's caches where the tools exist (they are optional).
command -v update-desktop-database >/dev/null && update-desktop-database -q "$PREFIX/share/applications" || true
command -v gtk-update-icon-cache >/dev/null && gtk-update-icon-cache -q -t "$PREFIX/share/icons/hicolor" || true
echo "installed Tandem in $PREFIX (run: $PREFIX/bin/tandem)"
