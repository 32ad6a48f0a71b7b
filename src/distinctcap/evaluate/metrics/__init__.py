"""Caption metrics: quality, diversity, distinctiveness, multi-sample protocols and fluency.

Multi-metric functions return a `distinctcap.scores.result.MetricResult` (flat name -> float
plus name -> reason for skipped metrics, which stay in the values as NaN). Text metrics other
than `quality_scores`, `oracle_scores` and `evaluate_captions` expect PTB-tokenised captions
(`CocoTools.tokenize`).

The names below load their module on first use (PEP 562): a caller that needs one metric
does not load pycocoevalcap or start Java on the way. Training imports none of this package:
the scores it shares with evaluation (CIDEr-D, retrieval ranks) are distinctcap.scores
(tests/test_imports.py checks it).
"""

import importlib

_MODULE_OF = {
    **dict.fromkeys(("QUALITY_METRICS", "CocoTools", "quality_scores"), "coco"),
    "spice_unavailable_reason": "spice",
    **dict.fromkeys(
        ("distinct_share", "div_n", "mbleu", "mean_length", "novelty", "self_cider",
         "vocab_size"),
        "diversity",
    ),  # fmt: skip
    "gpt2_perplexity": "fluency",
    **dict.fromkeys(
        ("ORACLE_METRICS", "best_k", "cider_vs_n", "consensus_rerank", "consensus_scores",
         "oracle_scores"),
        "multisample",
    ),  # fmt: skip
    **dict.fromkeys(
        ("CLIPSCORE_PREFIX", "clipscore", "clipscores", "mean_rank", "model_self_retrieval",
         "rank_summary", "recall_at_k", "refclipscores", "retrieval_scores"),
        "retrieval",
    ),  # fmt: skip
    **dict.fromkeys(("DIVERSITY_METRICS", "diversity_scores", "evaluate_captions"), "text"),
}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
