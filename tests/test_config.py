"""Config errors stop before any job runs, with one clear message naming the key; the methods'
facts, which the config checks read, have one home and agree with the schema."""

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, snakemake

from distinctcap.config.check import load_schema, validate
from distinctcap.config.priorities import entropy_priority, run_priorities
from distinctcap.config.rungraph import effective_run_config
from distinctcap.core.configfile import merge_configs, read_configs
from distinctcap.core.errors import DistinctcapError
from distinctcap.core.settings import TrainConfig

SCHEMA = load_schema(ROOT / "workflow" / "schemas" / "config.schema.yaml")
RUNS = {
    "reference": {"method": "mle"},
    "teacher_neg": {"method": "mle", "data": "D-"},
    "unkt": {"method": "unkt", "teacher": "teacher_neg"},
}


def error_of(config: dict) -> str:
    with pytest.raises(DistinctcapError) as info:
        validate(config, SCHEMA)
    return str(info.value)


def test_defaults_are_filled_from_the_schema():
    config = validate({"runs": RUNS}, SCHEMA)
    assert config["data"]["source"] == "shapes"
    assert config["data"]["shapes"]["n_train"] == 2000
    assert config["on_bad_input"] == "skip"


def test_valid_runs_pass_and_get_defaults():
    config = validate({"runs": RUNS}, SCHEMA)
    assert config["runs"]["reference"]["data"] == "all"


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"data": {"shapes": {"n_train": "x"}}}, "data.shapes.n_train = 'x' has the wrong type"),
        ({"data": {"shapes": {"n_trian": 5}}},
         "unknown key data.shapes.n_trian; did you mean n_train? allowed keys"),
        ({"colour": 1}, "unknown key colour; allowed keys here: "),
        ({"device": "gpu"}, "device = 'gpu' is not allowed; choose one of ['auto', 'cuda', 'cpu']"),
        ({"runs": {"x": {"method": "rl"}}}, "runs.x.method = 'rl' is not allowed; choose one of"),
        ({"runs": {"x": {"method": "mle", "init": "y"}}}, "runs.x.init = 'y' names no run"),
        ({"runs": {"u": {"method": "unkt"}}}, "runs.u.teacher is required for method 'unkt'"),
        (
            {"runs": {"a": {"method": "smile", "init": "b"},
                      "b": {"method": "smile", "init": "a"}}},
            "runs form a cycle: a -> b -> a",
        ),
        ({"runs": {"..": {"method": "mle"}}}, "runs: name '..' is not allowed; names are used"),
        ({"runs": {"a/b": {"method": "mle"}}}, "runs: name 'a/b' is not allowed"),
        ({"runs": {}}, "runs is empty; define at least one entry"),
        (
            {"runs": {**RUNS, "u": {"method": "unkt", "teacher": "teacher_neg",
                                    "targets": "hard", "top_k": 5}}},
            "runs.u.top_k = 5: keeps the teacher's top k of the soft targets of eq. 5, but this "
            "run has targets: hard",
        ),
        ({"runs": {**RUNS, "u": {"method": "unkt", "teacher": "teacher_neg", "top_k": 0}}},
         "runs.u.top_k = 0: 0 is less than the minimum of 1"),
        (
            {"runs": {**RUNS, "u": {"method": "unkt", "teacher": "teacher_neg",
                                    "token_reduction": "max"}}},
            "runs.u.token_reduction = 'max' is not allowed; choose one of ['mean', 'sum']",
        ),
        ({}, "runs is empty; define at least one entry"),
        (
            {"runs": {"m": {"method": "mle", "lambda_value": 0.3}}},
            "runs.m.lambda_value is an option of unkt runs; run 'm' has method 'mle', whose "
            "options are: none",
        ),
        (  # at its default too: the run's method never reads it
            {"runs": {**RUNS, "u": {"method": "unkt", "teacher": "teacher_neg",
                                    "mle_weight": 0.0}}},
            "runs.u.mle_weight is an option of smile / specificity runs; run 'u' has method "
            "'unkt', whose options are: attention, exclude_gold, ",
        ),
        (
            {"runs": {"r": {"method": "mle"}, "c": {"method": "cl", "init": "r",
                                                    "reference": "r", "negativs": 3}}},
            "unknown key runs.c.negativs; did you mean negatives? allowed keys here: constraints, "
            "data, init, method, "
            "negatives, nu, nu_in_sigmoid, reference, replace_reference_every, seed, seeds, "
            "teacher, train",
        ),
        ({"runs": {"x": {"data": "D-"}}}, "runs.x: 'method' is a required property"),
    ],
)
def test_config_errors_name_the_key(config, expected):
    assert expected in error_of(config)


