"""The field's two distinctiveness metrics, CIDErBtw and DisWordRate, torch-free.

Both compare a generated caption of image i with the ground-truth captions (references) of
the K images most similar to i, its *neighbours* N(i): a mapping image id -> K other image
ids that the caller chooses from an image space no training objective reads (the judge
CLIP's pooled features, or on the shapes world the scene graphs; `similar_images` picks them
from a feature matrix). Captions and references are PTB-tokenised strings (words are
whitespace tokens), as for every text metric (`CocoTools.tokenize`).

CIDErBtw (Wang, Xu, Wang & Chan, "Compare and Reweight: Distinctive Image Captioning Using
Similar Images Sets", ECCV 2020, arXiv:2007.06877, the "between-set CIDEr"; the TPAMI
extension "On Distinctive Image Captioning via Comparing and Reweighting", arXiv:2204.03938)::

    CIDErBtw(c, i) = 1/|N(i)| * sum over j in N(i) of CIDEr-D(c, refs(j))

with CIDEr-D as our `cider` column computes it (`CiderD`, pycocoevalcap's scale; the papers
print it x100). Lower is more distinctive: the caption says less of what its image's
neighbours' captions say.

DisWordRate (Wang, Xu, Wang & Chan, "Group-based Distinctive Image Captioning with Memory
Attention" (GdisCap), ACM MM 2021, arXiv:2108.09151; IJCV 2024 extension arXiv:2504.02496):
the share of a caption's words that are distinctive for its image within its group
{i} + N(i). Here a word is distinctive for i when it occurs in a reference of i, in no
reference of any neighbour, and is not a stop word (`STOP_WORDS`)::

    D(i) = words(refs(i)) - words(refs(N(i))) - STOP_WORDS
    DisWordRate(c, i) = |{tokens t of c : t in D(i)}| / |tokens of c|     (0 if c is empty)

Higher is more distinctive. Both metrics: an image's value is the mean over its captions,
the corpus value the mean over images.

Sources, and what could and could not be read (a search of public code for this module):

- The authors' repository, github.com/WangJiuniu/DistinctiveCap (newest commit 6265051,
  2020-12-28), holds a README only: "Code: Waiting to be released", and links to the similar
  image sets. No code of GdisCap or DisWordRate was found under any name (GdisCap,
  DisWordRate, the author's other repositories).
- The similar image sets are public in ukyh/switch_disc_caption (Honda et al., WACV 2023;
  `data/similar_set_id/`, "provided by WangJiuniu/DistinctiveCap"): the paper's default,
  `method_retrieval_05`, is VSE++ image-to-text retrieval with K = 5. In its
  `similar_test.json` (commit 80a9e01) each of the 5000 Karpathy test images has 5
  neighbours, never itself, all from the test split.
- The one public computation of CIDErBtw is the same repository's training reward
  (`captioning/utils/rewards.py`, `get_btw_score`, mode "raw", with ruotianluo/cider's
  `CiderD`): the caption against the pooled first five references of each of its K similar
  images, with the document frequencies of the CIDEr-D reward (COCO train) and the end token
  counted as a word. Given its inputs (the end token as the word "0" in captions and
  references, the same document frequencies), `cider_btw` gives its numbers to 4e-16
  relative on a seeded set (tests/test_distinctive.py, which holds them).
- The papers' own text was not readable here (only their abstracts), so equation numbers are
  not cited and DisWordRate's reading below is ours, from the abstract's wording ("the
  distinctive words in the ground-truth captions", "distinctive word rate").

Where the definition left a choice, and the reading taken:

1. CIDErBtw averages CIDEr-D over the neighbours, each against all its references. The
   reward code pools the neighbours' references; the two agree when every neighbour has the
   same number of references (it keeps the first five of each COCO image), and here each
   neighbour weighs the same whatever its number of references.
2. Document frequencies: by default the references of every image passed (one document per
   image: pycocoevalcap's corpus mode over the evaluated split, the same corpus as the
   `cider` column); `scorer` takes a `CiderD` of another corpus (e.g. COCO train, as the
   reward code). The end token is not a word (COCO evaluation's convention, not the reward's).
3. Neighbours and K are the caller's: the papers took VSE++ (trained on COCO) with K = 5, we
   take an image space no training objective reads. The authors' sets keep the neighbours
   inside the evaluated split; `similar_images` picks among the rows it is given, so give
   it that split's features.
4. DisWordRate's distinctive words: a set (present in the image's references, absent from
   all its neighbours'), not a ranking by a tf-idf score; stop words are never distinctive
   but count in the caption's length; a repeated word counts at each occurrence; the rate is
   a fraction (the papers print a percentage); per caption, then the mean over images
   (not the corpus's distinctive tokens over its tokens).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from distinctcap.core.errors import DistinctcapError
from distinctcap.scores.cider import CiderD

SIMILAR_K = 5  # similar images per image: the papers' default set, `method_retrieval_05`
Captions = Mapping[Hashable, Sequence[str] | str]  # image id -> its caption(s)
References = Mapping[Hashable, Sequence[str]]  # image id -> its ground-truth captions
Neighbours = Mapping[Hashable, Sequence[Hashable]]  # image id -> its K most similar images

# English function words (articles, determiners, pronouns, prepositions, conjunctions,
# auxiliaries): never distinctive, however a group's references use them.
STOP_WORDS = frozenset(
    """a an the this that these those some any each every no another other such
    i me my we our you your he him his she her it its they them their there here what which who
    whom whose of in on at by for with about against between into through during before after
    above below to from up down out off over under again further then once and but or nor so
    if than too very as until while because both either neither not only own same just is am
    are was were be been being have has had having do does did doing can could will would
    shall should may might must 's""".split()
)


