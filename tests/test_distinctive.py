"""CIDErBtw and DisWordRate (scores/distinctive.py) on hand cases, the neighbour choice, and
CIDErBtw against the one public implementation of its computation."""

import numpy as np
import pytest

from distinctcap.core.errors import DistinctcapError
from distinctcap.scores.cider import CiderD
from distinctcap.scores.distinctive import (
    STOP_WORDS,
    cider_btw,
    dis_word_rate,
    distinctive_words,
    most_similar,
    similar_images,
    word_rate,
)

# Four images of a shapes-like world; 1 and 2 are near twins (a red cube, on the left or the
# right), 3 and 4 are about other things.
REFS = {
    1: ["a red cube on the left of a blue sphere", "a red cube left of a sphere",
        "the small red cube is on the left"],
    2: ["a red cube on the right of a blue sphere", "a red cube right of a sphere",
        "the small red cube is on the right"],
    3: ["a green cone behind a yellow cylinder", "a green cone and a yellow cylinder",
        "a yellow cylinder in front of a green cone"],
    4: ["two purple spheres", "a pair of purple balls", "two purple spheres side by side"],
}  # fmt: skip
NEIGHBOURS = {1: [2, 3], 2: [1, 3], 3: [4, 1], 4: [3, 2]}


def seeded_world(seed: int = 58, images: int = 12, k: int = 3):
    """A small world whose words are token ids, as the public CIDErBtw code reads captions:
    images on 3 topics (each topic's own words plus words every topic shares), 5 references
    each, neighbours by the cosine of noisy topic features, and 3 captions per image (its
    own first reference, its first neighbour's second reference, a sentence of shared words).
    Returns (references, neighbours, captions)."""
    rng = np.random.default_rng(seed)
    topics = rng.integers(0, 3, images)
    shared = [str(w) for w in range(1, 7)]
    pools = [shared + [str(w) for w in range(7 + 10 * t, 17 + 10 * t)] for t in range(3)]

    def sentence(pool):
        return " ".join(rng.choice(pool, rng.integers(4, 11)))

    ids = list(range(100, 100 + images))
    refs = {i: [sentence(pools[t]) for _ in range(5)] for i, t in zip(ids, topics, strict=True)}
    features = np.eye(3)[topics] + rng.normal(0, 0.3, (images, 3))
    neighbours = similar_images(ids, features, k)
    captions = {i: [refs[i][0], refs[neighbours[i][0]][1], sentence(shared)] for i in ids}
    return refs, neighbours, captions


def test_a_caption_copying_its_own_references_is_distinctive():
    """Image 3's own reference shares no n-gram beyond stop words with its neighbours': its
    CIDErBtw is near 0 and most of its words are distinctive."""
    caption = {3: "a green cone behind a yellow cylinder"}
    btw = cider_btw(caption, REFS, NEIGHBOURS)
    rate = dis_word_rate(caption, REFS, NEIGHBOURS)
    assert btw.per_image[3] < 0.05
    # green cone behind yellow cylinder: 5 distinctive words of 7, the two "a" are stop words
    assert rate.per_image[3] == pytest.approx(5 / 7)


def test_a_caption_copying_a_neighbours_reference_scores_high_cider_btw():
    own = cider_btw({1: "a red cube on the left of a blue sphere"}, REFS, NEIGHBOURS)
    copied = cider_btw({1: "a red cube on the right of a blue sphere"}, REFS, NEIGHBOURS)
    assert copied.per_image[1] > 2 * own.per_image[1]
    assert copied.per_image[1] > 1.0
    # the neighbour's words "right" are not image 1's: no distinctive word at all
    assert dis_word_rate({1: "a red cube on the right"}, REFS, NEIGHBOURS).corpus == 0.0
    assert dis_word_rate({1: "a red cube on the left"}, REFS, NEIGHBOURS).corpus == 1 / 6


def test_cider_btw_is_the_mean_of_cider_d_over_the_neighbours():
    scorer = CiderD(REFS.values())
    caption = "a red cube on the left"
    expected = np.mean([scorer.score(caption, REFS[j]) for j in NEIGHBOURS[1]])
    assert cider_btw({1: caption}, REFS, NEIGHBOURS).per_image[1] == pytest.approx(expected)
    # another document-frequency corpus changes the weights, hence the value
    other = CiderD([*REFS.values(), ["a red cube"] * 3, ["a red cube"] * 3])
    assert cider_btw({1: caption}, REFS, NEIGHBOURS, scorer=other).per_image[1] != pytest.approx(
        expected
    )


def test_values_per_image_are_means_over_its_captions_and_the_corpus_over_images():
    caps = {1: ["a red cube on the left", "two purple spheres"], 3: "a green cone"}
    btw = cider_btw(caps, REFS, NEIGHBOURS)
    one = [cider_btw({1: c}, REFS, NEIGHBOURS).corpus for c in caps[1]]
    assert btw.per_image[1] == pytest.approx(np.mean(one))
    assert btw.corpus == pytest.approx((btw.per_image[1] + btw.per_image[3]) / 2)
    rate = dis_word_rate(caps, REFS, NEIGHBOURS)
    assert rate.per_image[3] == pytest.approx(2 / 3)  # "a" is a stop word: green, cone of 3


