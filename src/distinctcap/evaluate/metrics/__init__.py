"""Caption metrics: quality, diversity, distinctiveness, multi-sample protocols and fluency.

Multi-metric functions return a `MetricResult` (flat name -> float plus name -> reason for
skipped metrics, which stay in the values as NaN). Text metrics other than `quality_scores`,
`oracle_scores` and `evaluate_captions` expect PTB-tokenised captions (`CocoTools.tokenize`).
"""

from distinctcap.evaluate.metrics.coco import (
    QUALITY_METRICS,
    CocoTools,
    quality_scores,
    spice_unavailable_reason,
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
from distinctcap.evaluate.metrics.fluency import gpt2_perplexity
from distinctcap.evaluate.metrics.multisample import (
    ORACLE_METRICS,
    best_k,
    cider_vs_n,
    consensus_rerank,
    consensus_scores,
    oracle_scores,
)
from distinctcap.evaluate.metrics.result import MetricResult
from distinctcap.evaluate.metrics.retrieval import (
    CLIPSCORE_PREFIX,
    clipscore,
    clipscores,
    mean_rank,
    model_self_retrieval,
    rank_summary,
    recall_at_k,
    retrieval_ranks,
    retrieval_scores,
)
from distinctcap.evaluate.metrics.text import DIVERSITY_METRICS, diversity_scores, evaluate_captions

__all__ = [
    "CLIPSCORE_PREFIX",
    "DIVERSITY_METRICS",
    "ORACLE_METRICS",
    "QUALITY_METRICS",
    "CocoTools",
    "MetricResult",
    "best_k",
    "cider_vs_n",
    "clipscore",
    "clipscores",
    "consensus_rerank",
    "consensus_scores",
    "distinct_share",
    "div_n",
    "diversity_scores",
    "evaluate_captions",
    "gpt2_perplexity",
    "mbleu",
    "mean_length",
    "mean_rank",
    "model_self_retrieval",
    "novelty",
    "oracle_scores",
    "quality_scores",
    "rank_summary",
    "recall_at_k",
    "retrieval_ranks",
    "retrieval_scores",
    "self_cider",
    "spice_unavailable_reason",
    "vocab_size",
]
