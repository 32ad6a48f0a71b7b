"""CIDErBtw and DisWordRate (scores/distinctive.py) on hand cases, the neighbour choice, and
CIDErBtw against the one public implementation of its computation."""

import numpy as np
import pytest

from distinctcap.core.errors import DistinctcapError
from distinctcap.evaluate.metrics.cider import CiderD
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
