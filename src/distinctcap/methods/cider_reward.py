"""CIDEr-D on token ids, vectorised: the reward of self-critical training (methods.scst).

The definition is Vedantam et al. 2015's CIDEr-D (§3, eq. 2-5, with the D changes of §3.4:
Gaussian length penalty sigma = 6, clipped n-gram counts, x10) as pycocoevalcap's
cider_scorer.py computes it, and as distinctcap.evaluate.metrics.cider.CiderD does for the
evaluation (which training may not import; tests/test_scst.py checks that both give the same
numbers on the same captions):

    g_k(s)       = tf_k(s) * (log |D| - log max(1, df_k))      tf-idf of n-gram k (eq. 2)
    sim_n(c, r)  = sum_k min(g_k(c), g_k(r)) g_k(r) / (|g(c)| |g(r)|)    (0-norms: no division)
                   * exp(-(l(c) - l(r))^2 / (2 sigma^2))       l = number of bigrams
    CIDEr-D(c, R) = 10 * mean_{r in R} mean_{n=1..4} sim_n(c, r)

The document frequencies df count each n-gram once per image (the set of its training
captions' n-grams), over the training images, once (`CiderDReward.__init__`). A caption is a
row of token ids that ends at its first eos or pad; an n-gram is a run of ids, encoded as one
int64 `key = (((t1 * V) + t2) * V + t3) ...` (ids >= 1, so keys of different orders never
collide), and every sparse operation is a sort (torch.unique / searchsorted), no Python loop
over captions. The reward is float64 on the CPU.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from distinctcap.core.errors import DistinctcapError
from distinctcap.data.tokenizer import EOS, PAD

ORDERS = 4  # n = 1..4 (pycocoevalcap's n)
SIGMA = 6.0  # the length penalty's sigma (CIDEr-D, §3.4)


def token_lengths(ids: Tensor) -> Tensor:
    """Tokens of each row of ids (R, T) before its first eos or pad: (R,)."""
    is_tok = (ids != PAD) & (ids != EOS)
    return is_tok.long().cumprod(dim=1).sum(dim=1)


def ngram_keys(ids: Tensor, lengths: Tensor, base: int, orders: int = ORDERS, first: int = 1):
    """Every `first`..`orders`-gram of each row of ids (R, T) within its first `lengths`
    tokens: (row (E,), key (E,), order (E,) in 0..orders-1), one entry per occurrence."""
    rows, keys, order_of = [], [], []
    r, t = ids.shape
    key = torch.zeros(r, t, dtype=torch.long)
    for k in range(1, min(orders, t) + 1):
        key = key[:, : t - k + 1] * base + ids[:, k - 1 :]  # the k-gram starting at each position
        if k < first:
            continue
        valid = torch.arange(t - k + 1)[None, :] + k <= lengths[:, None]
        row, pos = valid.nonzero(as_tuple=True)
        rows.append(row)
        keys.append(key[row, pos])
        order_of.append(torch.full_like(row, k - 1))
    if not rows:
        empty = torch.zeros(0, dtype=torch.long)
        return empty, empty, empty
    return torch.cat(rows), torch.cat(keys), torch.cat(order_of)


class CiderDReward:
    """CIDEr-D of candidate captions against the references of their image.

    refs (C, T): the training captions' ids (eos / pad after the tokens), groups (C,): each
    caption's image (any int64 >= 0, e.g. its feature row); vocab_size V: ids are < V.
    `score(candidates, groups)` -> (N,) float64: candidate i against every reference of image
    groups[i]."""

    def __init__(self, refs: Tensor, groups: Tensor, vocab_size: int, sigma: float = SIGMA):
        if vocab_size**ORDERS >= 2**63:
            raise DistinctcapError(
                f"CIDEr-D reward: a vocabulary of {vocab_size} ids does not fit a 4-gram in int64"
            )
        refs, groups = refs.cpu().long(), groups.cpu().long()
        self.base, self.sigma = vocab_size, sigma
        order = torch.argsort(groups, stable=True)
        self.refs = refs[order]
        self.ref_lengths = token_lengths(self.refs)
        counts = torch.bincount(groups, minlength=int(groups.max()) + 1 if len(groups) else 0)
        self.ref_count = counts
        self.ref_start = torch.cumsum(counts, 0) - counts
        documents = int((counts > 0).sum())
        if documents < 2:
            raise DistinctcapError(
                f"CIDEr-D reward needs references of at least 2 images, got {documents}: "
                "with one document every n-gram has idf 0"
            )
        self.log_docs = math.log(documents)
        self.df_keys, self.df_counts = self._document_frequencies(groups[order])

    def _document_frequencies(self, groups: Tensor) -> tuple[Tensor, Tensor]:
        """Sorted n-gram keys and the number of images whose references hold each, one order
        at a time (keys of different orders are disjoint) to bound the memory."""
        keys, counts = [], []
        for k in range(ORDERS):
            row, key, _ = ngram_keys(self.refs, self.ref_lengths, self.base, k + 1, k + 1)
            grams, dense = torch.unique(key, return_inverse=True)
            pairs = torch.unique(groups[row] * len(grams) + dense)  # (image, gram) once each
            keys.append(grams)
            counts.append(torch.bincount(pairs % max(len(grams), 1), minlength=len(grams)))
        keys_all, counts_all = torch.cat(keys), torch.cat(counts)
        order = torch.argsort(keys_all)
        return keys_all[order], counts_all[order]

    def idf(self, keys: Tensor) -> Tensor:
        """log |D| - log max(1, df) of n-gram keys (G,), float64."""
        pos = torch.searchsorted(self.df_keys, keys).clamp(max=max(len(self.df_keys) - 1, 0))
        found = self.df_keys[pos] == keys if len(self.df_keys) else torch.zeros_like(keys).bool()
        df = torch.where(found, self.df_counts[pos], 0).clamp(min=1).double()
        return self.log_docs - torch.log(df)

    def vectors(self, ids: Tensor, lengths: Tensor):
        """tf-idf vectors of rows ids (R, T): entries (row, gram, weight, order) sorted by
        row * G + gram (gram: index into this call's G distinct n-grams), norms (R, 4) and
        bigram counts (R,)."""
        row, key, order = ngram_keys(ids, lengths, self.base)
        grams, dense = torch.unique(key, return_inverse=True)
        g = max(len(grams), 1)
        entry, tf = torch.unique(row * g + dense, return_counts=True)
        row_e, gram_e = entry // g, entry % g
        gram_order = torch.zeros(len(grams), dtype=torch.long).scatter_(0, dense, order)
        weight = tf.double() * self.idf(grams)[gram_e]
        order_e = gram_order[gram_e]
        norm = torch.zeros(len(ids) * ORDERS, dtype=torch.float64)
        norm.index_add_(0, row_e * ORDERS + order_e, weight * weight)
        bigrams = (lengths - 1).clamp(min=0)
        return (entry, row_e, gram_e, weight, order_e, g), norm.sqrt().view(-1, ORDERS), bigrams

    def score(self, candidates: Tensor, groups: Tensor) -> Tensor:
        """CIDEr-D of each candidate row (N, T) against the references of image groups[i]."""
        candidates, groups = candidates.cpu().long(), groups.cpu().long()
        if len(groups) and (
            int(groups.max()) >= len(self.ref_count) or bool((self.ref_count[groups] == 0).any())
        ):
            raise DistinctcapError("CIDEr-D reward: a candidate's image has no training reference")
        n = len(candidates)
        images, local = torch.unique(groups, return_inverse=True)
        ref_rows = _ranges(self.ref_start[images], self.ref_count[images])
        refs = self.refs[ref_rows]
        width = max(candidates.shape[1], refs.shape[1])
        ids = torch.cat([_pad(candidates, width), _pad(refs, width)])
        lengths = torch.cat([token_lengths(candidates), self.ref_lengths[ref_rows]])
        (entry, row, gram, weight, order, g), norm, bigrams = self.vectors(ids, lengths)
        # pairs: candidate i with each reference of its image (references in rows n.. of ids)
        count = self.ref_count[images][local]  # (N,)
        first_ref = n + (torch.cumsum(self.ref_count[images], 0) - self.ref_count[images])[local]
        pair_cand = torch.repeat_interleave(torch.arange(n), count)
        pair_ref = first_ref[pair_cand] + _offsets(count)
        pair_start = torch.cumsum(count, 0) - count
        # clipped overlap: each candidate gram looked up in each reference of its image
        is_cand = row < n
        c_row, c_gram, c_w, c_order = row[is_cand], gram[is_cand], weight[is_cand], order[is_cand]
        expand = torch.repeat_interleave(torch.arange(len(c_row)), count[c_row])
        j = _offsets(count[c_row])
        pair = pair_start[c_row[expand]] + j
        query = pair_ref[pair] * g + c_gram[expand]
        ref_entries = entry[~is_cand]
        ref_weight = weight[~is_cand]
        pos = torch.searchsorted(ref_entries, query).clamp(max=max(len(ref_entries) - 1, 0))
        hit = ref_entries[pos] == query if len(ref_entries) else torch.zeros_like(query).bool()
        w_ref = torch.where(hit, ref_weight[pos] if len(ref_weight) else 0.0, 0.0)
        w_cand = c_w[expand]
        val = torch.zeros(len(pair_cand) * ORDERS, dtype=torch.float64)
        val.index_add_(0, pair * ORDERS + c_order[expand], torch.minimum(w_cand, w_ref) * w_ref)
        val = val.view(-1, ORDERS)
        denom = norm[pair_cand] * norm[pair_ref]
        val = torch.where(denom != 0, val / torch.where(denom != 0, denom, 1.0), val)
        delta = (bigrams[pair_cand] - bigrams[pair_ref]).double()
        penalty = torch.exp(-(delta**2) / (2 * self.sigma**2))
        per_pair = 10.0 * (val * penalty[:, None]).mean(dim=1)
        total = torch.zeros(n, dtype=torch.float64).index_add_(0, pair_cand, per_pair)
        return total / count.double()


def _ranges(start: Tensor, count: Tensor) -> Tensor:
    """cat(arange(s, s + c) for s, c in zip(start, count))."""
    return torch.repeat_interleave(start, count) + _offsets(count)


def _offsets(count: Tensor) -> Tensor:
    """cat(arange(c) for c in count)."""
    total = int(count.sum())
    starts = torch.cumsum(count, 0) - count
    return torch.arange(total) - torch.repeat_interleave(starts, count)


def _pad(ids: Tensor, width: int) -> Tensor:
    return torch.nn.functional.pad(ids, (0, width - ids.shape[1]), value=PAD)
