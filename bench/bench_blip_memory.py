"""Memory and time of one training step of BLIP-base (BlipForConditionalGeneration at the
hub checkpoint's configuration, random weights: nothing is downloaded) at COCO settings.

    python bench/bench_blip_memory.py [--batch 32] [--steps 5] [--device cuda]

Two settings, as the transformers backend offers them:
  frozen   the vision tower frozen; its last hidden states (577 x 768 at 384 px) are the
           cached grid, so a step runs the text decoder only
  e2e      end to end from 384 px images (vision tower trained too)
It prints, per setting: parameters trained, peak GPU memory (torch.cuda.max_memory_allocated)
and seconds per step (median of --steps after one warm-up), bf16 autocast, AdamW.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import BlipConfig, BlipForConditionalGeneration


def blip_base() -> BlipForConditionalGeneration:
    # Salesforce/blip-image-captioning-base: ViT-B/16 at 384 px, BERT-base text decoder
    config = BlipConfig(
        vision_config={"image_size": 384, "patch_size": 16, "hidden_size": 768,
                       "num_hidden_layers": 12, "num_attention_heads": 12,
                       "intermediate_size": 3072},
        text_config={"vocab_size": 30524, "hidden_size": 768, "num_hidden_layers": 12,
                     "num_attention_heads": 12, "intermediate_size": 3072,
                     "encoder_hidden_size": 768},
    )
    return BlipForConditionalGeneration(config)


def step_fn(model, batch: int, length: int, device, frozen: bool):
    images = torch.randn(batch, 3, 384, 384, device=device)
    ids = torch.randint(1000, 30000, (batch, length), device=device)
    if frozen:
        with torch.no_grad():
            grid = model.vision_model(pixel_values=images).last_hidden_state  # the cached grid
        grid = grid.detach()

    def step(opt):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            if frozen:
                out = model.text_decoder(input_ids=ids, encoder_hidden_states=grid,
                                         labels=ids, reduction="mean")
            else:
                out = model(pixel_values=images, input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def measure(setting: str, batch: int, steps: int, device) -> str:
    torch.manual_seed(0)
    model = blip_base().to(device).train()
    frozen = setting == "frozen"
    if frozen:
        model.vision_model.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5, fused=device.type == "cuda")
    step = step_fn(model, batch, 24, device, frozen)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        step(opt)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
    n = sum(p.numel() for p in params) / 1e6
    del model, opt
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return (f"{setting:<7} batch {batch}: {n:.0f} M parameters trained, peak GPU memory "
            f"{peak:.1f} GiB, {statistics.median(times[1:]):.3f} s/step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    for setting in ("frozen", "e2e"):
        print(measure(setting, args.batch, args.steps, device), flush=True)


if __name__ == "__main__":
    main()
