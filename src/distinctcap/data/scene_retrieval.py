"""Shapes world only: a retrieval judge that knows the truth. Caption i ranks the split's
images by how many of its claims (`data.scene.claim_list`, the claims `claim_marks` marks:
object facts, relation facts, the background) hold in each image's true scene graph.

This judges distinctiveness without the CLIP the methods were tuned on: score(i, j) = the
number of caption i's claims that scene j holds. Ties are common (every scene with a circle
holds "a circle"), and a generic caption must not rank well by tying with everything, so a
tie is broken by a uniformly random order of the tied images and we report expectations
under it. With g images strictly better than caption i's own and t others tied with it:

- expected rank = 1 + g + t / 2;
- P(rank <= k) = clip((k - g) / (t + 1), 0, 1), whose mean over captions is R@k.

A caption that claims nothing (or only what every scene holds) ties with all N images: its
rank is chance, (N + 1) / 2, and its P(rank 1) is 1 / N.

Vectorised: a claim and a scene fact are the same hashable key (an object fact is
(shape, colour or None, size or None); a relation pairs two such keys with the relation), a
scene holds every key its objects and relations match (each object gives the four subsets of
its colour and size beside its shape), and the scores are the product of a captions x keys
count matrix with a scenes x keys 0/1 matrix over the keys some caption claims.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from itertools import product

import numpy as np

from distinctcap.data.scene import claim_list, parse

ObjectKey = tuple[str, str | None, str | None]  # shape, colour, size


def object_key(fact: dict) -> ObjectKey:
    return (fact["shape"], fact.get("colour"), fact.get("size"))


def claim_key(claim: tuple) -> tuple:
    """The key of one `claim_list` claim."""
    kind, *rest = claim
    if kind == "object":
        return ("object", object_key(rest[0]))
    if kind == "relation":
        return ("relation", object_key(rest[0]), rest[1], object_key(rest[2]))
    return ("background", rest[0])


def object_keys(obj: dict) -> list[ObjectKey]:
    """Every object fact `obj` matches: its shape with or without its colour and its size."""
    return [(obj["shape"], c, s) for c in (None, obj["colour"]) for s in (None, obj["size"])]


def scene_keys(scene: dict) -> set[tuple]:
    """Every claim key the scene holds."""
    objs = scene["objects"]
    keys = {("background", scene["background"])}
    keys |= {("object", key) for o in objs for key in object_keys(o)}
    keys |= {
        ("relation", a, rel, b)
        for i, rel, j in scene["relations"]
        for a, b in product(object_keys(objs[i]), object_keys(objs[j]))
    }
    return keys


def scene_key_matrix(scenes: Sequence[str | dict]) -> np.ndarray:
    """(scenes, keys) float32 0/1: which claim keys (`scene_keys`) each scene holds, over the
    keys any of them holds. The cosine of two rows, |A & B| / sqrt(|A| |B|), is how alike two
    scenes are in what a caption could claim of them (the scene graphs' similar images,
    evaluate.distinctive)."""
    held = [scene_keys(json.loads(s) if isinstance(s, str) else s) for s in scenes]
    column: dict[tuple, int] = {}
    for keys in held:
        for key in sorted(keys, key=repr):
            column.setdefault(key, len(column))
    matrix = np.zeros((len(scenes), len(column)), np.float32)
    for j, keys in enumerate(held):
        matrix[j, [column[k] for k in keys]] = 1
    return matrix


def scene_scores(texts: Sequence[str], scenes: Sequence[str | dict]) -> np.ndarray:
    """(captions, scenes) int64: how many of caption i's claims scene j holds."""
    claimed = [[claim_key(c) for c in claim_list(parse(t))] for t in texts]
    column: dict[tuple, int] = {}
    for keys in claimed:
        for key in keys:
            column.setdefault(key, len(column))
    counts = np.zeros((len(texts), len(column)), np.float32)
    for i, keys in enumerate(claimed):
        np.add.at(counts[i], [column[k] for k in keys], 1)
    holds = np.zeros((len(scenes), len(column)), np.float32)
    for j, scene in enumerate(scenes):
        scene = json.loads(scene) if isinstance(scene, str) else scene
        held = [column[k] for k in scene_keys(scene) if k in column]
        holds[j, held] = 1
    return np.rint(counts @ holds.T).astype(np.int64)  # small counts: exact in float32


def tied_counts(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(g, t) of each caption i of a square score matrix: images scoring strictly more than its
    own image i, and other images scoring the same."""
    own = np.diag(scores)[:, None]
    return (scores > own).sum(1), (scores == own).sum(1) - 1


def expected_ranks(better: np.ndarray, ties: np.ndarray) -> np.ndarray:
    """1 + g + t / 2: the mean rank under a uniformly random order of the tied images."""
    return 1.0 + better + ties / 2.0


def hit_probability(better: np.ndarray, ties: np.ndarray, k: int) -> np.ndarray:
    """P(rank <= k) under a uniformly random order of the tied images: the own image is
    equally likely at each of the t + 1 places after the g better ones."""
    return np.clip((k - better) / (ties + 1.0), 0.0, 1.0)


def scene_ranks(texts: Sequence[str], scenes: Sequence[str | dict]) -> np.ndarray:
    """Expected rank (float64, 1-based) of image i among `scenes` for caption i (module
    docstring: ties broken uniformly at random; chance is (N + 1) / 2)."""
    return expected_ranks(*tied_counts(scene_scores(texts, scenes)))


def scene_retrieval(
    texts: Sequence[str], scenes: Sequence[str | dict], ks: Sequence[int]
) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """({scene_r_at_k: mean P(rank <= k), scene_mean_rank}, {scene_rank, scene_top1}: each
    caption's expected rank and P(rank 1)) of caption i against image i among `scenes`."""
    better, ties = tied_counts(scene_scores(texts, scenes))
    ranks = expected_ranks(better, ties)
    values = {f"scene_r_at_{k}": float(hit_probability(better, ties, k).mean()) for k in ks}
    values["scene_mean_rank"] = float(ranks.mean())
    return values, {"scene_rank": ranks, "scene_top1": hit_probability(better, ties, 1)}
