"""Shapes world only: score generated captions against the true scene graph.

A caption is parsed into claims: each mentioned object gives up to three facts (its shape,
colour+shape, size+shape), each relation phrase between two mentioned objects gives one
relation fact, and "on a <colour> background" gives the background fact. A claim is correct if
the scene holds an object (pair) that matches it. Precision = correct claims / claims; recall =
scene facts a caption covers / scene facts, micro-averaged over captions. This measures "talks
much, errs much" exactly, which no COCO metric can: a generic caption claims nothing (recall 0,
no precision penalty); a detailed wrong one loses precision.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from distinctcap.data.shapes import BACKGROUNDS, COLOURS, INVERSE, RELATIONS, SHAPES, SIZES
from distinctcap.scores.distinctive import STOP_WORDS

SHAPE_WORDS = {w: shape for shape, words in SHAPES.items() for w in words}
SIZE_WORDS = {w: size for size, words in SIZES.items() for w in words}
RELATION_PHRASES = sorted(
    ((tuple(p.split()), rel) for rel, phrases in RELATIONS.items() for p in phrases),
    key=lambda item: -len(item[0]),
)


@dataclass
class Claims:
    objects: list[dict] = field(default_factory=list)  # {"shape", "colour"?, "size"?}
    relations: list[tuple[int, str, int]] = field(default_factory=list)
    background: str | None = None


def parse(text: str) -> Claims:
    """Objects as (size? colour? shape) runs; a relation phrase between consecutive objects."""
    return _read(text.lower().split())[0]


def ends_badly(text: str) -> bool:
    """SCST's bad ending (issue 58; docs/methods.md): a caption whose parse is left incomplete
    (a size or colour, or a relation phrase, with no shape after it: "a red circle left of a
    blue") or whose last word is a function word (`scores.distinctive.STOP_WORDS`: "... left
    of a"); an empty caption too."""
    words = text.lower().split()
    if not words or words[-1] in STOP_WORDS:
        return True
    _, pending, relation = _read(words)
    return bool(pending) or relation is not None


def _read(words: list[str]) -> tuple[Claims, dict, str | None]:
    """`parse`'s claims, and what is left pending at the end: the size and colour read since
    the last shape, the relation phrase read since it."""
    claims, pending, relation = Claims(), {}, None
    i = 0
    while i < len(words):
        word = words[i]
        if word in BACKGROUNDS and i + 1 < len(words) and words[i + 1] in ("background",
                                                                           "backdrop"):
            claims.background, pending = word, {}
        elif word in SIZE_WORDS:
            pending["size"] = SIZE_WORDS[word]
        elif word in COLOURS:
            pending["colour"] = word
        elif word in SHAPE_WORDS:
            claims.objects.append({**pending, "shape": SHAPE_WORDS[word]})
            if relation is not None and len(claims.objects) >= 2:
                claims.relations.append((len(claims.objects) - 2, relation,
                                         len(claims.objects) - 1))
            pending, relation = {}, None
        else:
            for phrase, rel in RELATION_PHRASES:
                if tuple(words[i:i + len(phrase)]) == phrase and claims.objects:
                    relation, i = rel, i + len(phrase) - 1
                    break
        i += 1
    return claims, pending, relation


def matches(claim: dict, obj: dict) -> bool:
    return all(obj[key] == value for key, value in claim.items())


def object_facts(claim: dict) -> list[dict]:
    facts = [{"shape": claim["shape"]}]
    facts += [{"shape": claim["shape"], key: claim[key]} for key in ("colour", "size")
              if key in claim]
    return facts


def relation_holds(scene: dict, a: dict, rel: str, b: dict) -> bool:
    objs = scene["objects"]
    return any(matches(a, objs[i]) and matches(b, objs[j])
               for i, r, j in scene["relations"] if r == rel)


def describe(fact: dict) -> str:
    """An object fact in words: "large blue square", "circle"."""
    return " ".join(fact[key] for key in ("size", "colour", "shape") if key in fact)


def claim_list(claims: Claims) -> list[tuple]:
    """Every claim of a parsed caption, in order (module docstring): ("object", fact) for each
    of an object's facts, ("relation", a, rel, b) with the two objects' claims, and
    ("background", colour)."""
    out: list[tuple] = [("object", fact) for claim in claims.objects
                        for fact in object_facts(claim)]  # fmt: skip
    out += [("relation", claims.objects[i], rel, claims.objects[j])
            for i, rel, j in claims.relations]  # fmt: skip
    if claims.background:
        out.append(("background", claims.background))
    return out


def claim_holds(claim: tuple, scene: dict) -> bool:
    """Whether the scene holds one claim of `claim_list`."""
    kind, *rest = claim
    if kind == "object":
        return any(matches(rest[0], o) for o in scene["objects"])
    if kind == "relation":
        return relation_holds(scene, *rest)
    return rest[0] == scene["background"]


def claim_words(claim: tuple) -> str:
    kind, *rest = claim
    if kind == "object":
        return describe(rest[0])
    if kind == "relation":
        return f"{describe(rest[0])} {rest[1]} {describe(rest[2])}"
    return f"{rest[0]} background"


def claim_marks(text: str, scene: dict) -> list[tuple[str, bool]]:
    """Each claim of a caption in words, with whether the scene holds it (module docstring:
    an object's facts, its relations, the background)."""
    return [(claim_words(c), claim_holds(c, scene)) for c in claim_list(parse(text))]


def score_caption(text: str, scene: dict) -> dict[str, int]:
    """Counts for one caption: claims, correct claims, scene facts, covered scene facts."""
    marks = claim_marks(text, scene)
    return {
        "claims": len(marks),
        "correct": sum(right for _, right in marks),
        **coverage(parse(text), scene),
    }


def coverage(claims: Claims, scene: dict) -> dict[str, int]:
    objs = scene["objects"]
    facts = covered = 0
    for o in objs:
        for fact in object_facts(o):
            facts += 1
            covered += any(all(c.get(k) == v for k, v in fact.items()) for c in claims.objects)
    said = {(rel, i, j) for i, rel, j in claims.relations}
    said |= {(INVERSE[rel], j, i) for rel, i, j in said}
    for i, rel, j in scene["relations"]:
        facts += 1
        covered += any(r == rel and matches(claims.objects[a], objs[i])
                       and matches(claims.objects[b], objs[j]) for r, a, b in said)
    facts += 1
    covered += claims.background == scene["background"]
    return {"facts": facts, "covered": covered}


def scene_f1(texts: list[str], scenes: list[str | dict]) -> dict[str, float]:
    """Micro-averaged scene precision, recall and F1 of captions against their scenes."""
    totals = {"claims": 0, "correct": 0, "facts": 0, "covered": 0}
    for text, scene in zip(texts, scenes, strict=True):
        scene = json.loads(scene) if isinstance(scene, str) else scene
        for key, value in score_caption(text, scene).items():
            totals[key] += value
    precision = totals["correct"] / totals["claims"] if totals["claims"] else float("nan")
    recall = totals["covered"] / totals["facts"] if totals["facts"] else float("nan")
    f1 = 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0
    return {"scene_precision": precision, "scene_recall": recall, "scene_f1": f1}