# The bad-input probe's configs (issue 28), as a user writes them in YAML
PROBE_CONFIGS = [
    (  # a decoding name that climbs out of the experiment folder
        'decoding: {"x/../../../../ESCAPED": {kind: greedy}}',
        "decoding: name 'x/../../../../ESCAPED' is not allowed; names are used in file and "
        "folder names, so use a letter or digit, then letters, digits, '_' and '-'",
    ),
    (  # greedy's per-image table is the metrics table of a decoding named greedy-per_image
        "decoding: {greedy: {kind: greedy}, greedy-per_image: {kind: greedy}}",
        "decoding.greedy and decoding.greedy-per_image both write "
        "results/metrics/reference/test-greedy-per_image.parquet: rename one of them",
    ),
    (
        "runs: {Reference: {method: mle}}",
        "runs.reference and runs.Reference both write results/runs/reference and "
        "results/runs/Reference, "
        "one path on a case-insensitive file system",
    ),
    ("runs: {-x: {method: mle}}", "runs: name '-x' is not allowed"),
    ("train: {lr: .nan}", "train.lr = nan is not a finite number"),
    ("train: {lr: .inf}", "train.lr = inf is not a finite number"),
    ("train: {epochs: .inf}", "train.epochs = inf is not a finite number"),
    ("runs: {reference: {train: {betas: [0.9, .nan]}}}",
     "runs.reference.train.betas[1] = nan is not a finite number"),
    ("evaluate: {}\nentropy: {logit_scale: .inf}", "entropy.logit_scale = inf is not a finite"),
]


@pytest.mark.parametrize(("text", "expected"), PROBE_CONFIGS)
def test_the_probes_bad_names_and_numbers_stop_with_the_key(text, expected):
    import yaml

    config = merge_configs({"runs": {"reference": {"method": "mle"}}}, yaml.safe_load(text))
    assert expected in error_of(config)


def test_bad_config_stops_snakemake_before_any_job(workdir):
    result = snakemake(workdir, "--config", "device=gpu")
    assert result.returncode != 0
    assert "distinctcap: config error: --config: device = 'gpu' is not allowed" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert not (workdir / "results").exists()


def test_workflow_lints_clean(workdir):
    result = snakemake(workdir, "--lint")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Congratulations" in result.stdout + result.stderr


# Not here: the blip presets, on a hub model (tests/test_hf_captioner.py), and try.yaml, whose
# run is the example plugin's (tests/test_plugins.py checks it with the plugin installed)
@pytest.mark.parametrize(
    "files",
    [["config.yaml"], ["config.coco.yaml"], ["tests/tiny_config.yaml"],
     *[["config.yaml", str(p.relative_to(ROOT))] for p in sorted(ROOT.glob("presets/*.yaml"))
       if "blip" not in p.name and p.name != "try.yaml"]],
)
def test_shipped_configs_and_presets_validate(files):
    import yaml

    config: dict = {}
    for name in files:  # later files override earlier ones, key by key, like --configfile
        config = merge_configs(config, yaml.safe_load((ROOT / name).read_text()))
    validated = validate(config, SCHEMA)
    assert validated["runs"], files



@pytest.mark.parametrize("presets", [[], ["presets/quick.yaml"]])
def test_every_run_of_the_default_checkpoints_every_few_minutes(presets):
    """Issue 48 item 7: make quick's SMILE trains 150 steps, fewer than checkpoint_every's 250,
    so an interrupted SMILE restarted at step 0. Every run of the default and of make quick
    writes its resume checkpoint at least every 5 minutes of training, whatever its steps."""
    config = validate(read_configs([ROOT / "config.yaml", *(ROOT / p for p in presets)]), SCHEMA)
    for name in config["runs"]:
        train = TrainConfig.from_dict(effective_run_config(config, name)["train"])
        assert train.checkpoint_minutes and train.checkpoint_minutes <= 5, (name, train)


