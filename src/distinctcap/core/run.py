"""What the trainer is given: a run's effective config as one typed object (`RunConfig`), and
where its inputs are and its outputs go (`RunPaths`). The device comes beside them, as a
torch.device: none of the three is part of another (the fingerprint covers the first two's
content, never out_dir or the device; distinctcap.train.checkpoints).

Nothing here imports torch. It is in core/ because the objectives (methods/, below the trainer)
receive the RunConfig too (ARCHITECTURE.md, Layers).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from distinctcap.core.settings import TrainConfig

# A run's edges: the runs it reads (its init model, its teacher, its reference; config.rungraph)
RUN_EDGES = ("init", "teacher", "reference")
# Keys of an effective run config that are not its method's options
RUN_FIELDS = ("name", "method", "data", *RUN_EDGES, "seed", "captioner", "train")


@dataclass
class RunConfig:
    """A run's effective config (distinctcap.config.rungraph.effective_run_config), parsed once:
    its `runs:` block (method, data, init/teacher/reference, the method's `options`), `seed`,
    `captioner` (CaptionerConfig fields, or the transformers block) and `train`."""

    name: str = "run"
    method: str = "mle"
    data: str = "all"  # all | D- | D+
    init: str | None = None
    teacher: str | None = None
    reference: str | None = None
    options: dict = field(default_factory=dict)  # the method's options (methods.facts)
    seed: int = 0
    captioner: dict = field(default_factory=dict)
    train: TrainConfig = field(default_factory=TrainConfig)

    @classmethod
    def from_effective(cls, cfg: Mapping) -> RunConfig:
        """The typed run of an effective run config; keys other than RUN_FIELDS are options."""
        cfg = copy.deepcopy(dict(cfg))
        name = cfg.get("name", cls.name)
        train = TrainConfig.from_dict(cfg.pop("train", {}) or {}, where=f"runs.{name}.train")
        options = {k: cfg.pop(k) for k in list(cfg) if k not in RUN_FIELDS}
        return cls(**cfg, options=options, train=train)

    def effective(self) -> dict:
        """The effective run config this run was built from (summary.json, the fingerprint)."""
        edges = {e: getattr(self, e) for e in RUN_EDGES if getattr(self, e) is not None}
        return {
            "name": self.name,
            "method": self.method,
            "data": self.data,
            **edges,
            **copy.deepcopy(self.options),
            "seed": self.seed,
            "captioner": copy.deepcopy(self.captioner),
            "train": _plain(dataclasses.asdict(self.train)),
        }

    @property
    def pretrained(self) -> bool:
        """Whether the captioner is a pre-trained transformers model (captioner.kind)."""
        return self.captioner.get("kind", "native") == "transformers"


def _plain(train: dict) -> dict:
    """asdict's tuples as the lists a config holds (betas)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in train.items()}


@dataclass(frozen=True)
class RunPaths:
    """The train rule's inputs by name (a file, a folder or a list of files; a few entries name
    no file, e.g. clip_arch or a CLIP tag) and the run's output folder (None: write nothing)."""

    inputs: Mapping[str, str | list[str]] = field(default_factory=dict)
    out_dir: Path | None = None

    def to_json(self) -> dict:
        return {"inputs": dict(self.inputs), "out_dir": self.out_dir and str(self.out_dir)}

    @classmethod
    def from_json(cls, d: dict) -> RunPaths:
        return cls(d["inputs"], d["out_dir"] and Path(d["out_dir"]))
