"""CLIP (Radford et al., 2021) through open_clip: loading, a tiny model for the shapes world,
contrastive training and retrieval recall.

- `load_clip(arch, pretrained, device, tag)` takes what open_clip takes: a known tag (`openai`,
  `laion2b_s34b_b79k`, ...), a local weights file, or `local-dir:DIR` (open_clip's folder
  schema: open_clip_config.json + weights); `tag` gives a file or folder that tag's settings.
  A tag is found where open_clip's download puts it (the hub cache; distinctcap.clip.weights);
  missing, unknown or unreadable weights stop with one line naming the key.
- Three tiny architectures for the shapes world (model_configs/ beside this file) are
  registered with open_clip on import, all with a text tower on CLIP's BPE vocabulary (49408)
  so captioner tokens map straight to its ids: `shapes-rn-tiny` (the default), open_clip's
  ModifiedResNet (CLIP's RN50 design) at 64 px and width 16, whose last feature map is a 2 x 2
  grid; `shapes-vit-tiny`, a 2-layer ViT in 8 px patches (an 8 x 8 grid); and
  `shapes-rn-judge`, shapes-rn-tiny at vision width 12, the shapes world's judge CLIP
  (evaluate.judge: a CLIP of another architecture and seed that only the evaluation reads).
  Trained contrastively on 2,000 images, the ViT learns colour but barely shape (a linear probe
  of its embedding predicts the shape of a lone object at chance); the ResNet's convolutions
  learn it.
- `train_clip` trains it contrastively (open_clip's ClipLoss, the symmetric InfoNCE of CLIP)
  and `save_weights` writes a state dict that `create_model_and_transforms(arch,
  pretrained=path)` loads, so the trained model goes through the same loading code as a
  pretrained one.
- Given a checkpoint path, `train_clip` writes its whole state there every
  `checkpoint_every` epochs and a rerun with the same fingerprint (arch, settings, seed, device,
  training data) resumes from it to bit-identical weights; a mismatched one is set aside.
- The one CLIP text encoding (`TextTower`): `encode_text` for token ids (features, evaluation,
  retrieval; bit for bit open_clip's `encode_text`) and `ClipTextEncoder` for the specificity
  objective's generated captions, whose one-hot tokens carry a straight-through gradient."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import open_clip
import torch
from PIL import Image
from safetensors import SafetensorError
from torchvision.transforms import Compose, Normalize, PILToTensor, ToTensor

from distinctcap.clip.weights import resolve_weights
from distinctcap.core.errors import DistinctcapError, first_line
from distinctcap.core.logs import progress, quiet_open_clip
from distinctcap.data.quality import decoding

log = logging.getLogger(__name__)


@dataclass
class LoadedClip:
    model: torch.nn.Module
    preprocess: Compose  # open_clip's eval transform, PIL -> normalised float tensor
    tokenizer: object  # open_clip tokenizer: list[str] -> LongTensor (B, context_length)
    arch: str
    pretrained: str
    weight_files: tuple[str, ...]
    tag: str | None = None  # clip.tag: the tag whose settings a file or folder was given

    @property
    def logit_scale(self) -> float:
        """CLIP's own softmax temperature exp(t) (UNKT eq. 3's default)."""
        return float(self.model.logit_scale.detach().exp())

    def preprocess_cfg(self) -> dict:
        cfg = open_clip.get_model_preprocess_cfg(self.model)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.items()}


def load_clip(
    arch: str, pretrained: str, device: str | torch.device = "cpu", tag: str | None = None
) -> LoadedClip:
    """A CLIP in eval mode on `device`, from a tag, a weights file or local-dir:DIR (with
    `tag`'s settings, if given)."""
    source = resolve_weights(arch, pretrained, tag)
    kwargs = {k: v for k, v in source.kwargs.items() if v is not None}
    try:
        with quiet_open_clip():
            model, _, preprocess = open_clip.create_model_and_transforms(
                source.model_name, pretrained=source.checkpoint, device=device, **kwargs
            )
    except (RuntimeError, ValueError, OSError, SafetensorError) as error:
        raise DistinctcapError(
            f"clip.pretrained = {pretrained!r}: open_clip could not build {arch} from "
            f"{', '.join(source.files) or source.model_name}: {first_line(error)}"
        ) from error
    with quiet_open_clip():
        tokenizer = open_clip.get_tokenizer(source.model_name)
    return LoadedClip(model.eval(), preprocess, tokenizer, arch, pretrained, source.files, tag)


def byte_transform(preprocess: Compose) -> tuple[Compose, torch.Tensor, torch.Tensor]:
    """Split open_clip's eval transform into PIL -> uint8 tensor (resize, crop, RGB) and the
    mean/std of its final normalisation, applied on the device by `normalize`: workers then ship
    bytes, and the result equals ToTensor + Normalize."""
    steps = list(preprocess.transforms)
    if (
        len(steps) < 2
        or not isinstance(steps[-2], ToTensor)
        or not isinstance(steps[-1], Normalize)
    ):
        raise DistinctcapError(f"unexpected open_clip transform (no ToTensor+Normalize): {steps}")
    mean = torch.tensor(steps[-1].mean, dtype=torch.float32).view(1, -1, 1, 1)
    std = torch.tensor(steps[-1].std, dtype=torch.float32).view(1, -1, 1, 1)
    return Compose([*steps[:-2], PILToTensor()]), mean, std


def normalize(batch: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """uint8 (B, 3, H, W) -> float32, scaled to [0, 1] and normalised as CLIP expects."""
    mean, std = mean.to(batch.device), std.to(batch.device)
    return (batch.float().div_(255) - mean).div_(std)


def load_images(files: Sequence[str], transform: Compose) -> torch.Tensor:
    """Every image through `transform` (PIL -> uint8), stacked: (N, 3, H, W)."""
    out = []
    for file in progress(files, desc="load images", unit="images"):
        with decoding(file), Image.open(file) as image:
            out.append(transform(image))
    return torch.stack(out)