@dataclass(frozen=True)
class Distinctiveness:
    """A metric's value per image (the mean over its captions) and over the corpus (the mean
    over images)."""

    per_image: dict[Hashable, float]
    corpus: float


def cider_btw(
    captions: Captions,
    references: References,
    neighbours: Neighbours,
    *,
    scorer: CiderD | None = None,
) -> Distinctiveness:
    """CIDErBtw of every image's captions (module docstring; lower is more distinctive).

    `scorer` holds the document frequencies; default: a `CiderD` over every image of
    `references` (the evaluated split, one document per image).
    """
    _check_inputs(captions, references, neighbours)
    if scorer is None:
        scorer = CiderD(references.values())
    per_image = {
        image: _mean(caption_cider_btw(scorer, caps, [references[j] for j in neighbours[image]]))
        for image, caps in _caption_lists(captions).items()
    }
    return _summary(per_image)


def caption_cider_btw(
    scorer: CiderD, captions: Sequence[str], neighbour_refs: Sequence[Sequence[str]]
) -> np.ndarray:
    """CIDErBtw of each caption: its CIDEr-D against each neighbour's references, averaged
    over the neighbours -> (len(captions),). `CiderD.score` pair by pair: for an image's few
    references it is 4x faster than `CiderD.scores`' numpy blocks, and its floats the same."""
    per_neighbour = [[scorer.score(c, refs) for c in captions] for refs in neighbour_refs]
    return np.mean(per_neighbour, axis=0)


def dis_word_rate(
    captions: Captions,
    references: References,
    neighbours: Neighbours,
    *,
    stop_words: Iterable[str] = STOP_WORDS,
) -> Distinctiveness:
    """DisWordRate of every image's captions (module docstring; higher is more distinctive)."""
    _check_inputs(captions, references, neighbours)
    stop = frozenset(stop_words)
    per_image = {}
    for image, caps in _caption_lists(captions).items():
        words = distinctive_words(references[image], [references[j] for j in neighbours[image]],
                                  stop)  # fmt: skip
        per_image[image] = _mean([word_rate(c, words) for c in caps])
    return _summary(per_image)


