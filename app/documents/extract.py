"""Reading a document's text: .txt and .md as they are, .pdf page by page (pypdf), .docx paragraph by paragraph
(python-docx), each into Sections that say where their text came from ("p. 3", or the heading above it).

Every refusal is a `DocumentError` whose message names the file and says what to do: a file too big (refused by
its size before a byte is read), a PDF with no text layer (a scan), one locked with a password, a damaged PDF or
Word file, an extension Tandem does not read. Slow for a big PDF: the window calls it on a worker thread.
"""

from __future__ import annotations

import hashlib
import io
import logging
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

SUFFIXES = ("txt", "md", "pdf", "docx")
MAX_FILE_BYTES = 64 * 2**20
MAX_TEXT_CHARS = 8_000_000  # about two million tokens: more than any context, and still quick to cut and index
MAX_UNZIPPED_BYTES = 256 * 2**20  # a .docx is a zip: a small file may unpack to gigabytes
MAX_PAGES = 5000
KINDS_SAID = ".txt, .md, .pdf and .docx"


class DocumentError(ValueError):
    """A document that cannot be attached; the message names the file and says what to do."""


@dataclass(frozen=True)
class Section:
    """A run of a document's text and where it is: "p. 3" for a PDF page, else the heading above it ("" if none)."""

    where: str
    text: str


@dataclass(frozen=True)
class ExtractedText:
    """A document's text in reading order, with what was left out of it (`notes`, for the user)."""

    name: str
    kind: str  # the suffix: "txt", "md", "pdf", "docx"
    sha256: str
    sections: tuple[Section, ...]
    num_pages: int | None  # a PDF's pages; None for the others
    notes: tuple[str, ...] = ()

    @property
    def num_chars(self) -> int:
        return sum(len(s.text) for s in self.sections)


def document_kind(path: str | Path) -> str | None:
    """The kind of document a file name says ("pdf"), None for a name that is not one Tandem reads."""
    suffix = Path(path).suffix.lower().lstrip(".")
    return suffix if suffix in SUFFIXES else None


def unknown_kind_error(name: str) -> DocumentError:
    return DocumentError(
        f"{name} is not a file Tandem can attach: it reads documents ({KINDS_SAID}) and images "
        "(PNG, JPEG, WebP, GIF, BMP). Save it in one of those formats and attach that."
    )


def read_document(path: str | Path) -> ExtractedText:
    """Read a .txt, .md, .pdf or .docx file's text; `DocumentError` for anything that cannot be attached."""
    path = Path(path)
    kind = document_kind(path)
    if kind is None:
        raise unknown_kind_error(path.name)
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:  # refused by its size: the file is never read
            raise DocumentError(
                f"{path.name} is {size / 2**20:,.0f} MB; Tandem reads documents up to {MAX_FILE_BYTES // 2**20} MB. "
                "Split it, or save a smaller copy (a PDF without its pictures), and attach that."
            )
        data = path.read_bytes()
    except OSError as e:
        raise DocumentError(f"Cannot read {path}: {e.strerror or e}.") from e
    sections, num_pages, notes = _READERS[kind](data, path.name)
    sections = tuple(s for s in sections if s.text.strip())
    extracted = ExtractedText(path.name, kind, hashlib.sha256(data).hexdigest(), sections, num_pages, tuple(notes))
    if not sections:
        raise DocumentError(f"{path.name} has no text in it; there is nothing for the model to read.")
    if extracted.num_chars > MAX_TEXT_CHARS:
        raise DocumentError(
            f"{path.name} holds {extracted.num_chars / 1e6:.1f} million characters of text; Tandem reads documents "
            f"up to {MAX_TEXT_CHARS // 1_000_000} million. Split it into parts and attach the part you need."
        )
    return extracted


# --- plain text and Markdown ------------------------------------------------------------------------------------


