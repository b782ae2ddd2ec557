"""Help -> About Tandem: the version, where models and chats are kept, the licence, and where the docs are."""

from __future__ import annotations

import html
import importlib.metadata
from pathlib import Path

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QTextDocument
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QVBoxLayout, QWidget

from app.resources import assets_dir

LICENCE = "Apache-2.0"  # pyproject.toml's; the bundled starter model is Apache-2.0 too


def app_version() -> str:
    """The installed package's version ("unknown" when run from a tree that was never installed)."""
    try:
        return importlib.metadata.version("tandem")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def docs_url() -> QUrl | None:
    """The README beside the packages (a checkout or an installed tree keeps it there); None in a bundle."""
    readme = assets_dir().parent / "README.md"
    return QUrl.fromLocalFile(str(readme)) if readme.is_file() else None


class AboutDialog(QDialog):
    """What Tandem is and where it keeps things; the folders are links that open them."""

    def __init__(self, models_folder: Path, data_folder: Path, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("About Tandem")
        rows = [
            ("Version", html.escape(app_version())),
            ("Models folder", _folder_link(models_folder)),
            ("Data folder", _folder_link(data_folder)),
            ("Licence", LICENCE),
        ]
        docs = docs_url()
        if docs is not None:
            rows.append(("Documentation", f'<a href="{docs.toString()}">README.md</a>'))
        table = "".join(f"<tr><td><b>{name}</b>&nbsp;&nbsp;</td><td>{value}</td></tr>" for name, value in rows)
        self.label = QLabel(
            "<h3>Tandem</h3><p>A desktop chat and vision app on its own PyTorch inference engine.</p>"
            f"<table>{table}</table>"
        )
        self.label.setTextFormat(Qt.TextFormat.RichText)
        self.label.setOpenExternalLinks(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextBrowserInteraction)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.label)
        layout.addWidget(buttons)

    def text(self) -> str:
        """The dialog's words, without markup (what a reader sees)."""
        document = QTextDocument()
        document.setHtml(self.label.text())
        return document.toPlainText()


def _folder_link(folder: Path) -> str:
    return f'<a href="{QUrl.fromLocalFile(str(folder)).toString()}">{html.escape(str(folder))}</a>'
