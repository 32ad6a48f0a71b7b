"""Config errors stop before any job runs, with one clear message naming the key."""

import pytest
from conftest import ROOT, snakemake

from distinctcap.config import load_schema, validate
from distinctcap.errors import DistinctcapError

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
        ({"data": {"shapes": {"n_trian": 5}}}, "unknown key data.shapes.n_trian; allowed keys"),
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
        ({}, "runs is empty; define at least one entry"),
    ],
)
def test_config_errors_name_the_key(config, expected):
    assert expected in error_of(config)


def test_bad_config_stops_snakemake_before_any_job(workdir):
    result = snakemake(workdir, "--config", "device=gpu")
    assert result.returncode != 0
    assert "distinctcap: config error: device = 'gpu' is not allowed" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert not (workdir / "results").exists()


def test_workflow_lints_clean(workdir):
    result = snakemake(workdir, "--lint")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Congratulations" in result.stdout + result.stderr


@pytest.mark.parametrize(
    "files",
    [["config.yaml"], ["config.coco.yaml"], ["tests/tiny_config.yaml"],
     *[["config.yaml", str(p.relative_to(ROOT))] for p in sorted(ROOT.glob("presets/*.yaml"))]],
)
def test_shipped_configs_and_presets_validate(files):
    import yaml

    config: dict = {}
    for name in files:  # later files override earlier ones, key by key, like --configfile
        config = _merge(config, yaml.safe_load((ROOT / name).read_text()))
    validated = validate(config, SCHEMA)
    assert validated["runs"], files


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        both_dicts = isinstance(value, dict) and isinstance(base.get(key), dict)
        out[key] = _merge(base[key], value) if both_dicts else value
    return out