def test_a_run_gets_the_defaults_of_its_own_method_only():
    config = validate({"runs": {**RUNS, "c": {"method": "cl", "init": "reference",
                                              "reference": "reference", "nu": 2.0}}}, SCHEMA)
    runs = config["runs"]
    assert set(runs["reference"]) == {"method", "data", "train"}
    assert runs["c"] == {"method": "cl", "init": "reference", "reference": "reference", "nu": 2.0,
                         "data": "all", "train": {}, "negatives": 5, "nu_in_sigmoid": True,
                         "constraints": "both", "replace_reference_every": 0}  # fmt: skip
    assert list(runs["unkt"])[-5:] == [  # the schema's order: new options appended
        "token_reduction", "top_k", "negative_captions", "negative_decoding", "negative_samples"
    ]


# --- One owner per fact: the schema for keys, defaults and allowed values -------------------


def test_the_train_and_evaluate_settings_are_the_schemas_keys_with_its_defaults():
    from distinctcap.core.settings import EvalSettings, JudgeSettings, TrainConfig, metric_block

    train = SCHEMA["properties"]["train"]["properties"]
    defaults = {f.name: getattr(TrainConfig(), f.name) for f in dataclasses.fields(TrainConfig)}
    assert list(defaults) == list(train)
    assert defaults == {**{k: v["default"] for k, v in train.items()}, "betas": (0.9, 0.98)}
    evaluate = SCHEMA["properties"]["evaluate"]["properties"]
    settings = dataclasses.asdict(EvalSettings())
    # the report's keys are not metric settings; the judge's are JudgeSettings
    metric_keys = [k for k in evaluate if not k.startswith("gallery_") and k != "judge"]
    assert sorted(settings) == sorted([*metric_keys, "seed", "device"])
    assert all(settings[k] == evaluate[k]["default"] for k in metric_keys)
    judge = {k: v for k, v in evaluate["judge"]["properties"].items() if "default" in v}
    assert {k: getattr(JudgeSettings("a"), k) for k in judge} == {
        k: v["default"] for k, v in judge.items()
    }
    block = {"judge": {"arch": "a"}, "gallery_images": 3, "spice": True}
    assert metric_block(block) == {"judge": {"arch": "a"}, "spice": True}  # the judge's columns
    assert EvalSettings().oracle_ns is not EvalSettings().oracle_ns  # a list per instance


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"schedule": "step"}, "train.schedule = 'step' is not allowed; choose one of "
                               "['linear', 'cosine', 'constant']"),
        ({"precision": "fp8"}, "train.precision = 'fp8' is not allowed; choose one of "
                               "['auto', 'fp32', 'bf16', 'fp16']"),
        ({"steps": 0}, "train.steps = 0: 0 is less than the minimum of 1"),
        ({"betas": (0.9, 1.0)}, "train.betas.1 = 1.0: 1.0 is greater than or equal to"),
    ],
)
def test_train_config_is_checked_against_the_schema(values, expected):
    from distinctcap.core.settings import TrainConfig

    with pytest.raises(DistinctcapError) as info:
        TrainConfig(**values)
    assert expected in str(info.value)


def test_each_method_has_a_schema_of_its_options_with_defaults_and_descriptions():
    """workflow/schemas/methods/<method>.yaml per method of the facts: the run block's `method`
    enum, and each option described, typed and with a default, which the facts read."""
    from distinctcap.methods.facts import FACTS

    methods = sorted(p.stem for p in (ROOT / "workflow" / "schemas" / "methods").glob("*.yaml"))
    block = SCHEMA["properties"]["runs"]["additionalProperties"]
    assert sorted(FACTS) == methods == sorted(block["properties"]["method"]["enum"])
    for branch in block["allOf"]:
        method = branch["if"]["properties"]["method"]["const"]
        options = {k: v for k, v in branch["then"]["properties"].items()
                   if k not in block["properties"]}  # fmt: skip
        assert list(options) == list(FACTS[method].options), method
        for option, schema in options.items():
            assert {"default", "description"} <= set(schema), f"{method} {option}"
            assert {"type", "enum"} & set(schema), f"{method} {option}"
            assert FACTS[method].options[option] == schema["default"]


