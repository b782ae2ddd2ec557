"""Reading documents: PDFs made here (text pages, a scanned page, a wholly scanned file, passwords, damage), Word
files made with python-docx (and damaged ones), text in several encodings, Markdown headings, and refusals
by size (a sparse 500 MB file, never read) and by kind.

Bad inputs tried: a PDF of only pictures, a PDF locked with a password, a PDF cut short, garbage named .pdf,
random bytes named .docx, a zip without a Word document in it, a .docx that unpacks to too much, a 500 MB
file, a file with binary data named .txt, an empty .txt, an .xyz file, a file that does not exist.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import docx
import pytest

from app.documents.attach import prepare_document
from app.documents.extract import MAX_FILE_BYTES, MAX_UNZIPPED_BYTES, DocumentError, read_document

PAGES = [
    "Chapter one: the lighthouse keeper.\nShe climbs (slowly) to the lamp.",
    "Chapter two: the storm arrives at night.",
    None,  # a scanned page: only a picture
    "Chapter four: morning, and the boats come home.",
]


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_a_pdf_is_read_page_by_page_and_its_scanned_page_is_said(tmp_path, makers):
    document = prepare_document(write(tmp_path, "story.pdf", makers.make(PAGES)))
    assert document.kind == "pdf" and document.num_pages == 4
    assert [p.where for p in document.passages] == ["p. 1", "p. 2", "p. 4"]
    assert "She climbs (slowly) to the lamp." in document.passages[0].text
    assert "boats come home" in document.passages[2].text
    assert document.notes == (
        "story.pdf: page 3 has no text layer (scanned images?); Tandem reads the other 3 of its 4 pages.",
    )
    assert not document.counted and document.num_tokens > 0  # no model: estimated from its length


def test_a_scanned_pdf_is_refused_with_a_clear_message(tmp_path, makers):
    with pytest.raises(DocumentError) as info:
        read_document(write(tmp_path, "scan.pdf", makers.make([None, None, None])))
    assert str(info.value).startswith(
        "scan.pdf: this PDF has no text layer; it looks scanned, and Tandem does not read images of text yet."
    )


def test_a_pdf_locked_with_a_password_is_refused_and_one_with_an_empty_password_reads(tmp_path, makers):
    plain = makers.make(PAGES)
    with pytest.raises(DocumentError, match="locked.pdf is locked with a password; Tandem cannot read it"):
        read_document(write(tmp_path, "locked.pdf", makers.encrypt(plain, "secret")))
    opened = read_document(write(tmp_path, "permissions.pdf", makers.encrypt(plain, "")))
    assert [s.where for s in opened.sections] == ["p. 1", "p. 2", "p. 4"]


def test_damaged_pdfs_are_refused(tmp_path, makers):
    whole = makers.make(PAGES)
    for name, data in {"cut.pdf": whole[: len(whole) // 3], "garbage.pdf": b"%PDF-1.4\nnot really\n"}.items():
        with pytest.raises(DocumentError, match=f"{name} is not a readable PDF"):
            read_document(write(tmp_path, name, data))


def test_a_word_document_keeps_its_headings_paragraphs_and_tables(tmp_path):
    made = docx.Document()
    made.add_heading("Quarterly report", level=1)
    made.add_paragraph("Sales rose in the north.")
    made.add_heading("Costs", level=2)
    made.add_paragraph("Freight cost more than planned.")
    table = made.add_table(rows=2, cols=2)
    for (row, col), text in {(0, 0): "Item", (0, 1): "Cost", (1, 0): "Freight", (1, 1): "120"}.items():
        table.cell(row, col).text = text
    made.add_paragraph("After the table.")
    out = io.BytesIO()
    made.save(out)
    extracted = read_document(write(tmp_path, "report.docx", out.getvalue()))
    assert [s.where for s in extracted.sections] == ["Quarterly report", "Costs"]
    costs = extracted.sections[1].text
    assert costs.index("Freight cost more") < costs.index("Item | Cost") < costs.index("Freight | 120")
    assert costs.index("Freight | 120") < costs.index("After the table.")


def test_damaged_word_files_are_refused(tmp_path, monkeypatch):
    no_document = io.BytesIO()
    with zipfile.ZipFile(no_document, "w") as archive:
        archive.writestr("hello.txt", "not a word file")
    bad_xml = io.BytesIO()
    with zipfile.ZipFile(bad_xml, "w") as archive:
        archive.writestr("[Content_Types].xml", "<Types")
        archive.writestr("word/document.xml", "<w:document")
    files = {"random.docx": bytes(range(256)) * 8, "empty.docx": no_document.getvalue(), "xml.docx": bad_xml.getvalue()}
    for name, data in files.items():
        with pytest.raises(DocumentError, match=f"{name} is not a readable Word document"):
            read_document(write(tmp_path, name, data))
    # a zip bomb (here 2 MB of zeros in a few kB, the cap lowered to 1 MB): refused by the sizes its directory
    # says, nothing unpacked
    bomb = io.BytesIO()
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("word/document.xml", bytes(2 * 2**20))
    monkeypatch.setattr("app.documents.extract.MAX_UNZIPPED_BYTES", 2**20)
    with pytest.raises(DocumentError, match="bomb.docx unpacks to 2 MB; Tandem reads Word documents up to 1 MB"):
        read_document(write(tmp_path, "bomb.docx", bomb.getvalue()))
    assert len(bomb.getvalue()) < 2**20 and MAX_UNZIPPED_BYTES > MAX_FILE_BYTES


def test_a_500_mb_file_is_refused_by_its_size_without_being_read(tmp_path, monkeypatch):
    path = tmp_path / "huge.pdf"
    with open(path, "wb") as handle:  # sparse: no 500 MB are written
        handle.truncate(500 * 2**20)

    def never(self):
        raise AssertionError(f"{self} was read")

    monkeypatch.setattr(Path, "read_bytes", never)
    with pytest.raises(DocumentError, match=r"huge.pdf is 500 MB; Tandem reads documents up to 64 MB"):
        read_document(path)


def test_text_files_in_their_encodings_and_refusals(tmp_path):
    assert read_document(write(tmp_path, "utf8.txt", "naïve café\r\nline".encode())).sections[0].text == (
        "naïve café\nline"
    )
    assert read_document(write(tmp_path, "utf16.txt", "Grüße".encode("utf-16"))).sections[0].text == "Grüße"
    assert read_document(write(tmp_path, "latin.txt", "déjà vu".encode("cp1252"))).sections[0].text == "déjà vu"
    with pytest.raises(DocumentError, match="binary.txt does not look like a text file"):
        read_document(write(tmp_path, "binary.txt", b"\x00\x01\x02text"))
    with pytest.raises(DocumentError, match="blank.txt has no text in it"):
        read_document(write(tmp_path, "blank.txt", b"  \n\n "))
    with pytest.raises(DocumentError, match="data.xyz is not a file Tandem can attach"):
        read_document(write(tmp_path, "data.xyz", b"anything"))
    with pytest.raises(DocumentError, match="Cannot read"):
        read_document(tmp_path / "nowhere.md")


def test_markdown_is_cut_at_its_headings_but_not_inside_code(tmp_path):
    text = "Intro line.\n\n# Setup\n\nInstall it.\n\n```sh\n# not a heading\n```\n\n## Use\n\nRun it.\n"
    sections = read_document(write(tmp_path, "guide.md", text.encode())).sections
    assert [s.where for s in sections] == ["", "Setup", "Use"]
    assert "# not a heading" in sections[1].text
