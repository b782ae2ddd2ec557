"""A message's documents, under its text: the chips of those a user message carries, and under an answer the
passages it was given, in a collapsible section.

    📄 report.pdf · 12 pages, 3.4k tokens · whole        (a user message)
    ▸ Sources: report.pdf p. 3, p. 5 · notes.md          (an answer; open: each passage's beginning)

Both come from the message's stats ("documents": app.documents.attach.keep_documents; "sources":
app.documents.prompt.PromptDocuments), saved with it, so they show the same after a restart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHBoxLayout, QLabel, QVBoxLayout, QWidget

from app.documents.attach import summary
from app.ui.collapsible_section import CollapsibleSection

MAX_TITLE_PLACES = 8  # places named in the closed title; the open section lists them all


def sources_title(sources: Sequence[Mapping[str, Any]]) -> str:
    """ "Sources: report.pdf p. 3, p. 5 · notes.md": the places, by document, in the order given."""
    places: dict[str, list[str]] = {}
    for source in sources:
        where = source.get("where", "")
        places.setdefault(str(source.get("document", "")), []).extend([] if where == "whole" else [str(where)])
    parts, named = [], 0
    for document, wheres in places.items():
        shown = wheres[: max(0, MAX_TITLE_PLACES - named)]
        named += len(shown)
        more = ", …" if len(shown) < len(wheres) else ""
        parts.append(f"{document} {', '.join(shown)}{more}" if wheres else document)
    return "Sources: " + " · ".join(parts)


def _sources_text(sources: Sequence[Mapping[str, Any]]) -> str:
    lines = []
    for source in sources:
        document, where = source.get("document", ""), source.get("where", "")
        place = f"{document} (whole document)" if where == "whole" else f"{document} {where}"
        lines.append(f"{place}: {source['text']}" if source.get("text") else place)
    return "\n\n".join(lines)


class DocumentsBlock(QWidget):
    """A message's document chips or its answer's sources, as its stats say; hidden when there are none. Its
    widgets are built when a message first has either (most have neither: a message's widget stays cheap)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setObjectName("messageDocuments")
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 0)
        self._layout.setSpacing(2)
        self.chips: QHBoxLayout | None = None
        self.sources: CollapsibleSection | None = None
        self.sources_text: QLabel | None = None
        self._shown: tuple[Any, Any] = ([], [])
        self.setVisible(False)

    def _build(self) -> None:
        self.chips = QHBoxLayout()
        self.chips.addStretch()
        self._layout.addLayout(self.chips)
        self.sources_text = QLabel()
        self.sources_text.setObjectName("sourcesText")
        self.sources_text.setWordWrap(True)
        self.sources_text.setTextFormat(Qt.TextFormat.PlainText)
        self.sources_text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.sources = CollapsibleSection("Sources", self.sources_text)
        self.sources.setObjectName("sources")
        self._layout.addWidget(self.sources)

    def chip_texts(self) -> list[str]:
        """What the chips say, in order."""
        if self.chips is None:
            return []
        items = (self.chips.itemAt(i).widget() for i in range(self.chips.count()))
        return [w.text() for w in items if isinstance(w, QLabel)]

    def set_stats(self, stats: Mapping[str, Any]) -> None:
        """Show the "documents" and "sources" of a message's stats (each a list; absent: none)."""
        documents, sources = stats.get("documents") or [], stats.get("sources") or []
        if (documents, sources) == self._shown:
            return  # an answer's stats are set again as it ends: the section stays open or closed as it was
        self._shown = (documents, sources)
        if self.chips is None:
            self._build()
        while self.chips.count() > 1:
            self.chips.takeAt(0).widget().deleteLater()
        for position, document in enumerate(documents):
            mode = "whole" if document.get("whole") else "searched by passage"
            chip = QLabel(f"📄 {document.get('name', '')} · {summary(document)} · {mode}")
            chip.setObjectName("documentChip")
            chip.setToolTip(
                "The whole document goes to the model with this message."
                if document.get("whole")
                else "Too long for the context: each question gets the passages of it that match best."
            )
            self.chips.insertWidget(position, chip)
        self.sources.set_title(sources_title(sources) if sources else "Sources")
        self.sources_text.setText(_sources_text(sources))
        self.sources.setVisible(bool(sources))
        self.setVisible(bool(documents or sources))
