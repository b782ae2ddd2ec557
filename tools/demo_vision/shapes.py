"""Synthetic shape scenes for the demo vision model: images, captions and question/answer pairs.

A scene is one to three coloured shapes on a plain or textured grey background. Shapes never overlap
and their centres are spread apart horizontally, so "left to right" is always a clear order; captions
name the objects in that order, which makes them learnable from the picture alone.

Development tool: used by tools/demo_vision/train.py and by tests; the app never imports it.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

IMAGE_SIZE = 96
MAX_OBJECTS = 3

# Saturated hues that stay distinct from each other and from the grey backgrounds.
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 225),
    "yellow": (240, 215, 40),
    "purple": (145, 60, 200),
    "orange": (250, 140, 25),
}
# No hexagon: at these sizes it is too close to a circle for a model this small to learn in minutes.
SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "star", "diamond")
BACKGROUNDS: tuple[str, ...] = ("plain", "noise", "stripes", "gradient")

DESCRIBE_QUESTION = "Describe this image."
COUNT_QUESTION = "How many shapes are there?"
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five")

# Geometry in pixels of a IMAGE_SIZE image; render() scales it to other sizes.
_MIN_SIDE, _MAX_SIDE = 20, 34
_GAP = 4  # empty pixels kept between any two bounding boxes
_MIN_DX = 10  # centres at least this far apart horizontally, so the left-to-right order is unambiguous
_COLOUR_JITTER = 14
_SUPERSAMPLE = 3


@dataclass(frozen=True)
class ShapeObject:
    """One shape: its colour name, shape name and square bounding box (x0, y0, x1, y1) in pixels."""

    colour: str
    shape: str
    bbox: tuple[int, int, int, int]
    tint: tuple[int, int, int] = (0, 0, 0)  # per-object colour jitter, added to COLOURS[colour]

    @property
    def centre_x(self) -> float:
        return (self.bbox[0] + self.bbox[2]) / 2


@dataclass(frozen=True)
class Scene:
    """A picture to render: `objects` sorted left to right, a background kind and its parameters."""

    objects: tuple[ShapeObject, ...]
    background: str
    background_seed: int
    size: int = IMAGE_SIZE


def _boxes_clear(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> bool:
    """Whether two boxes are at least _GAP apart and their centres _MIN_DX apart horizontally."""
    apart = a[2] + _GAP <= b[0] or b[2] + _GAP <= a[0] or a[3] + _GAP <= b[1] or b[3] + _GAP <= a[1]
    return apart and abs((a[0] + a[2]) - (b[0] + b[2])) / 2 >= _MIN_DX


def _place(rng: random.Random, count: int, size: int) -> list[tuple[int, int, int, int]]:
    """`count` non-overlapping square boxes, by rejection sampling (restarting from scratch if stuck)."""
    for _ in range(1000):
        boxes: list[tuple[int, int, int, int]] = []
        for _ in range(200):
            side = rng.randint(_MIN_SIDE, _MAX_SIDE)
            x0, y0 = rng.randint(1, size - side - 1), rng.randint(1, size - side - 1)
            box = (x0, y0, x0 + side, y0 + side)
            if all(_boxes_clear(box, other) for other in boxes):
                boxes.append(box)
                if len(boxes) == count:
                    return boxes
    raise RuntimeError(f"could not place {count} shapes in a {size}px image")


def _scene_from(rng: random.Random, pairs: list[tuple[str, str]], background: str | None) -> Scene:
    boxes = sorted(_place(rng, len(pairs), IMAGE_SIZE), key=lambda b: b[0] + b[2])
    objects = tuple(
        ShapeObject(colour, shape, box, tuple(rng.randint(-_COLOUR_JITTER, _COLOUR_JITTER) for _ in range(3)))
        for (colour, shape), box in zip(pairs, boxes)
    )
    return Scene(objects, background or rng.choice(BACKGROUNDS), rng.randrange(2**31))


def make_scene(rng: random.Random) -> Scene:
    """A random scene: 1-3 shapes with random colours, sizes and positions on a random background."""
    count = rng.randint(1, MAX_OBJECTS)
    pairs = [(rng.choice(list(COLOURS)), rng.choice(SHAPES)) for _ in range(count)]
    return _scene_from(rng, pairs, None)


def _background(kind: str, seed: int, size: int) -> np.ndarray:
    """A low-saturation grey background [size, size, 3] uint8, so every shape colour stands out."""
    rng = np.random.default_rng(seed)
    base = rng.uniform(70, 200) + rng.uniform(-8, 8, size=3)  # a grey with a faint tint
    if kind == "plain":
        img = np.broadcast_to(base, (size, size, 3)).astype(np.float32)
    elif kind == "noise":
        img = base + rng.normal(0, rng.uniform(6, 16), size=(size, size, 1))
    elif kind in ("stripes", "gradient"):
        yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
        angle = rng.choice([0.0, 0.5, 0.25, 0.75]) * math.pi if kind == "stripes" else rng.uniform(0, 2 * math.pi)
        t = xx * math.cos(angle) + yy * math.sin(angle)
        if kind == "stripes":
            period = rng.uniform(5, 14) / size
            wave = (np.floor(t / period) % 2)[..., None]
        else:
            wave = (t - t.min())[..., None] / max(float(t.max() - t.min()), 1e-6)
        img = base + (wave - 0.5) * rng.uniform(25, 70)
    else:
        raise ValueError(f"unknown background {kind!r}; expected one of {BACKGROUNDS}")
    return np.clip(img, 0, 255).astype(np.uint8)


def _polygon(shape: str, box: tuple[float, float, float, float]) -> list[tuple[float, float]] | None:
    """The outline of `shape` inside `box`, or None for the circle (drawn as an ellipse)."""
    x0, y0, x1, y1 = box
    cx, cy, r = (x0 + x1) / 2, (y0 + y1) / 2, (x1 - x0) / 2
    if shape == "circle":
        return None
    if shape == "square":
        return [(x0, y0), (x1, y0), (x1, y1), (x0, y1)]
    if shape == "triangle":
        return [(cx, y0), (x1, y1), (x0, y1)]
    if shape == "diamond":
        return [(cx, y0), (x1, cy), (cx, y1), (x0, cy)]
    if shape == "star":
        # Five points, inner radius 0.45: fat enough to read as a star at 20 pixels.
        return [
            (cx + rad * math.sin(k * math.pi / 5), cy - rad * math.cos(k * math.pi / 5))
            for k in range(10)
            for rad in [r if k % 2 == 0 else r * 0.45]
        ]
    raise ValueError(f"unknown shape {shape!r}; expected one of {SHAPES}")


def render(scene: Scene, size: int | None = None) -> Image.Image:
    """Draw `scene` as an RGB image of `size` pixels (default: the scene's own size), antialiased."""
    size = size or scene.size
    canvas = Image.fromarray(_background(scene.background, scene.background_seed, size), "RGB")
    # Shapes are drawn large and shrunk, which antialiases their edges.
    big = size * _SUPERSAMPLE
    scale = big / scene.size
    layer = Image.new("RGBA", (big, big), (0, 0, 0, 0))
    draw = ImageDraw.Draw(layer)
    for obj in scene.objects:
        rgb = tuple(int(min(255, max(0, c + d))) for c, d in zip(COLOURS[obj.colour], obj.tint))
        fill = (*rgb, 255)
        box = tuple(v * scale for v in obj.bbox)
        points = _polygon(obj.shape, box)
        if points is None:
            draw.ellipse(box, fill=fill)
        else:
            draw.polygon(points, fill=fill)
    layer = layer.resize((size, size), Image.Resampling.BOX)
    canvas.paste(layer, (0, 0), layer)
    return canvas


def object_map(scene: Scene) -> np.ndarray:
    """[size, size] uint8: 1 + the index of the object covering each pixel, 0 for background."""
    image = Image.new("L", (scene.size, scene.size), 0)
    draw = ImageDraw.Draw(image)
    for index, obj in enumerate(scene.objects, start=1):
        points = _polygon(obj.shape, obj.bbox)
        if points is None:
            draw.ellipse(obj.bbox, fill=index)
        else:
            draw.polygon(points, fill=index)
    return np.asarray(image)


def scene_of_objects(objects: list[tuple[str, str]], seed: int = 0, background: str = "plain") -> Scene:
    """A scene of the given (colour, shape) pairs at random places, left to right in the order given."""
    if not 1 <= len(objects) <= MAX_OBJECTS:
        raise ValueError(f"render_objects takes 1 to {MAX_OBJECTS} (colour, shape) pairs, got {len(objects)}")
    for colour, shape in objects:
        if colour not in COLOURS or shape not in SHAPES:
            raise ValueError(
                f"unknown object ({colour!r}, {shape!r}); colours are {list(COLOURS)}, shapes are {list(SHAPES)}"
            )
    if background not in BACKGROUNDS:
        raise ValueError(f"unknown background {background!r}; expected one of {BACKGROUNDS}")
    return _scene_from(random.Random(seed), list(objects), background)


def render_objects(
    objects: list[tuple[str, str]], seed: int = 0, background: str = "plain", size: int = IMAGE_SIZE
) -> Image.Image:
    """An image of the given (colour, shape) pairs, placed left to right in the order given.

    `render_objects([("red", "circle"), ("blue", "square")])` is "a red circle and a blue square".
    """
    return render(scene_of_objects(objects, seed, background), size)


def describe(scene: Scene) -> str:
    """The caption: every object's colour and shape, left to right ("A red circle and a blue star.")."""
    names = [f"{'an' if obj.colour[0] in 'aeiou' else 'a'} {obj.colour} {obj.shape}" for obj in scene.objects]
    text = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    return text[0].upper() + text[1:] + "."


def parse_description(text: str) -> Counter:
    """The (colour, shape) pairs a caption names, as a multiset; words it does not know are ignored."""
    words = text.lower().replace(",", " ").replace(".", " ").split()
    return Counter((a, b) for a, b in zip(words, words[1:]) if a in COLOURS and b in SHAPES)


def unique_shapes(scene: Scene) -> list[str]:
    """Shapes present exactly once (the only ones a colour question is asked about), left to right."""
    counts = Counter(obj.shape for obj in scene.objects)
    return [obj.shape for obj in scene.objects if counts[obj.shape] == 1]


def colour_question(shape: str) -> str:
    """The question asking for the colour of `shape` ("What colour is the star?")."""
    return f"What colour is the {shape}?"


def colour_answer(scene: Scene, shape: str) -> str:
    """The answer to colour_question(shape); `shape` must be present exactly once."""
    (colour,) = [obj.colour for obj in scene.objects if obj.shape == shape]
    return colour.capitalize() + "."


def count_answer(scene: Scene) -> str:
    """The answer to COUNT_QUESTION: the number of shapes as a word ("Three.")."""
    return NUMBER_WORDS[len(scene.objects)].capitalize() + "."


def normalise_answer(text: str) -> str:
    """An answer reduced for comparison: lower case, no surrounding spaces or final full stop."""
    return text.strip().rstrip(".").strip().lower()


def question_answers(scene: Scene, rng: random.Random) -> list[tuple[str, str]]:
    """Every question this scene supports with its answer, in random order (one chat's turns)."""
    pairs = [(DESCRIBE_QUESTION, describe(scene)), (COUNT_QUESTION, count_answer(scene))]
    pairs += [(colour_question(shape), colour_answer(scene, shape)) for shape in unique_shapes(scene)]
    rng.shuffle(pairs)
    return pairs
