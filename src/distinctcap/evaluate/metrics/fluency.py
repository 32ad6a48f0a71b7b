"""Fluency: GPT-2 perplexity of the generated captions (SMILE §4 "PPL").

No weights can be downloaded here, so the model must be a local directory (a
`save_pretrained` GPT-2, e.g. a copy of `gpt2` made elsewhere); otherwise the metric is NaN
with the reason in `skipped`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from distinctcap.core import work
from distinctcap.scores.result import MetricResult


def gpt2_perplexity(
    texts: Sequence[str],
    model_path: str | os.PathLike | None,
    *,
    batch_size: int = 32,
    device: str = "cpu",
    load: Callable[[str | os.PathLike, str], tuple] | None = None,
) -> MetricResult:
    """Token-level corpus perplexity exp(Σ NLL / Σ tokens) of `texts` under a causal LM.

    Each caption is scored on its own, prefixed with the model's BOS token (<|endoftext|> for
    GPT-2) so that its first word is predicted too; the BOS itself is not counted. Returns
    {"ppl": value}, or NaN with a reason when `model_path` is not an existing directory or
    transformers is missing. `load` (path, device) -> (tokenizer, model): `load_gpt2`, or an
    evaluate job's memoised one (evaluate.loaded.JobLoads.gpt2).
    """
    out = MetricResult()
    if model_path is None or not Path(model_path).is_dir():
        return out.skip(
            "ppl", f"no local GPT-2 directory at {model_path!r} (nothing is downloaded)"
        )
    if not texts:
        return out.skip("ppl", "no captions to score")
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as err:
        return out.skip("ppl", f"GPT-2 perplexity needs torch and transformers: {err}")
    tokenizer, model = (load or load_gpt2)(model_path, device)
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else bos
    work.count("gpt2_scored", len(texts))
    nll, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(texts), batch_size):
            ids = [[bos, *tokenizer(t)["input_ids"]] for t in texts[start : start + batch_size]]
            width = max(len(x) for x in ids)
            inputs = torch.tensor([x + [pad] * (width - len(x)) for x in ids], device=device)
            mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids], device=device)
            logits = model(input_ids=inputs, attention_mask=mask).logits  # (B, N, V)
            logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
            token_logp = logp.gather(-1, inputs[:, 1:, None]).squeeze(-1)  # (B, N-1)
            nll -= float((token_logp * mask[:, 1:]).sum())
            count += int(mask[:, 1:].sum())
    if count == 0:
        return out.skip("ppl", "the captions hold no tokens")
    out.values["ppl"] = math.exp(nll / count)
    return out


def load_gpt2(model_path: str | os.PathLike, device: str = "cpu") -> tuple:
    """(tokenizer, causal LM in eval mode on `device`) of a local `save_pretrained` directory."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    return tokenizer, AutoModelForCausalLM.from_pretrained(model_path).to(device).eval()