def decode_text(data: bytes, name: str) -> str:
    """A text file's characters: UTF-8 (or UTF-16 with its byte-order mark), else Windows-1252, as editors guess."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        text = data.decode("utf-16", errors="replace")
    elif b"\0" in data[:65536]:
        raise DocumentError(
            f"{name} does not look like a text file (it holds binary data). Attach the document it came from, "
            f"or save it as plain text."
        )
    else:
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError:
            text = data.decode("cp1252", errors="replace")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _read_txt(data: bytes, name: str) -> tuple[list[Section], None, list[str]]:
    return [Section("", decode_text(data, name))], None, []


_HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.+?)\s*#*\s*$")
_FENCE = re.compile(r"^ {0,3}(```|~~~)")


def _read_md(data: bytes, name: str) -> tuple[list[Section], None, list[str]]:
    """Markdown cut at its headings (not at a # inside a fenced code block), so a passage can say its heading."""
    sections: list[Section] = []
    heading, lines, fenced = "", [], False
    for line in decode_text(data, name).split("\n"):
        if _FENCE.match(line):
            fenced = not fenced
        found = None if fenced else _HEADING.match(line)
        if found and any(s.strip() for s in lines):
            sections.append(Section(heading, "\n".join(lines)))
            lines = []
        if found:
            heading = found.group(1)
        lines.append(line)
    sections.append(Section(heading, "\n".join(lines)))
    return sections, None, []


# --- PDF --------------------------------------------------------------------------------------------------------


def _pages_said(pages: list[int], verb: str) -> str:
    """ "page 3 has", "pages 3, 7 have" (`verb`: "has" or "was")."""
    shown = ", ".join(str(p) for p in pages[:12]) + (", …" if len(pages) > 12 else "")
    if len(pages) == 1:
        return f"page {shown} {verb}"
    return f"pages {shown} {'have' if verb == 'has' else 'were'}"


def _read_pdf(data: bytes, name: str) -> tuple[list[Section], int, list[str]]:
    from pypdf import PdfReader
    from pypdf.errors import DependencyError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            # Many PDFs are "encrypted" only to forbid printing or copying, with an empty password: those open.
            try:
                opened = reader.decrypt("")
            except DependencyError as e:
                raise DocumentError(
                    f"{name} is encrypted in a way this installation cannot open ({e}). Save or print a copy "
                    "without encryption and attach that."
                ) from e
            if not opened:
                raise DocumentError(
                    f"{name} is locked with a password; Tandem cannot read it. Open it in a PDF viewer, save or "
                    "print a copy without the password, and attach that."
                )
        pages = list(reader.pages)
    except DocumentError:
        raise
    except Exception as e:  # pypdf raises many kinds for a damaged file; each means the same to the user
        raise DocumentError(
            f"{name} is not a readable PDF (it may be damaged or incomplete: {e}). Open it in a PDF viewer and save "
            "it again, then attach the copy."
        ) from e
    if len(pages) > MAX_PAGES:
        raise DocumentError(f"{name} has {len(pages):,} pages; Tandem reads PDFs up to {MAX_PAGES:,}. Split it.")
    sections, empty, broken = [], [], []
    for number, page in enumerate(pages, 1):
        try:
            text = page.extract_text() or ""
        except Exception as e:  # one damaged page: keep the others
            log.info("%s: page %d could not be read: %s", name, number, e)
            broken.append(number)
            continue
        if text.strip():
            sections.append(Section(f"p. {number}", text))
        else:
            empty.append(number)
    if not sections and empty:
        raise DocumentError(
            f"{name}: this PDF has no text layer; it looks scanned, and Tandem does not read images of text yet. "
            "Run it through text recognition (OCR) in a PDF tool, or attach the original document."
        )
    if not sections:
        raise DocumentError(f"{name}: no page of this PDF could be read; it may be damaged. Save it again and retry.")
    notes = []
    read = f"Tandem reads the other {len(sections)} of its {len(pages)} pages"
    if empty:
        notes.append(f"{name}: {_pages_said(empty, 'has')} no text layer (scanned images?); {read}.")
    if broken:
        notes.append(f"{name}: {_pages_said(broken, 'was')} not readable (damaged?); {read}.")
    return sections, len(pages), notes


# --- Word -------------------------------------------------------------------------------------------------------


def _damaged_docx(name: str, detail: object) -> DocumentError:
    return DocumentError(
        f"{name} is not a readable Word document ({detail}). It may be damaged, or an older .doc renamed: open it "
        "in Word or LibreOffice, save it again as .docx, and attach that."
    )


def _read_docx(data: bytes, name: str) -> tuple[list[Section], None, list[str]]:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, ValueError) as e:
        raise _damaged_docx(name, "not a zip archive") from e
    if "word/document.xml" not in {m.filename for m in members}:
        raise _damaged_docx(name, "no word/document.xml inside")
    unpacked = sum(m.file_size for m in members)
    if unpacked > MAX_UNZIPPED_BYTES:
        raise DocumentError(
            f"{name} unpacks to {unpacked / 2**20:,.0f} MB; Tandem reads Word documents up to "
            f"{MAX_UNZIPPED_BYTES // 2**20} MB unpacked. Save a copy without its pictures and attach that."
        )
    import docx
    from docx.table import Table

    try:
        document = docx.Document(io.BytesIO(data))
        sections: list[Section] = []
        heading, lines = "", []
        for block in document.iter_inner_content():
            if isinstance(block, Table):
                lines += [" | ".join(cell.text.strip() for cell in row.cells) for row in block.rows]
                continue
            style = block.style.name if block.style is not None else ""
            if (style.startswith("Heading") or style == "Title") and block.text.strip():
                if any(line.strip() for line in lines):
                    sections.append(Section(heading, "\n\n".join(lines)))
                    lines = []
                heading = block.text.strip()
            lines.append(block.text)
        sections.append(Section(heading, "\n\n".join(lines)))
    except DocumentError:
        raise
    except Exception as e:  # lxml's, python-docx's and zipfile's errors alike: the file is damaged
        raise _damaged_docx(name, e) from e
    return sections, None, []


_READERS = {"txt": _read_txt, "md": _read_md, "pdf": _read_pdf, "docx": _read_docx}
