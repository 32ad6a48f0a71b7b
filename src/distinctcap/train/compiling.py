"""`train.compile`: torch.compile of a run's captioner and of the frozen models its method runs
in every step (a teacher, a reference), block by block and in place, or, where compiling
fails, one warning and the run trains uncompiled with the same weights.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from functools import partial

import torch

from distinctcap.captioner.model import Captioner, DecoderBlock, EncoderBlock
from distinctcap.features.batches import Batch, encode_batch

log = logging.getLogger(__name__)


def compile_wanted(setting: bool | str, device: torch.device) -> bool:
    """train.compile: true, false, or auto (on a GPU only)."""
    return device.type == "cuda" if setting == "auto" else bool(setting)


def compile_blocks(model: Captioner, probe: Callable[[], None], backend: str) -> str | None:
    """torch.compile each encoder and decoder block of `model` in place (the objectives call
    encode / decode / decode_step, which a wrapper of `forward` would bypass; in place, the
    state_dict keys stay). `probe()` runs one forward and backward so that a compiler failing
    only at its first call fails here. Returns None, or why compiling failed; then the blocks
    are left uncompiled."""
    blocks = [m for m in model.modules() if isinstance(m, EncoderBlock | DecoderBlock)]
    if not blocks:
        return "the captioner has no native blocks to compile (captioner.kind transformers)"
    # one block's code serves training, decoding with a cache, internals (UNKT) and the frozen
    # models, in several precisions: more variants than dynamo's default 8, after which it
    # would run the block uncompiled without a word
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    try:
        for block in blocks:
            block.compile(backend=backend)
        probe()
    except Exception as error:  # noqa: BLE001 - any compiler failure means: train uncompiled
        for block in blocks:
            block._compiled_call_impl = None
        lines = str(error).strip().splitlines()
        return f"{type(error).__name__}: {lines[0][:200] if lines else ''}"
    return None


def compile_run(
    model: Captioner,
    frozen: dict[str, Captioner],
    first_batch: Callable[[], Batch],
    autocast: Callable[[], object],
    device: torch.device,
) -> None:
    """Compile `model` (probed with a forward and backward of `first_batch()` under
    `autocast()`, the RNG and the gradients left as they were), then, if that worked, each of
    the `frozen` models (edge -> model). The backend is DISTINCTCAP_COMPILE_BACKEND's, else
    inductor."""
    backend = os.environ.get("DISTINCTCAP_COMPILE_BACKEND", "inductor")

    def probe() -> None:  # one forward/backward; the RNG and the gradients as before
        rng = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=rng, device_type=device.type):
            b = first_batch()
            model.train()
            with autocast():
                logits = model.decode(encode_batch(model, b), b.inputs)
            logits.float().sum().backward()
        model.zero_grad(set_to_none=True)

    why = compile_blocks(model, probe, backend)
    if why:
        msg = "train.compile: torch.compile (%s) failed, training uncompiled: %s"
        log.warning(msg, backend, why)
        return
    compile_frozen(frozen, first_batch, autocast, backend)
    log.info("train.compile: encoder and decoder blocks compiled (%s)", backend)


def compile_frozen(
    frozen: dict[str, Captioner],
    first_batch: Callable[[], Batch],
    autocast: Callable[[], object],
    backend: str,
) -> None:
    """The frozen teacher / reference compiled as the model (they run in every step); one
    that fails stays uncompiled, with a warning."""

    def probe(model: Captioner) -> None:  # a forward, as the objectives run it
        b = first_batch()
        with torch.no_grad(), autocast():
            model.decode(encode_batch(model, b), b.inputs)

    for edge, model in frozen.items():
        why = compile_blocks(model, partial(probe, model), backend)
        if why:
            log.warning("train.compile: the %s stays uncompiled: %s", edge, why)