def test_an_installed_package_finds_its_schema(tmp_path):
    """The schema ships as package data: a non-editable install, away from the repository,
    validates a config with its own copy; workflow/schemas links to the package's folder."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source)
    shutil.copytree(ROOT / "src", source / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))  # fmt: skip
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-build-isolation", "--no-index", "--target", str(site), str(source)],
                   check=True, capture_output=True)  # fmt: skip
    code = (
        "import distinctcap.core.schema as s; from distinctcap.config.check import "
        "load_schema, validate; print(s.SCHEMA_PATH); "
        "print(validate({'runs': {'r': {'method': 'mle'}}}, load_schema())['train']['steps'])"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(site)})  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    path, steps = done.stdout.split()
    assert Path(path).is_relative_to(site)
    assert int(steps) == SCHEMA["properties"]["train"]["properties"]["steps"]["default"]
    schemas = ROOT / "src" / "distinctcap" / "schemas"
    assert (ROOT / "workflow" / "schemas").resolve() == schemas.resolve()


# --- One home per method: its facts class (distinctcap.methods.facts) ----------------------


def test_each_method_declares_its_facts_once():
    """The trainable class of a method subclasses its facts class and repeats none of them."""
    from distinctcap.methods import METHODS
    from distinctcap.methods.facts import FACTS
    from distinctcap.methods.unkt import UNKTConfig

    facts_names = (
        "edges", "needs", "options", "mean_over", "val_metrics", "extra_inputs",
        "option_conflicts", "objective_class",
    )
    assert list(METHODS) == list(FACTS)  # derived from the one registry, in its order
    for method, cls in METHODS.items():
        assert issubclass(cls, FACTS[method]), method
        assert FACTS[method].objective_class == f"{cls.__module__}:{cls.__name__}"
        assert not set(facts_names) & set(vars(cls)), f"{method} redeclares a fact"
        facts = FACTS[method]
        assert set(facts.needs) <= set(facts.edges) <= {"init", "teacher", "reference"}
        assert facts.mean_over in ("tokens", "captions")
        assert set(facts.val_metrics.values()) <= {"min", "max"}
    assert [f.name for f in dataclasses.fields(UNKTConfig)] == list(FACTS["unkt"].options)


def test_the_method_facts_name_the_extra_inputs_of_a_run():
    from distinctcap.methods.facts import FACTS

    assert FACTS["unkt"].extra_inputs({"targets": "soft"}) == {}
    assert FACTS["unkt"].extra_inputs({"targets": "random"}) == {"d_minus": "D-"}
    spec = FACTS["specificity"]
    assert spec.extra_inputs({"loss": "cos"}) == {"clip": None}
    assert spec.extra_inputs({"loss": "ccos", "contrastive_top_pct": 5}) == {
        "clip": None,
        "neighbours": 5,
    }
    assert spec.extra_inputs({}) == {"clip": None, "neighbours": 1}  # the defaults


def test_parsing_the_workflow_imports_no_torch():
    """Every package module a rule file imports runs while Snakemake parses the DAG (every
    `snakemake` call, every job): none of them may load torch, matplotlib or open_clip."""
    modules = sorted(
        {m for f in (ROOT / "workflow" / "rules").glob("*.smk")
         for m in re.findall(r"^from (distinctcap[\w.]*) import", f.read_text(), re.M)}
    )
    assert "distinctcap.config.check" in modules
    code = (
        f"import sys, {', '.join(modules)}; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'matplotlib', "
        "'open_clip'}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert done.stdout.strip() == "[]", (modules, done.stdout)


# --- Schedules in epochs and the COCO preset ------------------------------------------------

COCO_TRAIN_CAPTIONS = 591_753  # mrnn train split: 118,287 images (issue 17's count)


def _coco_run(name: str) -> dict:
    import yaml

    from distinctcap.config.rungraph import effective_run_config

    config = validate(yaml.safe_load((ROOT / "config.coco.yaml").read_text()), SCHEMA)
    return effective_run_config(config, name, SCHEMA)


def test_epochs_become_steps_with_the_trainers_epoch_length():
    from distinctcap.core.settings import TrainConfig

    tc = TrainConfig(epochs=2.5, warmup_epochs=0.5, batch_size=8, grad_accum=2).in_steps(40)
    assert (tc.steps, tc.warmup_steps, tc.epochs) == (6, 1, None)  # 40 // 8 / 2 = 2.5 a step
    assert TrainConfig(steps=7).in_steps(40).steps == 7  # no epochs: steps as given
    with pytest.raises(DistinctcapError, match="train.epochs = 0"):
        TrainConfig(epochs=0)


def test_coco_unkt_lambda_warmup_ends_before_the_decay_has_half_the_run_left():
    """UNKT §4.1: lambda rises over 5 epochs, then eq. 10 decays it; the run must leave the
    decay at least half of its steps (at 60,000 steps the warm-up took 59,175)."""
    from distinctcap.core.settings import TrainConfig, steps_per_epoch

    run = _coco_run("unkt")
    tc = TrainConfig.from_dict(run["train"]).in_steps(COCO_TRAIN_CAPTIONS)
    per_epoch = steps_per_epoch(COCO_TRAIN_CAPTIONS, tc.batch_size, tc.grad_accum)
    lambda_warmup = round(run["warmup_epochs"] * per_epoch)
    assert run["warmup_epochs"] == 5 and run["temperature"] == 1.0
    assert lambda_warmup <= tc.steps / 2, (lambda_warmup, tc.steps)
    assert (tc.lr, tc.warmup_steps) == (3e-4, 3000)  # UNKT §4.1
    assert tc.warmup_steps < lambda_warmup


def test_coco_preset_follows_the_papers_where_they_give_values():
    unkt = _coco_run("unkt")
    assert {k: unkt["captioner"][k] for k in ("width", "enc_layers", "dec_layers", "heads")} == {
        "width": 512, "enc_layers": 6, "dec_layers": 6, "heads": 8
    }
    assert (unkt["captioner"]["ffn"], unkt["captioner"]["dropout"]) == (2048, 0.1)
    cl = _coco_run("cl")["train"]  # CL §5.2: Adam, fixed lr 1e-6
    assert (cl["lr"], cl["schedule"], cl["warmup_steps"], cl["weight_decay"]) == (
        1e-6, "constant", 0, 0.0
    )
    assert cl["select_metric"] == "cider"
    smile = _coco_run("smile")["train"]  # SMILE §3.3: self-retrieval, within 3 epochs
    assert (smile["epochs"], smile["select_metric"]) == (3, "clip_self_retrieval")
    spec = _coco_run("specificity")["train"]  # specificity §4
    assert (spec["batch_size"], spec["steps"], spec["epochs"]) == (2, 190000, None)
    assert spec["lr"] == 1e-6
    assert spec["select_metric"] == "mean_rank" and spec["group_by_image"] is False


def test_coco_scst_follows_ruotianluos_new_scst_transformer_schedule():
    """Issue 49: ruotianluo/ImageCaptioning.pytorch configs/transformer/transformer_nscl.yml
    from the 15-epoch MLE reference: 25 epochs (structure_after 15 to max_epochs 40) of Adam at
    a constant 5e-6, 5 samples an image, the new-SCST baseline, CIDEr-D alone, 10 images x 5
    captions a batch, validated every 3000 iterations on CIDEr-D. His epoch over the images
    (10 a batch) is ours over the captions (50 a batch): 25 x 11,835 steps."""
    from distinctcap.core.settings import TrainConfig

    run = _coco_run("scst")
    assert (run["method"], run["init"], run["k"], run["baseline"]) == (
        "scst", "reference", 5, "new"
    )
    assert run["rewards"] == {"cider": 1.0, "retrieval": 0.0, "clipscore": 0.0}
    assert _coco_run("reference")["train"]["epochs"] == 15  # his MLE epochs before SCST
    train = run["train"]
    assert (train["lr"], train["schedule"], train["warmup_steps"], train["weight_decay"]) == (
        5e-6, "constant", 0, 0.0
    )
    assert (train["betas"], train["batch_size"], train["group_by_image"]) == (
        [0.9, 0.999], 50, True
    )
    assert (train["val_every"], train["select_metric"]) == (3000, "cider")
    tc = TrainConfig.from_dict(train).in_steps(COCO_TRAIN_CAPTIONS)
    assert (tc.steps, tc.warmup_steps) == (25 * 11_835, 0)


@pytest.mark.parametrize(
    "new",
    [
        {"token_reduction": "mean", "top_k": None},  # issue 17
        {"negative_captions": "gold", "negative_decoding": "greedy", "negative_samples": 1},
    ],
)
def test_new_unkt_option_defaults_leave_the_default_runs_as_they_were(new):
    """New unkt options default to the behaviour before them: each run of config.yaml has the
    effective config it had without them in the schema, plus the keys at their defaults in
    unkt runs."""
    import copy

    import yaml

    from distinctcap.config.rungraph import effective_run_config

    before = copy.deepcopy(SCHEMA)
    branches = before["properties"]["runs"]["additionalProperties"]["allOf"]
    unkt = next(b for b in branches if b["if"]["properties"]["method"]["const"] == "unkt")
    for key in new:
        del unkt["then"]["properties"][key]
    raw = yaml.safe_load((ROOT / "config.yaml").read_text())
    now_cfg, before_cfg = validate(raw, SCHEMA), validate(raw, before)
    assert any(r["method"] == "unkt" for r in now_cfg["runs"].values())
    for name, run in now_cfg["runs"].items():
        now = effective_run_config(now_cfg, name, SCHEMA)
        was = effective_run_config(before_cfg, name, before)
        assert now == ({**was, **new} if run["method"] == "unkt" else was), name


def test_a_run_may_have_its_own_seed():
    """runs.<name>.seed overrides the top-level seed for that run only (repeats over seeds);
    a run without one keeps the top-level seed, so its effective config is unchanged."""
    from distinctcap.config.rungraph import effective_run_config

    config = validate(
        {"seed": 7, "runs": {"a": {"method": "mle"}, "b": {"method": "mle", "seed": 2}}}, SCHEMA
    )
    assert effective_run_config(config, "a", SCHEMA)["seed"] == 7
    assert effective_run_config(config, "b", SCHEMA)["seed"] == 2
    assert "seed" not in config["runs"]["a"]  # no default filled: other runs' params unchanged
    with pytest.raises(DistinctcapError, match="seed"):
        validate({"runs": {"c": {"method": "mle", "seed": "one"}}}, SCHEMA)


def test_select_metric_must_be_one_the_runs_method_computes():
    """check-config refuses it (issue 57: it passed, and the job failed), naming what the
    method can select on; a block edited after validation is refused by the run's config."""
    from distinctcap.config.rungraph import effective_run_config

    runs = {"r": {"method": "mle", "train": {"select_metric": "mean_rank"}}}
    assert error_of({"runs": runs}) == (
        "runs.r.train.select_metric = 'mean_rank': run 'r' (method 'mle') can select on "
        "cider, oracle_cider, sample_cider, self_retrieval, val_loss"
    )
    assert error_of({"runs": {"r": {"method": "mle"}}, "train": {"select_metric": "mean_rank"}})\
        .startswith("train.select_metric = 'mean_rank': run 'r' (method 'mle')")
    config = validate({"runs": {"r": {"method": "mle"}}}, SCHEMA)
    config["runs"]["r"]["train"] = {"select_metric": "mean_rank"}
    with pytest.raises(DistinctcapError, match=r"runs.r.train.select_metric = 'mean_rank'"):
        effective_run_config(config, "r")


