"""Documents made in the tests: PDFs written byte by byte (text pages in Helvetica, and pages that are only a
picture, as a scanner makes them), Word files made with python-docx, and long text files."""

from __future__ import annotations

import io

import pytest


def _stream(dictionary: bytes, data: bytes) -> bytes:
    return dictionary[:-2] + b" /Length %d >>\nstream\n" % len(data) + data + b"\nendstream"


def make_pdf(pages: list[str | None]) -> bytes:
    """A PDF whose pages show those texts, one line per "\\n"; None: a page that is only a picture (a scan)."""
    objects = {
        1: b"<< /Type /Catalog /Pages 2 0 R >>",
        3: b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        4: _stream(
            b"<< /Type /XObject /Subtype /Image /Width 8 /Height 8 /ColorSpace /DeviceGray /BitsPerComponent 8 >>",
            bytes(range(0, 256, 4)),
        ),
    }
    kids = []
    for text in pages:
        if text is None:
            content = b"q 400 0 0 400 100 200 cm /Im1 Do Q"
        else:
            lines = [line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)") for line in text.split("\n")]
            shown = b" ".join(b"(%s) Tj T*" % line.encode("latin-1") for line in lines)
            content = b"BT /F1 11 Tf 72 740 Td 14 TL " + shown + b" ET"
        number = max(objects) + 1
        objects[number] = _stream(b"<< >>", content)
        objects[number + 1] = (
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> "
            b"/XObject << /Im1 4 0 R >> >> /Contents %d 0 R >>" % number
        )
        kids.append(number + 1)
    objects[2] = b"<< /Type /Pages /Kids [%s] /Count %d >>" % (b" ".join(b"%d 0 R" % k for k in kids), len(kids))
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = {}
    for number in sorted(objects):
        offsets[number] = out.tell()
        out.write(b"%d 0 obj\n" % number + objects[number] + b"\nendobj\n")
    xref, size = out.tell(), max(objects) + 1
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % size)
    out.write(b"".join(b"%010d 00000 n \n" % offsets[n] for n in range(1, size)))
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (size, xref))
    return out.getvalue()


def encrypt_pdf(data: bytes, user_password: str) -> bytes:
    """The PDF encrypted with AES-128 (an empty `user_password`: it opens, only its permissions are limited)."""
    from pypdf import PdfReader, PdfWriter

    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(data)))
    writer.encrypt(user_password=user_password, owner_password="owner", algorithm="AES-128")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


WORDS = "river stone lantern orchard copper meadow harbor violet thunder saddle quill ember".split()


def long_text(num_paragraphs: int, marked: dict[int, str] | None = None) -> str:
    """Paragraphs of filler words (each different), with `marked[i]` written into paragraph i."""
    paragraphs = []
    for i in range(num_paragraphs):
        words = [WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(60)]
        if marked and i in marked:
            words[10:10] = marked[i].split()
        paragraphs.append(f"Paragraph {i}. " + " ".join(words) + ".")
    return "\n\n".join(paragraphs)


@pytest.fixture
def makers():
    """The helpers above, for test modules (a conftest is not importable under --import-mode=importlib)."""
    from types import SimpleNamespace

    return SimpleNamespace(make=make_pdf, encrypt=encrypt_pdf, long_text=long_text)
