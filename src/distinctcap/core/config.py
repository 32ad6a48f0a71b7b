"""Config validation: JSON schema with defaults, then the run graph (ARCHITECTURE.md, "Runs are
data"), and each run's effective config.

`validate(config, schema)` fills defaults from the schema (distinctcap.core.schema.load_schema)
and raises one DistinctcapError that names the key and what is allowed: a wrong type, an unknown
key, an unknown run method, an option of another method than the run's, a run naming a missing
`init`/`teacher`/`reference`, a cycle among runs, a number that is NaN or infinite, a run or
decoding name outside the schema's name rule, or two names whose outputs are one path.
`read_yaml` reads a config file, naming the line of a YAML syntax error.
`effective_run_config(config, name, schema)` is what determines one run's result.

The schema owns every default and allowed value, the methods' options included
(workflow/schemas/methods/). TrainConfig and EvalSettings take their defaults from it. What a
method requires beyond its options (its edges, its option conflicts) is read from its facts
class (distinctcap.methods.facts). Nothing here imports torch: the workflow calls this module
while Snakemake parses it.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import json
import math
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

import jsonschema
import yaml

from distinctcap.core.errors import DistinctcapError
from distinctcap.core.schema import SCHEMA_PATH, repo_schema, schema_default
from distinctcap.core.schema import load_schema as merged_schema
from distinctcap.methods.facts import FACTS
from distinctcap.train.select_metrics import all_select_metrics, select_metrics_of

RUN_EDGES = ("init", "teacher", "reference")
# what the schema's definitions/name (config.schema.yaml) allows, in words
NAME_RULE = "a letter or digit, then letters, digits, '_' and '-' (at most 64 characters)"
# the outputs named by a run and a decoding (decode.smk, evaluate.smk); check_outputs refuses
# two configured names whose outputs are one path
RUN_OUTPUTS = ("results/runs/{run}", "results/generated/{run}", "results/metrics/{run}")
DECODING_OUTPUTS = (
    "results/generated/{run}/{split}-{decoding}.parquet",
    "results/metrics/{run}/{split}-{decoding}.parquet",
    "results/metrics/{run}/{split}-{decoding}-cider_vs_n.csv",
    "results/metrics/{run}/{split}-{decoding}-per_image.parquet",
)
REQUIRED_EDGES = {method: facts.edges for method, facts in FACTS.items()}


def _fill_defaults(validator_class):
    """A validator that sets each missing property's schema default before validating it."""
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if "default" in sub and name not in instance:
                    instance[name] = copy.deepcopy(sub["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


DefaultFilling = _fill_defaults(jsonschema.Draft7Validator)


def load_schema(path: str | os.PathLike = SCHEMA_PATH) -> dict:
    """The merged schema (distinctcap.core.schema), with the allowed `train.select_metric`
    names from the selection registry (distinctcap.train.select_metrics), their one owner."""
    schema = merged_schema(path)
    select = schema["properties"]["train"]["properties"]["select_metric"]
    select["enum"] = all_select_metrics()
    return schema


def validate(config: dict, schema: dict, sources: Sequence[tuple[str, dict]] = ()) -> dict:
    """Return a copy of `config` with defaults filled; raise DistinctcapError if it is invalid.
    `sources` are the (file name, content) pairs `config` was merged from, in order: a schema
    error then starts with the name of the last one that sets the key (`config_sources`)."""
    config = copy.deepcopy(config)
    errors = sorted(DefaultFilling(schema).iter_errors(config), key=_error_depth)
    if errors:
        origin = key_origin(error_key(errors[0]), sources)
        raise DistinctcapError((f"{origin}: " if origin else "") + describe(errors[0]))
    check_finite(config)
    check_runs(config.get("runs", {}))
    check_outputs({**config, "runs": seeded_runs(config)})
    check_values(config)
    return config


def check_finite(value: object, key: str = "") -> None:
    """Every number in the config is finite: YAML's .nan and .inf pass the schema's bounds
    (NaN compares false with all of them) and would fail a job later, naming no key."""
    if isinstance(value, dict):
        for name, item in value.items():
            check_finite(item, f"{key}.{name}" if key else str(name))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_finite(item, f"{key}[{i}]")
    elif isinstance(value, float) and not math.isfinite(value):
        raise DistinctcapError(f"{key} = {value!r} is not a finite number; give a number")


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
    """(config key, path) of every output whose path a run or decoding name is part of."""
    decoding = config.get("decoding", {})
    for run in config.get("runs", {}):
        for template in RUN_OUTPUTS:
            yield f"runs.{run}", template.format(run=run)
        for name, setting in decoding.items():
            for split in setting.get("splits", ()):
                for template in DECODING_OUTPUTS:
                    yield f"decoding.{name}", template.format(run=run, split=split, decoding=name)


def config_sources(
    paths: Sequence[str | os.PathLike], overrides: dict | None = None, repo: Path | None = None
) -> list[tuple[str, dict]]:
    """(name, content) of each config file in merge order (named by `shown_path` against
    `repo`), then Snakemake's --config overrides, for `validate` to name where a key came from."""
    repo = (repo or Path.cwd()).absolute()
    sources = [(shown_path(path, repo), read_yaml(path) or {}) for path in paths]
    return sources + ([("--config", dict(overrides))] if overrides else [])


def shown_path(path: str | os.PathLike, repo: Path) -> str:
    """A config file as errors, make and the experiment record name it: relative to the
    repository (`repo`, absolute) when under it, else absolute."""
    path = Path(path).absolute()
    return str(path.relative_to(repo)) if path.is_relative_to(repo) else str(path)


def key_origin(key: list[str], sources: Sequence[tuple[str, dict]]) -> str | None:
    """The name of the last source that sets `key` (a path of keys), or None."""
    return next((name for name, content in reversed(sources) if _sets(content, key)), None)


def _sets(content: object, key: list[str]) -> bool:
    for part in key:
        if not isinstance(content, dict) or part not in content:
            return False
        content = content[part]
    return bool(key)


def error_key(error: jsonschema.ValidationError) -> list[str]:
    """The key path an error is about: the unknown key itself for additionalProperties."""
    path = [str(p) for p in error.absolute_path]
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = error.schema.get("properties", {})
        extra = sorted(set(error.instance) - set(allowed))
        return path + extra[:1]
    return path


def _error_depth(error: jsonschema.ValidationError) -> tuple:
    """Deepest key first; an empty section (e.g. no runs yet) only when nothing else is wrong."""
    return (error.validator == "minProperties", -len(error.absolute_path), str(error.absolute_path))


def describe(error: jsonschema.ValidationError) -> str:
    """One line: the key's dotted path, what is wrong and what is allowed."""
    key = ".".join(str(p) for p in error.absolute_path) or "<top level>"
    schema = error.schema
    if error.validator == "additionalProperties":
        allowed = sorted(schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed))
        in_run = len(error.absolute_path) == 2 and error.absolute_path[0] == "runs"
        foreign = _foreign_option(key, extra[0], error.instance) if in_run else None
        return foreign or _unknown_key(key if error.absolute_path else "", extra, allowed)
    if error.validator == "enum":
        return f"{key} = {error.instance!r} is not allowed; choose one of {schema['enum']}"
    if error.validator == "type":
        return f"{key} = {error.instance!r} has the wrong type; expected {schema['type']}"
    if "propertyNames" in error.schema_path:
        return (
            f"{key}: name {error.instance!r} is not allowed; names are used in file and folder "
            f"names, so use {NAME_RULE}"
        )
    if error.validator == "minProperties" and not error.instance:
        return f"{key} is empty; define at least one entry"
    if error.validator in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        return f"{key} = {error.instance!r}: {error.message}"
    return f"{key}: {error.message}"


def _unknown_key(where: str, extra: list[str], allowed: list[str]) -> str:
    prefix = f"{where}." if where else ""
    suggestion = did_you_mean(extra[0], allowed)
    return f"unknown key {prefix}{extra[0]}; {suggestion}allowed keys here: {', '.join(allowed)}"


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """"did you mean X? " for the closest of `choices` to a misspelt `word`, else ""."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1)
    return f"did you mean {close[0]}? " if close else ""


def _foreign_option(where: str, key: str, run: dict) -> str | None:
    """Run block `where` sets `key`, an option of other methods than its own: name them."""
    owners = [method for method, facts in FACTS.items() if key in facts.options]
    if not owners:
        return None
    method = run["method"]
    own = ", ".join(sorted(FACTS[method].options)) or "none"
    name = where.removeprefix("runs.")
    return (
        f"{where}.{key} is an option of {' / '.join(owners)} runs; run {name!r} has method "
        f"{method!r}, whose options are: {own}"
    )


def check_runs(runs: dict) -> None:
    """Every init/teacher/reference names a defined run, and the runs form no cycle."""
    for name, run in runs.items():
        for edge in REQUIRED_EDGES.get(run.get("method"), ()):
            if not run.get(edge):
                raise DistinctcapError(
                    f"runs.{name}.{edge} is required for method {run['method']!r}: "
                    f"name one of the runs {', '.join(sorted(runs))}"
                )
        for edge in RUN_EDGES:
            target = run.get(edge)
            if target is not None and target not in runs:
                raise DistinctcapError(
                    f"runs.{name}.{edge} = {target!r} names no run; defined runs: "
                    f"{', '.join(sorted(runs))}"
                )
    for name in runs:
        cycle = _find_cycle(runs, name, [])
        if cycle:
            raise DistinctcapError(f"runs form a cycle: {' -> '.join(cycle)}")


def _find_cycle(runs: dict, name: str, path: list[str]) -> list[str] | None:
    if name in path:
        return path[path.index(name):] + [name]
    for target in run_dependencies(runs[name]):
        cycle = _find_cycle(runs, target, path + [name])
        if cycle:
            return cycle
    return None


def run_dependencies(run: dict) -> Iterator[str]:
    """The runs this run needs trained first (its DAG edges)."""
    for edge in RUN_EDGES:
        if run.get(edge):
            yield run[edge]


# ---------------------------------------------------------------------------------------------
# Seeds: one run trained once per seed (issue 34; docs/seeds.md)


@dataclass(frozen=True)
class SeedRun:
    """One trained model of a configured run: the run (`arm`), its seed and its run block (the
    arm's, with `seeds` dropped, `seed` where it differs from the top-level one, and each
    init / teacher / reference naming the parent's model of the same seed)."""

    arm: str
    seed: int
    block: dict


def seed_name(run: str, seed: int, seeds: list[int]) -> str:
    """The model name (its folder under results/runs/) of `run`'s seed `seed`: the run's own
    name for its first seed, so one seed keeps today's paths, else <run>_s<seed>."""
    return run if seed == seeds[0] else f"{run}_s{seed}"


def run_seeds(config: dict) -> tuple[dict[str, list[int]], set[str]]:
    """(seeds of each run, the runs trained over a `seeds` list). A run's seeds: its `seeds`,
    else its own `seed` (one, pinned), else the top-level `seeds`, else the top-level `seed`.
    A run over a `seeds` list makes its parents train for those seeds too (transitively); a
    run without one keeps its edges as written (its parents' first seed)."""
    runs = config.get("runs", {})
    top = config.get("seeds")
    seeds, listed = {}, set()
    for name, run in runs.items():
        if "seed" in run and "seeds" in run:
            raise DistinctcapError(f"runs.{name}: give seed or seeds, not both")
        own = run.get("seeds") or ([run["seed"]] if "seed" in run else top)
        seeds[name] = list(own or [config.get("seed", 0)])
        if run.get("seeds") or ("seed" not in run and top):
            listed.add(name)
    for name in _children_first(runs):
        for parent in (run_dependencies(runs[name]) if name in listed else ()):
            _add_parent_seeds(runs, seeds, parent, name)
            if "seed" not in runs[parent]:
                listed.add(parent)
    return seeds, listed


def _add_parent_seeds(runs: dict, seeds: dict, parent: str, child: str) -> None:
    missing = [s for s in seeds[child] if s not in seeds[parent]]
    if missing and "seed" in runs[parent]:
        raise DistinctcapError(
            f"runs.{parent}.seed = {runs[parent]['seed']} pins one seed, but run {child!r} "
            f"reads it over seeds {seeds[child]}: give runs.{parent} `seeds` instead"
        )
    seeds[parent] += missing


def _children_first(runs: dict) -> list[str]:
    """Run names ordered so that every run comes before the runs it reads."""
    order: list[str] = []

    def visit(name: str) -> None:
        if name not in order:
            for parent in run_dependencies(runs[name]):
                visit(parent)
            order.append(name)

    for name in runs:
        visit(name)
    return order[::-1]


def seed_runs(config: dict) -> dict[str, SeedRun]:
    """Every trained model of a validated config by its name (`seed_name`): one per run and
    seed. With one seed per run (the default) the names and blocks are the config's own."""
    runs = config.get("runs", {})
    seeds, listed = run_seeds(config)
    out: dict[str, SeedRun] = {}
    for arm, run in runs.items():
        for seed in seeds[arm]:
            name = seed_name(arm, seed, seeds[arm])
            if name in out or (name != arm and name in runs):
                raise DistinctcapError(
                    f"runs.{arm} over seeds {seeds[arm]} trains a model named {name!r}, "
                    "which is also a run of the config: rename one of them"
                )
            block = {k: copy.deepcopy(v) for k, v in run.items() if k != "seeds"}
            if "seed" not in run and seed != config.get("seed", 0):
                block["seed"] = seed
            for edge in RUN_EDGES if arm in listed else ():
                if block.get(edge):
                    block[edge] = seed_name(block[edge], seed, seeds[block[edge]])
            out[name] = SeedRun(arm, seed, block)
    return out


def seeded_runs(config: dict) -> dict[str, dict]:
    """name -> run block of every trained model (`seed_runs`): the DAG's runs."""
    return {name: run.block for name, run in seed_runs(config).items()}


def selected_runs(config: dict) -> dict:
    """The `runs` this config builds: those named in `only_runs` and the runs they depend on
    (init, teacher, reference), in config order; every run when `only_runs` is empty."""
    runs, wanted = config.get("runs", {}), list(config.get("only_runs") or [])
    unknown = [name for name in wanted if name not in runs]
    if unknown:
        raise DistinctcapError(
            f"only_runs: {', '.join(unknown)} names no run; defined runs: {', '.join(sorted(runs))}"
        )
    if not wanted:
        return runs
    keep: set[str] = set()
    while wanted:
        name = wanted.pop()
        if name not in keep:
            keep.add(name)
            wanted.extend(run_dependencies(runs[name]))
    return {name: block for name, block in runs.items() if name in keep}


def run_priorities(run_configs: dict[str, dict]) -> dict[str, int]:
    """Scheduling priority of each run's training job (effective configs by name): its
    estimated work (steps x its method's step cost against an MLE step, `step_cost`) plus the
    largest priority among the runs that wait for it, so the head of the longest chain of
    training starts first: on 2 cores the negative teacher, which UNKT waits for, before the
    positive one, which nothing waits for, and CL (300 steps, ~6 MLE steps each) before the
    positive teacher (1,500 MLE steps; issue 46: by steps alone CL went after it and ended
    the default's training 2.5 minutes later)."""
    waiting = {n: [m for m, r in run_configs.items() if n in run_dependencies(r)]
               for n in run_configs}  # fmt: skip
    done: dict[str, int] = {}

    def chain(name: str) -> int:
        if name not in done:
            run = run_configs[name]
            work = TrainConfig.from_dict(run["train"]).steps * step_cost(run)
            done[name] = round(work) + max((chain(m) for m in waiting[name]), default=0)
        return done[name]

    return {name: chain(name) for name in run_configs}


def step_cost(run: dict) -> float:
    """Run block `run`'s optimiser step against an MLE step (its method's facts; a run
    without a known method counts as MLE)."""
    facts = FACTS.get(run.get("method", "mle"))
    return facts.step_cost(run) if facts else 1.0


def entropy_priority(run_configs: dict[str, dict], priorities: dict[str, int]) -> int:
    """Scheduling priority of the entropy rules: above every run trained on D- or D+, whose
    chain they head (without it, on 2 cores, the fine-tunes of the reference ran before the
    entropy split and the teachers and UNKT started 8 minutes late); 0 when no run needs them."""
    split_runs = [n for n, r in run_configs.items() if r.get("data") in ("D-", "D+")]
    return max((priorities[n] + 1 for n in split_runs), default=0)


def check_values(config: dict) -> None:
    """Checks the schema cannot express."""
    check_captioner(config.get("captioner", {}), config.get("runs", {}))
    check_data_source(config.get("data", {}))
    check_run_options(config.get("runs", {}))
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
        for key, why in (facts.option_conflicts(run) if facts else {}).items():
            raise DistinctcapError(f"runs.{name}.{key} = {run.get(key)!r}: {why}")


# Model types the transformers captioner backend supports (distinctcap.captioner.hf)
PRETRAINED_TYPES = ("blip",)
# Methods that need the native captioner: specificity's straight-through step feeds generated
# ids into CLIP's text tower, which needs the captioner to share CLIP's tokenizer
NATIVE_ONLY = ("specificity",)


def check_captioner(captioner: dict, runs: dict) -> None:
    """captioner.kind transformers: `pretrained` names a readable local folder, or a hub id
    that can be fetched (online) or is in the Hugging Face cache (offline), of a supported
    model type; no run uses a method that needs the native captioner."""
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
    model_type = _pretrained_type(str(source))
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


def _pretrained_type(source: str) -> str:
    """model_type of `source`'s config.json: a local folder, or a hub id (its cached copy when
    offline). Raises a DistinctcapError saying what was tried."""
    key = f"captioner.pretrained = {source!r}"
    path = Path(source).expanduser()
    looks_local = path.is_absolute() or source.startswith((".", "~")) or source.count("/") > 1
    if path.exists() or looks_local:
        config = path / "config.json"
        if not config.is_file():
            what = "no config.json in that folder" if path.is_dir() else "no such folder"
            raise DistinctcapError(f"{key}: tried the local folder {path}: {what}")
        return _read_model_type(config, key)
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(source, "config.json")  # no network: every parse runs this
    if isinstance(cached, str):
        return _read_model_type(Path(cached), key)
    if _offline():
        raise DistinctcapError(
            f"{key}: no local folder of that name, and as a hub id it is not in the "
            "Hugging Face cache while HF_HUB_OFFLINE is set; download it with internet "
            "access (unset HF_HUB_OFFLINE) or point at a local folder"
        )
    return _hub_model_type(source, key)


def _offline() -> bool:
    truthy = ("1", "on", "yes", "true")
    return any(os.environ.get(v, "").lower() in truthy
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _read_model_type(config: Path, key: str) -> str:
    try:
        return str(json.loads(config.read_text()).get("model_type"))
    except (OSError, ValueError) as error:
        raise DistinctcapError(f"{key}: cannot read {config} ({error})") from error


def _hub_model_type(source: str, key: str) -> str:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return _read_model_type(Path(hf_hub_download(source, "config.json")), key)
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as error:
        raise DistinctcapError(
            f"{key}: no local folder of that name, and the hub gave no config.json for it "
            f"({type(error).__name__})"
        ) from error


# ---------------------------------------------------------------------------------------------
# The `train` section

def steps_per_epoch(n_captions: int, batch_size: int, grad_accum: int = 1) -> float:
    """Optimiser steps per pass over `n_captions` training captions, as the trainer counts them
    (features/batches.py BatchOrder drops the last incomplete micro-batch; grad_accum micro-batches
    a step). Epoch-stated schedules (train.epochs, warmup_epochs, unkt warmup_epochs) use it."""
    batch_size = max(1, min(int(batch_size), n_captions))
    return (n_captions // batch_size) / int(grad_accum)


def from_schema(*keys: str):
    """A dataclass field whose default is the repository schema's default of the key at `keys`
    (a fresh copy per instance for a list)."""
    value = schema_default(*keys)
    if isinstance(value, list | dict):
        return field(default_factory=functools.partial(copy.deepcopy, value))
    return field(default=value)


@dataclass
class TrainConfig:
    """The `train` config section: its keys' meaning, defaults and allowed values are the
    schema's (workflow/schemas/sections/train.yaml), which every instance is checked against."""

    steps: int = from_schema("train", "steps")
    epochs: float | None = from_schema("train", "epochs")
    batch_size: int = from_schema("train", "batch_size")
    grad_accum: int = from_schema("train", "grad_accum")
    group_by_image: bool = from_schema("train", "group_by_image")
    lr: float = from_schema("train", "lr")
    warmup_steps: int = from_schema("train", "warmup_steps")
    warmup_epochs: float | None = from_schema("train", "warmup_epochs")
    schedule: str = from_schema("train", "schedule")
    final_lr_ratio: float = from_schema("train", "final_lr_ratio")
    weight_decay: float = from_schema("train", "weight_decay")
    betas: tuple[float, float] = from_schema("train", "betas")
    grad_clip: float = from_schema("train", "grad_clip")
    precision: str = from_schema("train", "precision")
    val_every: int = from_schema("train", "val_every")
    val_captions: int = from_schema("train", "val_captions")
    val_batch_size: int = from_schema("train", "val_batch_size")
    select_metric: str = from_schema("train", "select_metric")
    patience: int = from_schema("train", "patience")
    checkpoint_every: int = from_schema("train", "checkpoint_every")
    checkpoint_minutes: float | None = from_schema("train", "checkpoint_minutes")
    log_every: int = from_schema("train", "log_every")
    compile: bool | str = from_schema("train", "compile")  # true | false | "auto"

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)
        # select_metric is checked against the run's method (effective_run_config), whose
        # objective may compute metrics of its own
        values = {**vars(self), "betas": list(self.betas)}
        del values["select_metric"]
        _check_section(values, repo_schema(), ["train"])

    def in_steps(self, n_captions: int) -> TrainConfig:
        """This config with `epochs` / `warmup_epochs` turned into optimiser steps for a run on
        `n_captions` training captions (`steps_per_epoch`); steps at least 1, epochs then None."""
        per_epoch = steps_per_epoch(n_captions, self.batch_size, self.grad_accum)
        steps = self.steps if self.epochs is None else max(1, round(self.epochs * per_epoch))
        warmup = self.warmup_steps
        if self.warmup_epochs is not None:
            warmup = round(self.warmup_epochs * per_epoch)
        return dataclasses.replace(
            self, steps=steps, warmup_steps=warmup, epochs=None, warmup_epochs=None
        )

    @classmethod
    def from_dict(cls, d: dict, where: str = "train") -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise DistinctcapError(_unknown_key(where, unknown, sorted(known)))
        return cls(**d)


# ---------------------------------------------------------------------------------------------
# Config of a run


def effective_run_config(config: dict, name: str, schema: dict | None = None) -> dict:
    """The config that determines run `name`'s result: its block from `runs:` with `train`
    merged over the top-level `train` defaults, plus `seed` (the block's own, else the
    top-level one) and `captioner`. Snakemake passes
    it as a rule param, so editing it reruns exactly this run and the runs that depend on it.
    With the merged config `schema`, the run's `train` overrides are checked against the
    `train` section (unknown keys, wrong types) with a DistinctcapError naming the key."""
    if name not in config.get("runs", {}):
        raise DistinctcapError(
            f"no run named {name!r}; defined runs: {', '.join(sorted(config.get('runs', {})))}"
        )
    block = config["runs"][name]
    overrides = block.get("train", {}) or {}
    train = {**config.get("train", {}), **overrides}
    if schema is not None:
        _check_section(train, schema, ["runs", name, "train"])
        _check_run_block(block, schema, name)
    select = TrainConfig.from_dict(train, where=f"runs.{name}.train").select_metric
    allowed = select_metrics_of(block.get("method"))
    if select not in allowed:
        raise DistinctcapError(
            f"runs.{name}.train.select_metric = {select!r}: method {block.get('method')!r} "
            f"selects on one of {sorted(allowed)}"
        )
    run = {k: copy.deepcopy(v) for k, v in block.items() if k != "train"}
    return {
        "name": name,
        **run,
        "seed": block.get("seed", config.get("seed", 0)),
        "captioner": copy.deepcopy(config.get("captioner", {})),
        "train": train,
    }


def _check_run_block(block: dict, schema: dict, name: str) -> None:
    """The run block holds only keys of every run and its own method's options (a block
    edited after `validate`: an option of another method would be silently ignored)."""
    _check_against(block, schema["properties"]["runs"]["additionalProperties"], schema,
                   ["runs", name])  # fmt: skip


def _check_section(values: dict, schema: dict, path: list[str]) -> None:
    """Validate `values` against the section of `schema` at `path` (run blocks use the
    top-level section of their last key), with the error naming the full dotted key."""
    _check_against(values, schema["properties"][path[-1]], schema, path)


def _check_against(values: dict, part: dict, schema: dict, path: list[str]) -> None:
    """Validate `values` against `part` of `schema`, the error naming the dotted key from
    `path` on."""
    part = {**part, "definitions": schema.get("definitions", {})}
    errors = sorted(jsonschema.Draft7Validator(part).iter_errors(values), key=str)
    if errors:
        errors[0].path.extendleft(reversed(path))
        raise DistinctcapError(describe(errors[0]))


def load(config_path: str | os.PathLike, schema_path: str | os.PathLike) -> dict:
    return validate(read_yaml(config_path) or {}, load_schema(schema_path))


def read_yaml(path: str | os.PathLike) -> object:
    """A config or preset file; a YAML syntax error is one line naming the file, line and
    column (Snakemake's own message names neither: "Config file is not valid JSON or YAML")."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise DistinctcapError(f"cannot read the config file {path}: {error}") from error
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as error:
        raise DistinctcapError(f"{path}{_yaml_error_text(error)}") from error
    except yaml.YAMLError as error:
        raise DistinctcapError(f"{path}: not valid YAML: {error}") from error


def _yaml_error_text(error: yaml.MarkedYAMLError) -> str:
    """", line L, column C: not valid YAML: <problem> (<context> at line L', column C')"."""

    def at(mark) -> str:
        return f"line {mark.line + 1}, column {mark.column + 1}"

    mark = error.problem_mark or error.context_mark
    text = f", {at(mark)}" if mark else ""
    text += f": not valid YAML: {error.problem or error.context}"
    if error.context and error.problem and error.context_mark:
        text += f" ({error.context} at {at(error.context_mark)})"
    return text


def read_configs(paths: list[str | os.PathLike]) -> dict:
    """The config files merged as Snakemake merges --configfile: later files override earlier
    ones key by key, sections merged recursively."""
    config: dict = {}
    for path in paths:
        content = read_yaml(path) or {}
        if not isinstance(content, dict):
            raise DistinctcapError(f"{path}: a config file holds keys at its top level")
        config = merge_configs(config, content)
    return config


def merge_configs(base: dict, extra: dict) -> dict:
    """`extra` over `base`, key by key, nested blocks merged (a new dict; neither changes)."""
    out = dict(base)
    for key, value in extra.items():
        both = isinstance(value, dict) and isinstance(base.get(key), dict)
        out[key] = merge_configs(base[key], value) if both else value
    return out


# ---------------------------------------------------------------------------------------------
# The evaluate section


@dataclass
class EvalSettings:
    """The metric keys of the `evaluate:` config block, with the schema's defaults
    (workflow/schemas/sections/evaluate.yaml), plus the config's seed and the device."""

    oracle_ns: list[int] = from_schema("evaluate", "oracle_ns")
    curve_ns: list[int] = from_schema("evaluate", "curve_ns")
    best_of: int = from_schema("evaluate", "best_of")
    consensus_neighbours: int = from_schema("evaluate", "consensus_neighbours")
    retrieval_ks: list[int] = from_schema("evaluate", "retrieval_ks")
    hard_pool: int = from_schema("evaluate", "hard_pool")
    gpt2_path: str | None = from_schema("evaluate", "gpt2_path")
    spice: bool = from_schema("evaluate", "spice")
    meteor_memory: str = from_schema("evaluate", "meteor_memory")
    self_retrieval_pool: int = from_schema("evaluate", "self_retrieval_pool")
    self_retrieval_ks: list[int] = from_schema("evaluate", "self_retrieval_ks")
    self_retrieval_of_samples: bool = from_schema("evaluate", "self_retrieval_of_samples")
    seed: int = from_schema("seed")
    batch_size: int = from_schema("evaluate", "batch_size")
    judge: dict | None = from_schema("evaluate", "judge")  # JudgeSettings.from_config reads it
    device: str = "cpu"  # a resolved device (the config's `device` may say auto)

    @classmethod
    def from_config(cls, block: dict, **extra: object) -> EvalSettings:
        """Settings from a config block; keys other than the fields (gallery, ...) are ignored."""
        return cls(**metric_block({**block, **extra}))


def metric_block(block: dict) -> dict:
    """The keys of an `evaluate:` block the metrics depend on (not the gallery's), so that
    editing a report-only key does not rerun every evaluation."""
    names = {f.name for f in fields(EvalSettings)}
    return {k: v for k, v in block.items() if k in names}


# ---------------------------------------------------------------------------------------------
# The judge CLIP (evaluate.judge; docs/report.md, "The judge CLIP")


@dataclass(frozen=True)
class JudgeSettings:
    """evaluate.judge, filled with the schema's defaults: a CLIP of its own that only the
    evaluation reads (its judge_* columns), never a training rule, a checkpoint selection or an
    objective. `train` holds clip.train's keys (train.clip.TrainSettings), for pretrained =
    train, as the trainer CLIP's do."""

    arch: str
    pretrained: str = "train"
    tag: str | None = None
    seed: int = 1
    train: dict = field(default_factory=dict)

    @property
    def trained(self) -> bool:
        """Does the pipeline train it (rule train_judge_clip)?"""
        return self.pretrained == "train"

    @classmethod
    def from_config(cls, config: dict) -> JudgeSettings | None:
        """The judge of a validated config; None when evaluate.judge is null or absent."""
        block = (config.get("evaluate") or {}).get("judge")
        return cls(**block) if block else None


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