def test_select_metric_names_have_one_owner():
    """The schema's enum of train.select_metric is filled from distinctcap.train.select_metrics
    (every method's metrics and each method's own), not written in the YAML."""
    import yaml

    from distinctcap.methods.facts import FACTS
    from distinctcap.train.select_metrics import SELECT_METRICS

    enum = SCHEMA["properties"]["train"]["properties"]["select_metric"]["enum"]
    assert set(enum) == set(SELECT_METRICS).union(*(f.val_metrics for f in FACTS.values()))
    written = yaml.safe_load((ROOT / "workflow/schemas/sections/train.yaml").read_text())
    assert "enum" not in written["properties"]["select_metric"]
    assert error_of({"runs": RUNS, "train": {"select_metric": "bleu"}}).startswith(
        "train.select_metric = 'bleu' is not allowed; choose one of"
    )


def test_the_head_of_the_longest_training_chain_gets_the_highest_priority():
    """Two cores: the negative teacher (UNKT waits for it) starts before the positive one, and
    CL (300 steps of ~6 MLE steps) before the positive teacher (1,500 MLE steps)."""
    def run(method, steps, **edges):
        return {"method": method, "train": {"steps": steps}, **edges}

    runs = {
        "reference": run("mle", 1500, data="all"),
        "teacher_neg": run("mle", 1500, data="D-"),
        "teacher_pos": run("mle", 1500, data="D+"),
        "unkt": run("unkt", 1500, data="all", teacher="teacher_neg"),
        "cl": run("cl", 300, data="all", init="reference", reference="reference"),
        "smile": run("smile", 300, data="all", init="reference"),
        "cl_k1": run("cl", 300, negatives=1, init="reference", reference="reference"),
    }
    priorities = run_priorities(runs)
    # work: steps x step cost (UNKT 1.5, CL 1 + K negatives), plus the chain waiting for it
    assert priorities == {"reference": 1500 + 1800, "teacher_neg": 1500 + 2250,
                          "teacher_pos": 1500, "unkt": 2250, "cl": 1800, "smile": 300,
                          "cl_k1": 600}  # fmt: skip
    assert priorities["cl"] > priorities["teacher_pos"]
    # the entropy split heads the teachers' chains, so it goes before the reference
    assert entropy_priority(runs, priorities) == 3751
    assert entropy_priority({"reference": runs["reference"]}, {"reference": 1800}) == 0


