"""The shapes world: the embedded default dataset, generated deterministically from a seed.

Scenes hold 1-3 objects (shape, colour, size, grid cell) on a coloured background. Each image
gets five captions at mixed specificity, from generic captions shared by many images
("a picture of some shapes") to fully specific ones ("a small red circle left of a large blue
square on a grey background"), so retrieval entropy (UNKT eq. 3) separates them as it does
COCO's generic captions. The scene graph is kept as JSON so evaluation can score captions
against the truth.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image, ImageDraw

from distinctcap.core.logs import progress

SHAPES = {  # name -> synonyms used in captions (first one is canonical)
    "circle": ["circle", "disc"],
    "square": ["square", "box"],
    "triangle": ["triangle"],
    "star": ["star"],
    "diamond": ["diamond", "rhombus"],
    "hexagon": ["hexagon"],
}
COLOURS = {
    "red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220),
    "yellow": (235, 210, 40), "purple": (140, 50, 170), "orange": (245, 140, 20),
    "pink": (240, 130, 190),
}
BACKGROUNDS = {"grey": (128, 128, 128), "black": (15, 15, 15), "white": (245, 245, 245)}
SIZES = {"small": ["small", "little", "tiny"], "large": ["large", "big"]}
RELATIONS = {  # relation -> phrasings
    "left of": ["left of", "to the left of"],
    "right of": ["right of", "to the right of"],
    "above": ["above", "over"],
    "below": ["below", "under", "beneath"],
}
INVERSE = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}
GENERIC = [
    "a picture of some shapes", "an image with shapes", "some shapes on a background",
    "a simple drawing", "a drawing of a few objects", "there are shapes in this image",
    "a picture with some objects in it", "geometric shapes",
]
NUMBERS = {1: "one", 2: "two", 3: "three"}
LEVELS = ("generic", "partial", "detailed", "specific")


@dataclass(frozen=True)
class ShapesConfig:
    n_train: int = 2000
    n_val: int = 200
    n_test: int = 200
    image_size: int = 64
    max_objects: int = 3
    seed: int = 0
    level_weights: tuple[float, ...] = (0.35, 0.25, 0.2, 0.2)


def make_scene(rng: np.random.Generator, max_objects: int) -> dict:
    """A scene graph: background, objects in distinct cells of a 3x3 grid, pairwise relations."""
    n = int(rng.integers(1, max_objects + 1))
    cells = rng.choice(9, size=n, replace=False)
    objects = [
        {
            "shape": str(rng.choice(list(SHAPES))),
            "colour": str(rng.choice(list(COLOURS))),
            "size": str(rng.choice(list(SIZES))),
            "row": int(c // 3),
            "col": int(c % 3),
        }
        for c in cells
    ]
    objects.sort(key=lambda o: (o["col"], o["row"]))
    return {
        "background": str(rng.choice(list(BACKGROUNDS))),
        "objects": objects,
        "relations": relations(objects),
    }


def relations(objects: list[dict]) -> list[list]:
    """[i, relation, j] for each ordered pair, along the axis where they are further apart."""
    out = []
    for i, a in enumerate(objects):
        for j, b in enumerate(objects):
            if i == j:
                continue
            dx, dy = b["col"] - a["col"], b["row"] - a["row"]
            if abs(dx) >= abs(dy):
                rel = "left of" if dx > 0 else "right of"
            else:
                rel = "above" if dy > 0 else "below"
            out.append([i, rel, j])
    return out


def render(scene: dict, size: int) -> Image.Image:
    image = Image.new("RGB", (size, size), BACKGROUNDS[scene["background"]])
    draw = ImageDraw.Draw(image)
    cell = size / 3
    for o in scene["objects"]:
        cx, cy = (o["col"] + 0.5) * cell, (o["row"] + 0.5) * cell
        r = cell * (0.22 if o["size"] == "small" else 0.45)
        draw_shape(draw, o["shape"], cx, cy, r, COLOURS[o["colour"]])
    return image


def draw_shape(draw: ImageDraw.ImageDraw, shape: str, cx: float, cy: float, r: float, fill):
    if shape == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
        return
    sides, start = {"square": (4, 45), "triangle": (3, -90), "diamond": (4, 0),
                    "hexagon": (6, 0), "star": (10, -90)}[shape]
    angles = np.deg2rad(start + np.arange(sides) * 360 / sides)
    radii = np.where(np.arange(sides) % 2, r * 0.45, r) if shape == "star" else np.full(sides, r)
    draw.polygon(list(zip(cx + radii * np.cos(angles), cy + radii * np.sin(angles),
                          strict=True)), fill=fill)


def describe(o: dict, rng: np.random.Generator, size=True, colour=True) -> str:
    words = []
    if size:
        words.append(str(rng.choice(SIZES[o["size"]])))
    if colour:
        words.append(o["colour"])
    words.append(str(rng.choice(SHAPES[o["shape"]])))
    return " ".join(words)


def caption(scene: dict, level: str, rng: np.random.Generator) -> str:
    """One caption of the given specificity level; phrasing and word order vary."""
    return re.sub(r"\ba (?=[aeiou])", "an ", raw_caption(scene, level, rng))


def raw_caption(scene: dict, level: str, rng: np.random.Generator) -> str:
    objs = scene["objects"]
    if level == "generic":
        return str(rng.choice(GENERIC))
    if level == "partial":
        o = objs[int(rng.integers(len(objs)))]
        mention = describe(o, rng, size=False, colour=bool(rng.random() < 0.5))
        if len(objs) == 1:
            return str(rng.choice([f"a {mention}", f"a picture of a {mention}"]))
        other = "shape" if len(objs) == 2 else "shapes"
        return str(rng.choice([f"a {mention} and other {other}",
                               f"{NUMBERS[len(objs)]} shapes including a {mention}"]))
    if level == "detailed":
        parts = [f"a {describe(o, rng, size=False)}" for o in objs]
        order = rng.permutation(len(parts))
        return " and ".join(parts[i] for i in order)
    return specific_caption(scene, rng)


def specific_caption(scene: dict, rng: np.random.Generator) -> str:
    objs, bg = scene["objects"], scene["background"]
    ground = str(rng.choice([f"on a {bg} background", f"against a {bg} backdrop"]))
    if len(objs) == 1:
        where = ["on the left", "in the middle", "on the right"][objs[0]["col"]]
        return f"a {describe(objs[0], rng)} {where} {ground}"
    i, rel, j = scene["relations"][int(rng.integers(len(scene["relations"])))]
    if rng.random() < 0.5:
        i, rel, j = j, INVERSE[rel], i
    text = f"a {describe(objs[i], rng)} {rng.choice(RELATIONS[rel])} a {describe(objs[j], rng)}"
    rest = [k for k in range(len(objs)) if k not in (i, j)]
    if rest:
        text += f" and a {describe(objs[rest[0]], rng)}"
    if rng.random() < 0.5:
        return f"{ground} {text}"
    return f"{text} {ground}"


def scene_captions(scene: dict, weights, rng: np.random.Generator, k: int = 5) -> list:
    """k captions with levels drawn from `weights`, at least one generic and one specific."""
    levels = ["generic", "specific"] + list(rng.choice(LEVELS, size=k - 2, p=weights))
    return [(level, caption(scene, level, rng)) for level in levels]


def generate(cfg: ShapesConfig, out_dir: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Render every image to `out_dir/images/` and return the images and captions tables."""
    out_dir = Path(out_dir)
    (out_dir / "images").mkdir(parents=True, exist_ok=True)
    weights = np.asarray(cfg.level_weights, dtype=float)
    weights /= weights.sum()
    splits = ["train"] * cfg.n_train + ["val"] * cfg.n_val + ["test"] * cfg.n_test
    images, captions = [], []
    for image_id, split in enumerate(progress(splits, desc="shapes world", unit="images")):
        rng = np.random.default_rng([cfg.seed, image_id])
        scene = make_scene(rng, cfg.max_objects)
        file = f"images/{image_id:07d}.png"
        render(scene, cfg.image_size).save(out_dir / file)
        images.append((image_id, file, split, cfg.image_size, cfg.image_size, json.dumps(scene)))
        for level, text in scene_captions(scene, weights, rng):
            captions.append((len(captions), image_id, split, text, LEVELS.index(level)))
    images = pd.DataFrame(images, columns=["image_id", "file", "split", "width", "height", "scene"])
    captions = pd.DataFrame(captions, columns=["caption_id", "image_id", "split", "text", "level"])
    return images, captions