def distinctive_words(
    own_refs: Sequence[str], neighbour_refs: Sequence[Sequence[str]], stop_words: frozenset[str]
) -> frozenset[str]:
    """D(i): the words of an image's references that no neighbour's reference uses, stop words
    left out."""
    theirs = {w for refs in neighbour_refs for ref in refs for w in ref.split()}
    return frozenset(w for ref in own_refs for w in ref.split()) - theirs - stop_words


def word_rate(caption: str, words: frozenset[str]) -> float:
    """The share of a caption's tokens that are in `words`, each occurrence counted; 0 for an
    empty caption (it says nothing distinctive)."""
    tokens = caption.split()
    return sum(t in words for t in tokens) / len(tokens) if tokens else 0.0


def similar_images(
    image_ids: Sequence[Hashable], features: np.ndarray, k: int = 5, chunk: int = 2048
) -> dict[Hashable, list[Hashable]]:
    """Each image's k most similar other images by the cosine of their feature rows, most
    similar first (`most_similar`): image id -> k image ids."""
    if len(image_ids) != len(features) or len(set(image_ids)) != len(image_ids):
        raise DistinctcapError(
            f"{len(image_ids)} image ids (distinct: {len(set(image_ids))}) for "
            f"{len(features)} feature rows: give one distinct id per row"
        )
    rows = most_similar(features, k, chunk)
    return {image: [image_ids[r] for r in row] for image, row in zip(image_ids, rows, strict=True)}


def most_similar(features: np.ndarray, k: int, chunk: int = 2048) -> np.ndarray:
    """Rows of the k most similar other rows of `features` (N, D) by cosine, most similar
    first -> (N, k) int64. A row is never its own neighbour (even when another row is equal
    to it); ties go to the lower row. Rows are compared `chunk` at a time (memory chunk x N)."""
    unit = _unit_rows(features)
    n = len(unit)
    if not 1 <= k < n:
        raise DistinctcapError(f"k = {k} similar images among {n}: allowed 1..{n - 1}")
    out = np.empty((n, k), dtype=np.int64)
    for start in range(0, n, chunk):
        sims = unit[start : start + chunk] @ unit.T
        own = np.arange(len(sims))
        sims[own, own + start] = -np.inf
        out[start : start + len(sims)] = np.argsort(-sims, axis=1, kind="stable")[:, :k]
    return out


def _unit_rows(features: np.ndarray) -> np.ndarray:
    x = np.asarray(features, dtype=np.float64)
    if x.ndim != 2:
        raise DistinctcapError(f"features must be an (images, D) matrix, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise DistinctcapError(f"non-finite features in rows {_bad_rows(~np.isfinite(x))}")
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    if (norm == 0).any():
        raise DistinctcapError(f"all-zero features (no direction) in rows {_bad_rows(norm == 0)}")
    return x / norm


def _bad_rows(mask: np.ndarray) -> list[int]:
    return np.flatnonzero(mask.any(axis=1))[:10].tolist()


def _caption_lists(captions: Captions) -> dict[Hashable, list[str]]:
    """image id -> list of captions; a single string is one caption, not its characters."""
    return {i: [c] if isinstance(c, str) else list(c) for i, c in captions.items()}


def _check_inputs(captions: Captions, references: References, neighbours: Neighbours) -> None:
    """One line naming the first offending ids when an image lacks what the metrics read."""
    if not captions:
        raise DistinctcapError("no captions to score")
    problems = {
        "have no captions": [i for i, c in _caption_lists(captions).items() if not c],
        "have no neighbours": [i for i in captions if not neighbours.get(i)],
        "are their own neighbour": [i for i in captions if i in neighbours.get(i, ())],
        "have no references": [
            i for i in {*captions, *(j for i in captions for j in neighbours.get(i, ()))}
            if not references.get(i)
        ],
    }  # fmt: skip
    for what, ids in problems.items():
        if ids:
            raise DistinctcapError(f"image ids {sorted(ids, key=str)[:5]} {what}")


def _mean(values: Sequence[float] | np.ndarray) -> float:
    return float(np.mean(values))


def _summary(per_image: dict[Hashable, float]) -> Distinctiveness:
    return Distinctiveness(per_image, _mean(list(per_image.values())))