BROKEN_YAML = "train:\n  lr: [0.001, 0.002\nseed: 3\n"  # the list's ] is missing


def test_a_yaml_error_in_config_yaml_names_its_file_and_line(workdir):
    (workdir / "config.yaml").write_text(BROKEN_YAML)
    result = snakemake(workdir, "-n")
    assert result.returncode != 0
    assert (f"distinctcap: config error: {workdir}/config.yaml, line 3, column 5: not valid "
            "YAML: expected ',' or ']', but got ':' (while parsing a flow sequence at line 2, "
            "column 7)") in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_check_config_names_the_file_and_line_of_a_broken_preset(tmp_path, capsys):
    """Snakemake reads a --configfile before the workflow runs, and names neither file nor line."""
    from distinctcap.runs.cli import main

    preset = tmp_path / "preset.yaml"
    preset.write_text(BROKEN_YAML)
    assert main(["check-config", str(ROOT / "config.yaml"), str(preset)]) == 2
    assert capsys.readouterr().err == (
        f"distinctcap: {preset}, line 3, column 5: not valid YAML: expected ',' or ']', but got "
        "':' (while parsing a flow sequence at line 2, column 7)\n"
    )
    preset.write_text("train: {lr: .nan}\n")
    assert main(["check-config", str(ROOT / "config.yaml"), str(preset), "--syntax"]) == 0
    assert main(["check-config", str(ROOT / "config.yaml"), str(preset)]) == 2
    assert "train.lr = nan is not a finite number" in capsys.readouterr().err