def test_stop_words_are_never_distinctive_but_count_in_the_length():
    # "the", "is", "of", "on" occur only in image 1's references among 1 and 4, yet stay out
    words = distinctive_words(REFS[1], [REFS[4]], STOP_WORDS)
    assert words == {"red", "cube", "left", "blue", "sphere", "small"}
    assert word_rate("the cube is on the left", words) == pytest.approx(2 / 6)
    # without a stop list a word that only image 1's references use is distinctive
    assert "the" in distinctive_words(REFS[1], [REFS[4]], frozenset())
    assert dis_word_rate({1: "the left"}, REFS, {1: [4]}, stop_words=()).corpus == 1.0


def test_repeated_words_count_at_each_occurrence_and_an_empty_caption_is_zero():
    words = frozenset({"red", "left"})
    assert word_rate("red red red cube", words) == pytest.approx(3 / 4)
    assert word_rate("", words) == 0.0
    assert dis_word_rate({1: ""}, REFS, NEIGHBOURS).corpus == 0.0


def test_a_single_string_is_one_caption_not_its_characters():
    text = "a red cube on the left"
    assert cider_btw({1: text}, REFS, NEIGHBOURS) == cider_btw({1: [text]}, REFS, NEIGHBOURS)
    assert dis_word_rate({1: text}, REFS, NEIGHBOURS).corpus == pytest.approx(1 / 6)


def test_more_neighbours_can_only_take_distinctive_words_away():
    few = distinctive_words(REFS[1], [REFS[4]], STOP_WORDS)
    more = distinctive_words(REFS[1], [REFS[4], REFS[2]], STOP_WORDS)
    assert more == {"left"} and more < few


@pytest.mark.parametrize(
    ("neighbours", "message"),
    [
        ({1: [2]}, r"\[3\] have no neighbours"),
        ({1: [1, 2], 3: [4]}, r"\[1\] are their own neighbour"),
        ({1: [5], 3: [4]}, r"\[5\] have no references"),
    ],
)
def test_bad_neighbour_tables_name_the_image(neighbours, message):
    refs = {**REFS, 5: []}
    for metric in (cider_btw, dis_word_rate):
        with pytest.raises(DistinctcapError, match=message):
            metric({1: "a red cube", 3: "a cone"}, refs, neighbours)


def test_most_similar_excludes_self_breaks_ties_to_the_lower_row_and_orders_by_cosine():
    features = np.array([[1.0, 0.0], [2.0, 0.0], [1.0, 1.0], [0.0, 3.0], [1.0, 0.0]])
    # rows 0, 1 and 4 point the same way (cosine 1, whatever their length): each of them has
    # the two others first, lower row first; row 3 is nearest row 2 (cosine 0.71), then the
    # three tied rows at cosine 0, lowest first
    assert most_similar(features, 2).tolist() == [[1, 4], [0, 4], [0, 1], [2, 0], [0, 1]]
    assert most_similar(features, 4)[3].tolist() == [2, 0, 1, 4]
    # chunks of rows change nothing
    assert (most_similar(features, 3, chunk=2) == most_similar(features, 3)).all()


def test_similar_images_maps_ids_and_refuses_bad_input():
    features = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]])
    assert similar_images([10, 20, 30], features, k=1) == {10: [20], 20: [10], 30: [20]}
    with pytest.raises(DistinctcapError, match="allowed 1..2"):
        most_similar(features, 3)
    with pytest.raises(DistinctcapError, match="all-zero features"):
        most_similar(np.array([[1.0, 0.0], [0.0, 0.0]]), 1)
    with pytest.raises(DistinctcapError, match="one distinct id per row"):
        similar_images([10, 10, 30], features, k=1)


# CIDErBtw of seeded_world()'s captions, per image (the mean of its 3 captions), computed by
# ukyh/switch_disc_caption at 80a9e01 (captioning/utils/rewards.py, get_btw_score, mode
# "raw") with ruotianluo/cider at dbb3960 (pyciderevalcap/ciderD), its document frequencies
# built from the same references as scripts/prepro_ngrams.py builds them (end token "0"
# appended). Run outside this repository; the code is not ours to ship.
THEIRS = {100: 0.7195623976885255, 101: 0.7663419101480682, 102: 0.6829447619434136,
          103: 0.5482131193436066, 104: 0.681081993022468, 105: 0.6877420028931726,
          106: 0.7012124626357719, 107: 0.600445688523142, 108: 0.8526592566120841,
          109: 0.6321858096657684, 110: 0.7439493004598142, 111: 0.6304109761081784}  # fmt: skip


def test_cider_btw_agrees_with_the_public_reward_code():
    """Their code reads token ids and keeps the end token as the word "0", in captions and
    references alike; given the same strings, ours agrees to the last bits."""
    refs, neighbours, captions = seeded_world()

    def eos(texts):
        return [t + " 0" for t in texts]

    ours = cider_btw({i: eos(c) for i, c in captions.items()},
                     {i: eos(r) for i, r in refs.items()}, neighbours)  # fmt: skip
    assert ours.per_image == pytest.approx(THEIRS, rel=1e-12, abs=0)
    assert ours.corpus == pytest.approx(0.6872291399203344, rel=1e-12)  # their printed mean
