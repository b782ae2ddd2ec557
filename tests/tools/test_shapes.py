"""The synthetic shape generator behind the demo vision model (tools/demo_vision/shapes.py)."""

from __future__ import annotations

import random
import sys
from collections import Counter
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest

# tools/ is not a package: the generator is imported the way train.py imports it, from its own folder.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "demo_vision"))

import shapes  # noqa: E402


def _scenes(count: int = 300, seed: int = 0) -> list[shapes.Scene]:
    rng = random.Random(seed)
    return [shapes.make_scene(rng) for _ in range(count)]


def _nearest_colour(rgb: np.ndarray) -> str:
    return min(shapes.COLOURS, key=lambda name: float(np.sum((np.array(shapes.COLOURS[name]) - rgb) ** 2)))


def test_same_seed_same_scenes_and_pixels():
    first, second = _scenes(20, seed=7), _scenes(20, seed=7)
    assert first == second
    assert all(shapes.render(a).tobytes() == shapes.render(b).tobytes() for a, b in zip(first, second))
    assert _scenes(20, seed=8) != first


def test_scenes_cover_every_count_colour_shape_and_background():
    scenes = _scenes()
    assert {len(s.objects) for s in scenes} == {1, 2, 3}
    assert {o.colour for s in scenes for o in s.objects} == set(shapes.COLOURS)
    assert {o.shape for s in scenes for o in s.objects} == set(shapes.SHAPES)
    assert {s.background for s in scenes} == set(shapes.BACKGROUNDS)


def test_shapes_inside_the_image_apart_and_left_to_right():
    for scene in _scenes():
        for obj in scene.objects:
            x0, y0, x1, y1 = obj.bbox
            assert 0 < x0 < x1 < scene.size and 0 < y0 < y1 < scene.size
            assert x1 - x0 == y1 - y0
        for a, b in combinations(scene.objects, 2):
            gap_x = max(b.bbox[0] - a.bbox[2], a.bbox[0] - b.bbox[2])
            gap_y = max(b.bbox[1] - a.bbox[3], a.bbox[1] - b.bbox[3])
            assert max(gap_x, gap_y) >= 4, f"{a} and {b} touch"
        centres = [o.centre_x for o in scene.objects]
        assert all(right - left >= 10 for left, right in zip(centres, centres[1:])), centres


def test_caption_names_every_object_left_to_right():
    for scene in _scenes():
        caption = shapes.describe(scene)
        assert caption[0].isupper() and caption.endswith(".")
        assert shapes.parse_description(caption) == Counter((o.colour, o.shape) for o in scene.objects)
        cursor = 0
        for obj in scene.objects:  # each object named after the one to its left
            cursor = caption.index(f"{obj.colour} {obj.shape}", cursor) + 1


def test_caption_wording():
    scene = shapes.scene_of_objects([("orange", "star"), ("red", "circle"), ("blue", "square")])
    assert shapes.describe(scene) == "An orange star, a red circle and a blue square."
    assert shapes.describe(shapes.scene_of_objects([("green", "diamond")])) == "A green diamond."
    two = shapes.scene_of_objects([("red", "circle"), ("red", "circle")])
    assert shapes.describe(two) == "A red circle and a red circle."
    assert shapes.parse_description("A blue star and a purple moon, a big red.") == Counter({("blue", "star"): 1})


def test_questions_only_about_shapes_present_once():
    scene = shapes.scene_of_objects([("red", "circle"), ("blue", "star"), ("green", "circle")])
    assert shapes.unique_shapes(scene) == ["star"]
    qa = dict(shapes.question_answers(scene, random.Random(0)))
    assert qa == {
        "Describe this image.": "A red circle, a blue star and a green circle.",
        "How many shapes are there?": "Three.",
        "What colour is the star?": "Blue.",
    }
    assert shapes.normalise_answer(" Blue. ") == "blue"


def test_render_objects_draws_the_named_colours_left_to_right():
    for background in shapes.BACKGROUNDS:
        pairs = [("red", "circle"), ("blue", "square"), ("yellow", "star")]
        image = shapes.render_objects(pairs, seed=3, background=background)
        assert image.size == (shapes.IMAGE_SIZE, shapes.IMAGE_SIZE) and image.mode == "RGB"
        scene = shapes.scene_of_objects(pairs, seed=3, background=background)
        pixels = np.asarray(image, dtype=np.float32)
        for obj, (colour, shape) in zip(scene.objects, pairs):
            assert (obj.colour, obj.shape) == (colour, shape)
            cx, cy = (obj.bbox[0] + obj.bbox[2]) // 2, (obj.bbox[1] + obj.bbox[3]) // 2
            assert _nearest_colour(pixels[cy, cx]) == colour, (background, colour)


def test_render_scales_to_other_sizes():
    image = shapes.render_objects([("green", "triangle")], seed=1, size=192)
    assert image.size == (192, 192)


@pytest.mark.parametrize(
    "pairs",
    [[], [("red", "circle")] * 4, [("pink", "circle")], [("red", "moon")]],
    ids=["none", "four", "unknown-colour", "unknown-shape"],
)
def test_render_objects_rejects_bad_objects(pairs):
    with pytest.raises(ValueError):
        shapes.render_objects(pairs)


def test_render_objects_rejects_unknown_background():
    with pytest.raises(ValueError, match="background"):
        shapes.render_objects([("red", "circle")], background="checkerboard")