def test_only_runs_keeps_the_named_runs_and_those_they_start_from():
    """Issue 32: presets/quick.yaml names smile; its reference comes with it, nothing else."""
    from distinctcap.config.rungraph import selected_runs
    from distinctcap.core.configfile import read_configs

    config = validate(read_configs([ROOT / "config.yaml", ROOT / "presets/quick.yaml"]),
                      load_schema())  # fmt: skip
    assert list(selected_runs(config)) == ["reference", "smile"]
    assert list(selected_runs({**config, "only_runs": []})) == list(config["runs"])
    assert list(selected_runs({**config, "only_runs": ["unkt"]})) == ["teacher_neg", "unkt"]
    with pytest.raises(DistinctcapError, match="only_runs: nope names no run"):
        selected_runs({**config, "only_runs": ["nope"]})


def test_a_run_an_overlay_adds_is_not_dropped_by_only_runs_silently(tmp_path, capsys):
    """Issue 57: a run added over presets/quick.yaml was neither built nor reported, silently.
    It is an error naming its file and the fix; naming it in only_runs, or setting only_runs
    in the file that adds it (the run is then left out on purpose), is valid."""
    from distinctcap.runs.cli import main

    base = [str(ROOT / "config.yaml"), str(ROOT / "presets/quick.yaml")]
    mine = tmp_path / "mine.yaml"
    mine.write_text("runs:\n  mine: {method: mle, data: all}\n")
    assert main(["check-config", *base, str(mine)]) == 2
    assert capsys.readouterr().err == (
        f"distinctcap: runs.mine (added by {mine}) is dropped by only_runs = ['smile'] (set in "
        f"presets/quick.yaml): name it in only_runs in {mine}, e.g. only_runs: [smile, mine]\n"
    )
    for only in ("[smile, mine]", "[smile]"):
        mine.write_text(f"runs:\n  mine: {{method: mle, data: all}}\nonly_runs: {only}\n")
        assert main(["check-config", *base, str(mine)]) == 0, capsys.readouterr().err
    edits = tmp_path / "edits.yaml"  # editing a run of config.yaml that only_runs drops
    edits.write_text("runs:\n  unkt: {train: {steps: 5}}\n")
    assert main(["check-config", *base, str(edits)]) == 0, capsys.readouterr().err


