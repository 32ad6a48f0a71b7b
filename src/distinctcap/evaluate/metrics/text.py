"""All text-only metrics of one decoding of one run, each Java tool launched once (the
evaluation stage, distinctcap.evaluate.stage, calls `evaluate_captions`; CLIP and model metrics are
its own)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

from distinctcap.core.errors import DistinctcapError
from distinctcap.evaluate.distinctive import SimilarSets, distinctive_scores
from distinctcap.evaluate.metrics.coco import (
    CocoTools,
    check_references,
    coco_session,
    quality_scores,
)
from distinctcap.evaluate.metrics.diversity import (
    distinct_share,
    div_n,
    mbleu,
    mean_length,
    novelty,
    self_cider,
    vocab_size,
)
from distinctcap.evaluate.metrics.multisample import (
    best_k,
    consensus_rerank,
    oracle_from_table,
    sample_score_table,
)
from distinctcap.scores.cider import CiderD
from distinctcap.scores.result import MetricResult

Captions = Mapping[Hashable, Sequence[str]]
DIVERSITY_METRICS = ("div1", "div2", "mbleu4", "self_cider", "distinct")


def diversity_scores(
    caps_by_image: Captions,
    df_corpus: Captions | None = None,
    *,
    scorer: CiderD | None = None,
    workers: int = 1,
) -> MetricResult:
    """div1, div2, mbleu4, self_cider, distinct of tokenised captions (>= 2 per image), or all
    skipped with the reason when some image has a single caption. SelfCIDEr's idf: `scorer`
    (CIDEr-D of a corpus, CocoTools.cider_d), else `df_corpus`, else the captions' own.
    mBLEU-4 and SelfCIDEr split the images over `workers` forked processes."""
    out = MetricResult()
    if min(len(c) for c in caps_by_image.values()) < 2:
        for name in DIVERSITY_METRICS:
            out.skip(name, "diversity compares the captions of one image: needs >= 2 per image")
        return out
    out.values["div1"] = div_n(caps_by_image, 1)
    out.values["div2"] = div_n(caps_by_image, 2)
    out.values["mbleu4"] = mbleu(caps_by_image, workers)
    docs = None if df_corpus is None else df_corpus.values()
    out.values["self_cider"] = self_cider(caps_by_image, docs, scorer=scorer, workers=workers)
    out.values["distinct"] = distinct_share(caps_by_image)
    return out


def evaluate_captions(
    gts: Captions,
    samples: Captions,
    *,
    train_refs: Captions | None = None,
    oracle_ns: Sequence[int] = (),
    neighbour_captions: Captions | None = None,
    best_of: int = 5,
    similar: SimilarSets | None = None,
    tools: CocoTools | None = None,
) -> MetricResult:
    """Quality, diversity, oracle and consensus metrics of a decoding (UNKT §4.1–4.3, SMILE §4).

    gts: image id -> reference captions. samples: image id -> decoded captions in decoder
    order (sample 0 = the caption a one-caption evaluation uses, e.g. the best beam). Raw
    texts; everything is PTB-tokenised in one tokenizer launch (the references once per
    `tools` session, see CocoTools.tokenize_groups), but for `train_refs`, whose tokens
    stream a part at a time through CIDEr-D's document frequencies and the novelty set once
    per session (CocoTools.training: the same tokens, never held whole); the n-gram metrics
    use the session's `workers`, and METEOR and SPICE start at most once (per worker). Columns:
      - bleu1..bleu4, meteor, rouge_l, cider, spice of sample 0 (`quality_scores`);
      - length, vocab, distinct_corpus (share of distinct sample-0 captions over the set) and
        novelty (needs `train_refs`: image id -> training captions) of sample 0;
      - div1, div2, mbleu4, self_cider, distinct over all samples of each image (skipped with
        one sample); SelfCIDEr takes its idf from `train_refs` when given;
      - oracle_{metric}_{n} for each n in `oracle_ns` (Table 1);
      - with `neighbour_captions` (image id -> captions of its nearest training images):
        consensus_{quality metric} of the re-ranked best caption and consensus_{diversity
        metric} of the best `best_of` (Table 2);
      - with `similar` (evaluate.distinctive: each image's similar images among `samples`'
        images): cider_btw and dis_word_rate of sample 0, per image space.
    """
    missing = [i for i in samples if not samples[i]]
    if not samples or missing:
        raise DistinctcapError(f"every image needs at least one sample; empty: {missing[:5]}")
    check_references(gts, list(samples))
    groups = [{i: gts[i] for i in samples}, samples, neighbour_captions or {}]
    then = next((c for caps in (train_refs or {}).values() for c in caps), None)
    out = MetricResult()
    with coco_session(tools) as t:
        t.start_meteor()
        # the training captions follow these groups in the one file a serial run tokenises
        gts_t, samples_t, neigh_t = t.tokenize_groups(*groups, keep=(0,), then=then)
        training = t.training(train_refs) if train_refs else None
        train_cider = training.cider if training else None
        ranked = None
        if neighbour_captions is not None:
            ranked = consensus_rerank(samples_t, neigh_t, scorer=train_cider, workers=t.workers)
        _prefetch_spice(t, gts_t, samples_t, max(oracle_ns, default=1), ranked)
        first = {i: caps[:1] for i, caps in samples_t.items()}
        out.merge(quality_scores(gts_t, first, tokenized=True, tools=t))
        out.values["length"] = mean_length(first)
        out.values["vocab"] = vocab_size(first)
        out.values["distinct_corpus"] = distinct_share(first, scope="corpus")
        if similar is not None:
            split_refs = {i: gts_t[i] for i in samples_t}
            firsts = {i: caps[0] for i, caps in first.items()}
            out.merge(distinctive_scores(split_refs, firsts, similar, t.cider_d(split_refs)))
        if train_refs is None:
            out.skip("novelty", "novelty needs the training captions (train_refs)")
        else:
            out.values["novelty"] = novelty(first, training.captions if training else ())
        out.merge(diversity_scores(samples_t, scorer=train_cider, workers=t.workers))
        if oracle_ns:
            table, skipped = sample_score_table(
                gts_t, samples_t, max(oracle_ns), tokenized=True, tools=t
            )
            for n in sorted(set(oracle_ns)):
                out.merge(oracle_from_table(table, skipped, n))
        if ranked is not None:
            best = best_k(ranked, best_of)
            best1 = {i: caps[:1] for i, caps in best.items()}
            out.merge(quality_scores(gts_t, best1, tokenized=True, tools=t), prefix="consensus_")
            diversity = diversity_scores(best, scorer=train_cider, workers=t.workers)
            out.merge(diversity, prefix="consensus_")
    return out


def _prefetch_spice(
    tools: CocoTools, gts: Captions, samples: Captions, n: int, ranked: Captions | None
) -> None:
    """Score every (sample, refs) pair SPICE will be asked for in one SPICE run."""
    if tools.spice_skip_reason is not None:
        return
    pairs = [(s, gts[i]) for i, caps in samples.items() for s in caps[:n]]
    pairs += [(caps[0], gts[i]) for i, caps in (ranked or {}).items()]
    tools.spice(pairs)
