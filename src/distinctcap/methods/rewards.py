"""Self-critical sequence training's pieces as pure functions (methods.scst): the baselines,
the REINFORCE loss and the CLIP rewards. The CIDEr-D reward is scores.cider.TokenCiderD.

Shapes: N = U * K sampled captions, K per image, image u's samples in rows u*K .. u*K + K - 1;
embeddings are L2-normalised rows.
"""

from __future__ import annotations

import torch
from torch import Tensor

from distinctcap.core.errors import DistinctcapError

CLIPSCORE_W = 2.5  # Hessel et al. 2021 eq. 1


def new_scst_advantages(rewards: Tensor) -> Tensor:
    """The "new SCST" baseline: each sample's reward minus the mean reward of its image's
    other K - 1 samples, rewards (U, K) -> (U, K) (ruotianluo/ImageCaptioning.pytorch,
    misc/rewards.py `get_self_critical_reward`, `new_self_critical`:
    baseline = (sum - r) / (K - 1))."""
    k = rewards.shape[1]
    if k < 2:
        raise DistinctcapError("the new SCST baseline needs k >= 2 samples per image")
    baseline = (rewards.sum(dim=1, keepdim=True) - rewards) / (k - 1)
    return rewards - baseline


def greedy_advantages(rewards: Tensor, greedy: Tensor) -> Tensor:
    """Rennie et al. 2017 eq. 9: r(w^s) - r(w^hat), the baseline being the reward of the
    image's greedy (test-time) caption: rewards (U, K), greedy (U,) -> (U, K)."""
    return rewards - greedy[:, None]


def reinforce_loss(logp: Tensor, mask: Tensor, advantages: Tensor) -> Tensor:
    """-sum_{n,t} A_n log p(w_t^n | w_<t^n, I) mask_{n,t} / sum mask (Rennie et al. 2017 eq. 9
    for the gradient; the mean over the batch's sampled tokens, eos included, as ruotianluo's
    `RewardCriterion`): logp, mask (N, T), advantages (N,) (no gradient) -> scalar."""
    mask = mask.to(logp.dtype)
    return -(advantages.detach().to(logp.dtype)[:, None] * logp * mask).sum() / mask.sum().clamp(
        min=1.0
    )


def retrieval_reward(text: Tensor, images: Tensor, image_of: Tensor, margin: float) -> Tensor:
    """Luo et al. 2018's discriminability reward r_D(c, I) = -L_CON(c, I) (eq. 3, §3.2): the
    hinge loss of the caption against the batch's other images and of its image against the
    batch's other images' captions, the hardest of each (VSE++'s max, as their code):
    L_CON = max_{c'} [m - s(I, c) + s(I, c')]_+ + max_{I'} [m - s(I, c) + s(I', c)]_+ with s
    the cosine. text (N, E), images (U, E), image_of (N,) in 0..U-1 -> (N,); 0 terms with no
    other image in the batch."""
    sim = text @ images.T  # (N, U): s(I_u, c_n)
    own = sim.gather(1, image_of[:, None])  # (N, 1)
    other_image = image_of[:, None] != torch.arange(len(images), device=text.device)[None, :]
    worst_image = sim.masked_fill(~other_image, float("-inf")).amax(dim=1)
    # s(I(c), c') for every other caption c' of another image: (N, N)
    cross = sim[:, image_of].T
    other_caption = image_of[:, None] != image_of[None, :]
    worst_caption = cross.masked_fill(~other_caption, float("-inf")).amax(dim=1)
    own = own.squeeze(1)
    loss = (margin - own + worst_caption).clamp(min=0) + (margin - own + worst_image).clamp(min=0)
    return -loss


def clipscore_reward(text: Tensor, images: Tensor, image_of: Tensor) -> Tensor:
    """CLIP-S(c, v) = w max(cos(c, v), 0), w = 2.5 (Hessel et al. 2021 eq. 1); text (N, E)
    encoded with the "A photo depicts" prefix, images (U, E), image_of (N,) -> (N,)."""
    return CLIPSCORE_W * (text * images[image_of]).sum(dim=1).clamp(min=0)