def test_a_misspelt_key_names_its_file_and_the_key_meant(workdir, capsys):
    """Issue 48 item 6: a preset's `train.stpes` named neither the file nor `steps`."""
    from distinctcap.runs.cli import main

    (workdir / "presets").mkdir()
    preset = workdir / "presets" / "typo.yaml"
    preset.write_text("train:\n  stpes: 5\n")
    assert main(["check-config", str(workdir / "config.yaml"), str(preset)]) == 2
    said = capsys.readouterr().err
    assert said.startswith(f"distinctcap: {preset}: unknown key train.stpes; did you mean steps? "
                           "allowed keys here: "), said
    assert said.count("\n") == 1
    result = snakemake(workdir, "-n", "--configfile", "presets/typo.yaml")
    assert result.returncode != 0
    assert ("distinctcap: config error: presets/typo.yaml: unknown key train.stpes; did you "
            "mean steps?") in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr + result.stdout
    result = snakemake(workdir, "-n", "--config", "sed=3")
    assert "config error: --config: unknown key sed; did you mean seed?" in result.stderr


def test_show_run_prints_a_runs_settings_after_every_merge_and_default(monkeypatch, capsys):
    """Issue 57: `distinctcap show-run` prints what run_train reads: config.yaml, then each
    --configfile, then the schema's defaults, as YAML."""
    import yaml

    from distinctcap.config.rungraph import effective_run_config
    from distinctcap.core.configfile import read_configs
    from distinctcap.runs.cli import main

    monkeypatch.chdir(ROOT)
    assert main(["show-run", "smile", "--configfile", "presets/quick.yaml"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["train"]["steps"] == 150  # quick.yaml's runs.smile.train over config.yaml's
    assert shown["train"]["val_captions"] == 300  # quick.yaml's top-level train
    assert shown["subset"] == "smile" and shown["mle_weight"] == 0.0  # the schema's defaults
    config = validate(read_configs(["config.yaml", "presets/quick.yaml"]), SCHEMA)
    assert shown == effective_run_config(config, "smile", SCHEMA)
    assert main(["show-run", "nope"]) == 2
    assert capsys.readouterr().err.startswith("distinctcap: no run named 'nope'; defined runs: ")
