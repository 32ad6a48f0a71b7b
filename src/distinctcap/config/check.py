"""Config validation: the schema with its defaults (distinctcap.core.validation), then what the
schema cannot express: the run graph (distinctcap.config.rungraph), outputs that two names
would share, and the checks that read other stages' facts.

`validate(config, schema)` fills defaults from the schema (`load_schema`) and raises one
DistinctcapError that names the key and what is allowed: a method registration missing a part
(its facts, objective or options schema; a plugin's included), a wrong type, an unknown key, an
unknown run method, an option of another method than the run's, a `train.select_metric` the
run's method cannot compute, a run naming a missing `init`/`teacher`/`reference`, a cycle
among runs, a run an overlay adds that `only_runs` drops, a number that is NaN or infinite, a
run or decoding name outside the schema's name rule, or two names whose outputs are one path.

What a method requires beyond its options (its edges, its option conflicts) is read from its
facts class (distinctcap.methods.facts). Nothing here imports torch: the workflow calls this
module while Snakemake parses it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

from distinctcap.config.rungraph import check_dropped_runs, check_runs, seeded_runs
from distinctcap.core.configfile import read_yaml
from distinctcap.core.errors import DistinctcapError
from distinctcap.core.hub import pretrained_type
from distinctcap.core.results import DECODING_OUTPUTS, RUN_OUTPUTS
from distinctcap.core.schema import SCHEMA_PATH
from distinctcap.core.schema import load_schema as merged_schema
from distinctcap.core.settings import JudgeSettings
from distinctcap.core.validation import schema_checked
from distinctcap.methods.facts import FACTS, check_registry
from distinctcap.train.select_metrics import all_select_metrics, select_metrics_of


def load_schema(path: str | os.PathLike = SCHEMA_PATH) -> dict:
    """The merged schema (distinctcap.core.schema), with the allowed `train.select_metric`
    names from the selection registry (distinctcap.train.select_metrics), their one owner."""
    schema = merged_schema(path)
    select = schema["properties"]["train"]["properties"]["select_metric"]
    select["enum"] = all_select_metrics()
    return schema


def load(config_path: str | os.PathLike, schema_path: str | os.PathLike) -> dict:
    return validate(read_yaml(config_path) or {}, load_schema(schema_path))


def validate(config: dict, schema: dict, sources: Sequence[tuple[str, dict]] = ()) -> dict:
    """Return a copy of `config` with defaults filled; raise DistinctcapError if it is invalid.
    `sources` are the (file name, content) pairs `config` was merged from, in order: a schema
    error then starts with the name of the last one that sets the key (`config_sources`)."""
    check_registry()
    config = schema_checked(config, schema, sources)
    check_runs(config.get("runs", {}))
    check_outputs({**config, "runs": seeded_runs(config)})
    check_values(config)
    check_dropped_runs(config, sources)
    return config


def check_outputs(config: dict) -> None:
    """No two configured names write one path, compared as a case-insensitive file system
    does (macOS, Windows): decodings `greedy` and `greedy-per_image` (whose metrics table is
    greedy's per-image table), or runs `A` and `a`."""
    owners: dict[str, tuple[str, str]] = {}
    for key, path in configured_outputs(config):
        first, first_path = owners.setdefault(path.casefold(), (key, path))
        if first != key:
            same = path if path == first_path else (
                f"{first_path} and {path}, one path on a case-insensitive file system "
                "(macOS, Windows)"
            )
            raise DistinctcapError(f"{first} and {key} both write {same}: rename one of them")


def configured_outputs(config: dict) -> Iterator[tuple[str, str]]:
    """(config key, path) of every output whose path a run or decoding name is part of
    (distinctcap.core.results)."""
    decoding = config.get("decoding", {})
    for run in config.get("runs", {}):
        for template in RUN_OUTPUTS:
            yield f"runs.{run}", template.format(run=run)
        for name, setting in decoding.items():
            for split in setting.get("splits", ()):
                for template in DECODING_OUTPUTS:
                    yield f"decoding.{name}", template.format(run=run, split=split, decoding=name)


def check_values(config: dict) -> None:
    """Checks the schema cannot express."""
    check_captioner(config.get("captioner", {}), config.get("runs", {}))
    check_data_source(config.get("data", {}))
    check_run_options(config.get("runs", {}))
    check_select_metrics(config)
    check_judge(config)
    fraction = config.get("entropy", {}).get("fraction")
    if fraction is not None and not 0 < fraction < 1:
        raise DistinctcapError(
            f"entropy.fraction = {fraction} leaves D- or D+ empty; choose 0 < fraction < 1"
        )


# data.source -> the keys of its block it cannot do without
SOURCE_KEYS = {"karpathy": ("file", "images"), "folder": ("images", "captions")}


def data_stage_params(data: dict) -> dict:
    """The data block as rule prepare_data's param: the shapes and coco blocks always (as before
    the file sources existed, so a finished experiment's data stays up to date), the block of a
    file source only when it is the one chosen."""
    return {k: v for k, v in data.items() if k not in SOURCE_KEYS or k == data["source"]}


def check_data_source(data: dict) -> None:
    """A file-based source names its files (the schema's defaults are null)."""
    source = data.get("source")
    for key in SOURCE_KEYS.get(source, ()):
        if not data.get(source, {}).get(key):
            raise DistinctcapError(
                f"data.{source}.{key} is required when data.source is {source}"
            )
    held_out = data.get("folder", {})
    if held_out.get("val_fraction", 0) + held_out.get("test_fraction", 0) >= 1:
        raise DistinctcapError(
            "data.folder.val_fraction + test_fraction leave no training images; keep the sum < 1"
        )


def check_run_options(runs: dict) -> None:
    """No run sets an option that its other options make meaningless (its method's facts say
    which: Objective.option_conflicts)."""
    for name, run in runs.items():
        facts = FACTS.get(run.get("method"))
        if facts:
            facts.refuse_conflicts(name, run)


def check_select_metrics(config: dict) -> None:
    """Each run selects on a metric its method computes (distinctcap.train.select_metrics):
    every method's, or its own `val_metrics` (SMILE's clip_self_retrieval, specificity's
    mean_rank); the schema's enum allows any method's."""
    top = config.get("train", {}).get("select_metric")
    for name, run in config.get("runs", {}).items():
        select = (run.get("train") or {}).get("select_metric", top)
        allowed = select_metrics_of(run.get("method"))
        if select is not None and select not in allowed:
            where = f"runs.{name}.train" if "select_metric" in (run.get("train") or {}) else "train"
            raise DistinctcapError(
                f"{where}.select_metric = {select!r}: run {name!r} (method "
                f"{run.get('method')!r}) can select on {', '.join(sorted(allowed))}"
            )


def check_judge(config: dict) -> None:
    """The judge is not the trainer's CLIP: another arch, other weights or (both trained here)
    another training seed than the top-level `seed` that train_clip uses."""
    judge = JudgeSettings.from_config(config)
    clip = config.get("clip", {})
    trainer = (clip.get("arch"), clip.get("pretrained"))
    if judge is None or (judge.arch, judge.pretrained) != trainer:
        return
    if not judge.trained or judge.seed == config.get("seed", 0):
        same = f"arch {judge.arch!r}, pretrained {judge.pretrained!r}"
        same += f", seed {judge.seed}" if judge.trained else ""
        fix = "arch, pretrained or seed" if judge.trained else "arch or pretrained"
        raise DistinctcapError(
            f"evaluate.judge: the judge is the trainer's CLIP ({same}); give it another {fix}"
        )


# Model types the transformers captioner backend supports (distinctcap.captioner.hf)
PRETRAINED_TYPES = ("blip",)
# Methods that need the native captioner: specificity's straight-through step feeds generated
# ids into CLIP's text tower, which needs the captioner to share CLIP's tokenizer
NATIVE_ONLY = ("specificity",)


def check_captioner(captioner: dict, runs: dict) -> None:
    """captioner.kind transformers: `pretrained` names a readable local folder, or a hub id
    that can be fetched (online) or is in the Hugging Face cache (offline), of a supported
    model type (distinctcap.core.hub.pretrained_type); no run uses a method that needs the
    native captioner."""
    if captioner.get("kind", "native") != "transformers":
        for key in ("pretrained", "vision"):
            if key in captioner:
                raise DistinctcapError(f"captioner.{key} is only read with kind: transformers")
        return
    source = captioner.get("pretrained")
    if not source:
        raise DistinctcapError(
            "captioner.pretrained is required with kind: transformers; give a hub id or a "
            "local save_pretrained folder"
        )
    model_type = pretrained_type(str(source))
    if model_type not in PRETRAINED_TYPES:
        raise DistinctcapError(
            f"captioner.pretrained = {source!r} is a {model_type!r} model; supported: "
            f"{', '.join(PRETRAINED_TYPES)}"
        )
    for name, run in runs.items():
        if run.get("method") in NATIVE_ONLY:
            raise DistinctcapError(
                f"runs.{name}.method = {run['method']!r} is not supported with captioner.kind "
                "transformers: its straight-through step needs a retrieval model that shares "
                "the captioner's tokenizer (CLIP shares the native one; BLIP's own image-text "
                "head is not wired in); use the native captioner or another method"
            )
