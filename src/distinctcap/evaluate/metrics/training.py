"""What an evaluation takes from the training captions, counted as they stream by.

The text metrics read the training captions (591,753 for COCO) for two facts only: CIDEr-D's
document frequencies (SelfCIDEr's idf and the consensus re-ranking's scorer) and which
captions they hold (novelty). Holding their PTB tokens whole for that, beside the tokenizer's
buffers of the whole set, made an evaluate job's peak memory grow with the training set
(issue 55). Here the tokens stream a part of the images at a time (ptb.stream_tokens): each
part goes into the document-frequency counter (scores.frequencies, which counts part by
part) and into the caption hashes (diversity.KnownCaptions), and is dropped. The consensus
neighbours' captions are not taken from here: they are tokenised with each decoding's
samples, as before, since a caption's tokens depend on the line that follows it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from distinctcap.evaluate.metrics.diversity import KnownCaptions
from distinctcap.scores.cider import ORDERS, CiderD
from distinctcap.scores.frequencies import DocumentFrequencies


@dataclass
class TrainingCorpus:
    """CIDEr-D with the training captions' document frequencies, and which captions they are."""

    cider: CiderD
    captions: KnownCaptions


def training_corpus(parts: Iterable[Sequence[Sequence[str]]]) -> TrainingCorpus:
    """The corpus of tokenised documents (one per training image) coming a part at a time:
    the scorer and caption set that the whole list of documents would give."""
    frequencies, captions = DocumentFrequencies(n=ORDERS), KnownCaptions()
    for documents in parts:
        frequencies.add(documents)
        captions.add(c for document in documents for c in document)
    return TrainingCorpus(CiderD(frequencies), captions)
