"""load_image on good, odd and bad inputs, image_content_hash, and oriented_size (EXIF orientations 1 to 8, a
declared-only canvas, empty bytes, non-images, a missing file); every image is made here with Pillow."""

from __future__ import annotations

import io
import struct
import time
import zlib

import numpy as np
import pytest
from PIL import Image, features

from engine.errors import ImageError
from engine.models.llava.processor import ImageProcessor
from engine.vision.image import (
    MAX_PIXELS,
    MAX_SIDE,
    check_size,
    decode_image,
    image_content_hash,
    load_image,
    oriented_size,
    to_rgb,
)


def _encode(image: Image.Image, fmt: str, **params) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **params)
    return buffer.getvalue()


def _noise(width: int, height: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _png_declaring(width: int, height: int) -> bytes:
    """A tiny PNG whose header declares width x height RGB pixels but carries almost no data."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", header)
        + _png_chunk(b"IDAT", zlib.compress(b"\x00" * 64))
        + _png_chunk(b"IEND", b"")
    )


def _pixel(image: Image.Image, xy: tuple[int, int]) -> np.ndarray:
    return np.array(image.getpixel(xy), dtype=np.int64)


def test_png_path_and_bytes_give_the_same_loaded_rgb(tmp_path):
    original = _noise(23, 17)
    path = tmp_path / "noise.png"
    original.save(path)
    from_path = load_image(path)
    from_str = load_image(str(path))
    from_bytes = load_image(path.read_bytes())
    for image in (from_path, from_str, from_bytes):
        assert image.mode == "RGB" and image.size == (23, 17)
        assert np.array_equal(np.asarray(image), np.asarray(original))
    from_pil = load_image(original)
    assert from_pil is not original and np.array_equal(np.asarray(from_pil), np.asarray(original))


def test_non_image_bytes():
    with pytest.raises(ImageError, match=r"not an image Pillow can read \(formats: PNG, JPEG"):
        load_image(b"Hello, this is a plain text file, not a picture.\n" * 4)


def test_truncated_png():
    data = _encode(_noise(64, 64), "PNG")
    with pytest.raises(ImageError, match="truncated.*re-save or re-download"):
        load_image(data[: len(data) // 2])
    # Cut inside the header: Pillow cannot even identify it, but the signature says it was a PNG.
    with pytest.raises(ImageError, match="starts like a PNG file but is truncated"):
        load_image(data[:40])


def test_truncated_jpeg():
    data = _encode(_noise(64, 64), "JPEG")
    with pytest.raises(ImageError, match="truncated.*re-save or re-download"):
        load_image(data[: len(data) // 2])
    with pytest.raises(ImageError, match="truncated"):
        load_image(data[:100])


def test_empty_bytes_and_empty_file(tmp_path):
    with pytest.raises(ImageError, match="empty"):
        load_image(b"")
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    with pytest.raises(ImageError, match="empty.png is empty"):
        load_image(empty)


def test_one_pixel_image_is_accepted_and_preprocesses():
    image = load_image(_encode(Image.new("RGB", (1, 1), (10, 200, 30)), "PNG"))
    assert image.size == (1, 1) and image.getpixel((0, 0)) == (10, 200, 30)
    processor = ImageProcessor.from_dict({"image_processor_type": "CLIPImageProcessor"})
    pixels = processor(image)
    assert pixels.shape == (3, 224, 224)
    assert bool(pixels.isfinite().all())


def test_zero_size_image_is_refused():
    with pytest.raises(ImageError, match="no pixels"):
        load_image(Image.new("RGB", (0, 5)))


@pytest.mark.timing
def test_png_declaring_30000x30000_is_refused_fast():
    data = _png_declaring(30000, 30000)
    assert len(data) < 200
    start = time.perf_counter()
    with pytest.raises(ImageError, match="too large") as caught:
        load_image(data)
    assert time.perf_counter() - start < 2  # refused from the header; decoding 900 MP would take minutes
    assert "900000000 pixels" in str(caught.value) and "64000000" in str(caught.value)


def test_declared_size_over_our_limits_is_refused_before_decoding():
    # 9000x9000 is under Pillow's own bomb limit, so this is our header check speaking.
    with pytest.raises(ImageError, match=r"9000x9000 \(81000000 pixels\).*64000000 pixels in all"):
        load_image(_png_declaring(9000, 9000))
    with pytest.raises(ImageError, match=r"10000x10 .*8192 pixels per side"):
        load_image(_png_declaring(10000, 10))
    with pytest.raises(ImageError, match="too large"):
        load_image(_noise(40, 30), max_pixels=1000)


def test_check_size_is_the_limit_decoding_uses():
    # The one limit, exactly at its edges: the app's attachment check and a pasted picture call check_size too.
    check_size("edge.png", MAX_SIDE, MAX_PIXELS // MAX_SIDE)
    with pytest.raises(ImageError, match=r"wide.png is too large.*8193x1 \(8193 pixels\)"):
        check_size("wide.png", MAX_SIDE + 1, 1)
    with pytest.raises(ImageError, match="big.png is too large"):
        check_size("big.png", 8000, MAX_PIXELS // 8000 + 1)
    with pytest.raises(ImageError, match=r"flat.png has no pixels \(3x0\)"):
        check_size("flat.png", 3, 0)
    declared = _png_declaring(8000, MAX_PIXELS // 8000 + 1)
    with pytest.raises(ImageError, match=r"8000x8001 \(64008000 pixels\)"):
        decode_image(declared, name="declared.png")


def test_decode_image_names_the_image_and_hashes_at_most_once():
    data = _encode(_noise(5, 3), "PNG")
    decoded = decode_image(data, name="photo.png")
    assert (decoded.format, decoded.picture.size, decoded.picture.mode, decoded.name) == (
        "PNG",
        (5, 3),
        "RGB",
        "photo.png",
    )
    assert decoded.digest is None  # not hashed until asked
    assert decoded.content_hash == image_content_hash(decoded.picture) == decoded.digest
    # A digest the caller already has of the bytes is kept: the pixels are not hashed again.
    given = decode_image(data, content_hash="ab" * 16)
    assert given.content_hash == "ab" * 16
    # A decoded image goes through as it is: not read, checked or decoded again.
    assert decode_image(given) is given and load_image(given) is given.picture
    assert oriented_size(given) == (5, 3)
    with pytest.raises(ImageError, match="notes.png is not an image"):
        decode_image(b"plain words", name="notes.png")
    with pytest.raises(ImageError, match=r"the image data \(11 bytes\) is not an image"):
        decode_image(b"plain words")


def test_cmyk_jpeg_becomes_plausible_rgb():
    cmyk = Image.new("CMYK", (16, 16), (0, 255, 255, 0))  # pure red in ink terms
    image = load_image(_encode(cmyk, "JPEG", quality=95))
    assert image.mode == "RGB"
    red, green, blue = _pixel(image, (8, 8))
    assert red > 230 and green < 25 and blue < 25


def test_sixteen_bit_grayscale_png_is_scaled_not_clipped():
    values = np.array([[0, 1000, 30000, 32768, 65535]], dtype=np.uint16)
    sixteen = Image.fromarray(values)
    assert sixteen.mode == "I;16"
    data = _encode(sixteen, "PNG")
    assert Image.open(io.BytesIO(data)).mode.startswith("I")
    image = load_image(data)
    assert image.mode == "RGB"
    grays = [image.getpixel((x, 0)) for x in range(5)]
    assert all(r == g == b for r, g, b in grays)
    # round(v * 255 / 65535); Pillow's clipping would have given 0, 255, 255, 255, 255
    assert [r for r, _, _ in grays] == [0, 4, 117, 128, 255]


def test_animated_gif_uses_first_frame():
    frames = [Image.new("RGB", (12, 10), colour) for colour in ((255, 0, 0), (0, 255, 0), (0, 0, 255))]
    data = _encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    assert Image.open(io.BytesIO(data)).n_frames == 3
    image = load_image(data)
    assert image.size == (12, 10) and image.getpixel((5, 5)) == (255, 0, 0)


def test_animated_png_and_open_image_on_a_later_frame_use_first_frame():
    frames = [Image.new("RGB", (8, 8), colour) for colour in ((0, 0, 255), (0, 255, 0))]
    data = _encode(frames[0], "PNG", save_all=True, append_images=frames[1:], duration=50)
    assert load_image(data).getpixel((3, 3)) == (0, 0, 255)
    opened = Image.open(io.BytesIO(data))
    opened.seek(1)
    assert load_image(opened).getpixel((3, 3)) == (0, 0, 255)


@pytest.mark.skipif(not features.check("webp"), reason="Pillow built without WebP")
def test_animated_webp_uses_first_frame():
    frames = [Image.new("RGB", (8, 8), colour) for colour in ((0, 0, 255), (255, 255, 0))]
    data = _encode(frames[0], "WEBP", save_all=True, append_images=frames[1:], duration=50, lossless=True)
    assert load_image(data).getpixel((3, 3)) == (0, 0, 255)


def test_rgba_transparency_is_composited_on_white():
    rgba = Image.new("RGBA", (3, 1))
    rgba.putpixel((0, 0), (255, 0, 0, 0))  # invisible red: must not show
    rgba.putpixel((1, 0), (0, 0, 255, 255))
    rgba.putpixel((2, 0), (0, 0, 0, 128))
    image = load_image(_encode(rgba, "PNG"))
    assert image.mode == "RGB"
    assert image.getpixel((0, 0)) == (255, 255, 255)
    assert image.getpixel((1, 0)) == (0, 0, 255)
    assert all(abs(c - 127) <= 1 for c in image.getpixel((2, 0)))


def test_palette_png_with_and_without_transparency():
    paletted = Image.new("P", (4, 2))
    paletted.putpalette([255, 0, 0, 0, 255, 0] + [0, 0, 0] * 254)
    paletted.putpixel((1, 0), 1)
    image = load_image(_encode(paletted, "PNG"))
    assert image.getpixel((0, 0)) == (255, 0, 0) and image.getpixel((1, 0)) == (0, 255, 0)
    transparent = load_image(_encode(paletted, "PNG", transparency=0))
    assert transparent.getpixel((0, 0)) == (255, 255, 255) and transparent.getpixel((1, 0)) == (0, 255, 0)


def test_exif_rotated_jpeg_is_turned_upright():
    stored = Image.new("RGB", (40, 20), (255, 255, 255))
    stored.paste((255, 0, 0), (0, 0, 10, 10))  # red block at the stored top-left
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to display"
    image = load_image(_encode(stored, "JPEG", quality=95, exif=exif.tobytes()))
    assert image.size == (20, 40)
    assert _pixel(image, (15, 4))[0] > 200 and _pixel(image, (15, 4))[1] < 60  # now top-right
    assert _pixel(image, (4, 4)).min() > 200  # top-left is white


def test_missing_path_and_folder(tmp_path):
    missing = tmp_path / "gone" / "photo.jpg"
    with pytest.raises(ImageError, match="does not exist") as caught:
        load_image(missing)
    assert str(missing) in str(caught.value)
    with pytest.raises(ImageError, match="is a folder"):
        load_image(tmp_path)


def test_unsupported_source_type():
    with pytest.raises(ImageError, match="file path"):
        load_image(12345)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        (Image.new("L", (2, 2), 77), (77, 77, 77)),
        (Image.new("LA", (2, 2), (77, 0)), (255, 255, 255)),
        (Image.new("1", (2, 2), 1), (255, 255, 255)),
        (Image.new("I", (2, 2), 65535), (255, 255, 255)),
        (Image.new("I", (2, 2), 257 * 40), (40, 40, 40)),
        (Image.new("F", (2, 2), 0.5), (128, 128, 128)),
        (Image.new("F", (2, 2), 200.0), (200, 200, 200)),
        (Image.new("CMYK", (2, 2), (0, 0, 0, 0)), (255, 255, 255)),
        (Image.new("RGBA", (2, 2), (10, 20, 30, 255)), (10, 20, 30)),
    ],
    ids=["L", "LA", "1", "I-max", "I-mid", "F-unit", "F-255", "CMYK", "RGBA-opaque"],
)
def test_every_mode_becomes_rgb(image, expected):
    rgb = load_image(image)
    assert rgb.mode == "RGB" and rgb.getpixel((1, 1)) == expected
    assert to_rgb(image).getpixel((1, 1)) == expected


def test_content_hash_follows_pixels_not_encoding():
    original = _noise(30, 20, seed=7)
    fast_png = _encode(original, "PNG", compress_level=1)
    small_png = _encode(original, "PNG", compress_level=9, optimize=True)
    assert fast_png != small_png
    fast = load_image(fast_png)
    assert image_content_hash(fast) == image_content_hash(load_image(small_png))
    changed = original.copy()
    r, g, b = changed.getpixel((13, 11))
    changed.putpixel((13, 11), ((r + 1) % 256, g, b))
    assert image_content_hash(load_image(_encode(changed, "PNG"))) != image_content_hash(fast)
    # Same bytes, other shape: the size is part of the key.
    flat = Image.frombytes("RGB", (20, 30), original.tobytes())
    assert image_content_hash(flat) != image_content_hash(original)


@pytest.mark.parametrize("orientation", [1, 3, 5, 6, 8])
def test_oriented_size_is_the_loaded_size_without_decoding(orientation, tmp_path):
    exif = Image.Exif()
    exif[0x0112] = orientation  # EXIF Orientation: 5 to 8 turn the picture a quarter
    data = _encode(_noise(40, 30), "JPEG", exif=exif)
    expected = load_image(data).size
    assert expected == ((30, 40) if orientation >= 5 else (40, 30))
    (tmp_path / "photo.jpg").write_bytes(data)
    with Image.open(io.BytesIO(data)) as opened:
        assert oriented_size(data) == oriented_size(tmp_path / "photo.jpg") == oriented_size(opened) == expected
    # A canvas that is only declared (no pixel data to decode) still has its size.
    assert oriented_size(_png_declaring(5000, 20)) == (5000, 20)


def test_oriented_size_refuses_what_load_image_refuses(tmp_path):
    for bad, message in ((b"", "empty"), (b"not an image", "not an image"), (tmp_path / "gone.png", "does not exist")):
        with pytest.raises(ImageError, match=message):
            oriented_size(bad)


@pytest.mark.timing
def test_eps_is_refused_by_content_without_running_ghostscript(tmp_path):
    # an EPS whose PostScript never ends (`{ } loop`): Pillow would hand it to Ghostscript; it must be refused
    # at once, whatever the file is called
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n{ } loop\n%%EOF\n"
    for name in ("drawing.eps", "drawing.png"):
        (tmp_path / name).write_bytes(eps)
        started = time.monotonic()
        with pytest.raises(ImageError, match="formats: PNG, JPEG, WEBP, GIF, BMP, TIFF"):
            load_image(tmp_path / name)
        assert time.monotonic() - started < 5


def test_a_huge_sixteen_bit_png_decodes_within_the_memory_budget(tmp_path):
    # a valid 8192 x 7800 16-bit grayscale PNG (64M pixels, in the size limits): before strips it peaked at
    # 1.9 GB; measured in a child process, as its peak resident memory above what it held before
    import subprocess
    import sys

    values = np.tile(np.arange(8192, dtype=np.uint16) * 8, (7800, 1))
    path = tmp_path / "huge16.png"
    Image.fromarray(values).save(path, compress_level=1)
    del values
    measure = (
        "import resource, sys\n"
        "from engine.vision.image import load_image\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "image = load_image(sys.argv[1])\n"
        "assert image.size == (8192, 7800) and image.getpixel((8191, 0))[0] == 255\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)\n"
    )
    done = subprocess.run([sys.executable, "-c", measure, str(path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) < 900  # MiB: the 16-bit pixels (125), the 8-bit gray and RGB results, strips


def test_an_image_over_the_decode_budget_is_refused_before_decoding():
    # 8000 x 8000 RGBA (64M pixels): its compositing would need about 1.2 GB
    data = _encode(Image.new("RGBA", (8000, 8000), (10, 20, 30, 128)), "PNG")
    with pytest.raises(ImageError, match="MB to decode.*budget"):
        load_image(data)
