"""Runs over several seeds (issue 34, docs/seeds.md): the config layer expands each run into one
model per seed, children read their parent's model of the same seed, and one seed keeps the
config's own runs, names and effective configs exactly."""

import json
import shutil

import numpy as np
import pandas as pd
import pytest
from conftest import ROOT

from distinctcap.config.check import load_schema, validate
from distinctcap.config.rungraph import effective_run_config, seed_runs, seeded_runs
from distinctcap.core.configfile import read_configs
from distinctcap.core.errors import DistinctcapError

SCHEMA = load_schema(ROOT / "workflow" / "schemas" / "config.schema.yaml")
RUNS = {
    "reference": {"method": "mle"},
    "teacher_neg": {"method": "mle", "data": "D-"},
    "unkt": {"method": "unkt", "teacher": "teacher_neg"},
    "cl": {"method": "cl", "init": "reference", "reference": "reference"},
}


def effective_configs(config: dict) -> dict[str, str]:
    """Each model's effective config as the JSON its fingerprint and run card are made of."""
    seeded = {**config, "runs": seeded_runs(config)}
    return {name: json.dumps(effective_run_config(seeded, name, SCHEMA))
            for name in seeded["runs"]}  # fmt: skip


def test_one_seed_keeps_every_run_of_the_default_config_as_it_was():
    """config.yaml: the same model names and the same effective configs, key order included,
    as each run's own block gave before seeds existed (so nothing retrains)."""
    config = validate(read_configs([ROOT / "config.yaml"]), SCHEMA)
    before = {name: json.dumps(effective_run_config(config, name, SCHEMA))
              for name in config["runs"]}  # fmt: skip
    assert effective_configs(config) == before
    assert effective_configs({**config, "seeds": [config["seed"]]}) == before


def test_each_seed_is_a_model_and_children_read_the_same_seed():
    config = validate({"runs": RUNS, "seeds": [0, 1, 2]}, SCHEMA)
    models = seed_runs(config)
    assert [(m.arm, m.seed) for m in models.values()] == [
        (arm, seed) for arm in RUNS for seed in (0, 1, 2)
    ]
    assert models["reference"].block == config["runs"]["reference"]  # seed 0: today's run
    assert models["reference_s1"].block == {**config["runs"]["reference"], "seed": 1}
    assert models["unkt_s2"].block["teacher"] == "teacher_neg_s2"
    assert models["cl_s1"].block["init"] == models["cl_s1"].block["reference"] == "reference_s1"
    effective = {n: json.loads(c) for n, c in effective_configs(config).items()}
    assert {n: c["seed"] for n, c in effective.items()} == {n: m.seed for n, m in models.items()}


def test_a_run_over_seeds_trains_its_parents_for_those_seeds():
    """Per-run seeds: the teacher (unkt's parent) is trained for the student's seeds too; a run
    nobody reads keeps one model; a pinned `seed` is kept as written."""
    runs = {**RUNS, "unkt": {**RUNS["unkt"], "seeds": [0, 3]}, "pinned": {"method": "mle",
                                                                         "seed": 5}}
    models = seed_runs(validate({"runs": runs}, SCHEMA))
    assert sorted(models) == ["cl", "pinned", "reference", "teacher_neg", "teacher_neg_s3",
                              "unkt", "unkt_s3"]  # fmt: skip
    assert models["unkt_s3"].block["teacher"] == "teacher_neg_s3"
    assert models["pinned"].block["seed"] == 5


@pytest.mark.parametrize(("runs", "top", "message"), [
    ({"a": {"method": "mle", "seed": 1, "seeds": [1, 2]}}, None, "runs.a: give seed or seeds"),
    ({"a": {"method": "mle", "seed": 1}, "b": {"method": "cl", "init": "a", "reference": "a",
                                               "seeds": [0, 1]}},
     None, "runs.a.seed = 1 pins one seed"),
    ({"a": {"method": "mle"}, "a_s1": {"method": "mle"}}, [0, 1], "'a_s1', which is also a run"),
    ({"a": {"method": "mle", "seeds": [1, 1]}}, None, "runs.a.seeds"),
])  # fmt: skip
def test_seed_errors_name_the_key(runs, top, message):
    config = {"runs": runs} | ({"seeds": top} if top else {})
    with pytest.raises(DistinctcapError, match=message):
        validate(config, SCHEMA)


def test_versus_pairs_each_seed_with_the_reference_of_that_seed():
    """A run over two seeds is one row per metric, against the reference of the same seed;
    a run with one model is compared with `reference` as before; one seed adds no column."""
    from distinctcap.report.versus import seed_pairs

    keys = [(m, "test", "greedy") for m in ("reference", "reference_s1", "unkt", "unkt_s1",
                                              "pinned")]  # fmt: skip
    seed_of = {"reference": ("reference", 0), "reference_s1": ("reference", 1),
               "unkt": ("unkt", 0), "unkt_s1": ("unkt", 1), "pinned": ("pinned", 1)}
    pairs = seed_pairs(keys, "reference", seed_of)
    assert pairs == {
        ("unkt", "test", "greedy"): [(keys[2], keys[0]), (keys[3], keys[1])],
        ("pinned", "test", "greedy"): [(keys[4], keys[0])],
    }


def test_the_seed_bootstrap_interval_holds_across_seeds_only_where_every_seed_agrees():
    """Two seeds that both gain +1 per image: better, the difference their mean; one seed
    gaining +1 and the other losing 1: the interval spans 0 (the images alone would not)."""
    from distinctcap.report.versus import mean_statistic, seed_bootstrap, verdict

    rng = np.random.default_rng(0)
    base = rng.normal(size=(200, 1))
    mean = mean_statistic(200)
    agree = [(base + 1, base, mean), (base + 1.2, base, mean)]
    value, ref, diff, low, high = seed_bootstrap(agree, 500, 0)
    assert diff == pytest.approx(1.1) and value - ref == pytest.approx(diff)
    assert verdict(low, high) == "better"
    split = [(base + 1, base, mean), (base - 1, base, mean)]
    *_, diff, low, high = seed_bootstrap(split, 500, 0)
    assert diff == pytest.approx(0) and low < 0 < high
    assert verdict(low, high) == "no significant difference"


def seed_metrics(cider_of: dict[str, float]) -> pd.DataFrame:
    """Metrics rows (greedy and 20 samples) of models with the given CIDEr-D, 0.25 elsewhere."""
    from distinctcap.report.summary import CONSENSUS, SUMMARY_BASE, SUMMARY_TAIL

    columns = [c for c in (*SUMMARY_BASE, "oracle_cider_20", *CONSENSUS, *SUMMARY_TAIL)
               if c not in ("run", "split", "decoding")]  # fmt: skip
    return pd.DataFrame([
        {"run": model, "split": "test", "decoding": dec, **dict.fromkeys(columns, 0.25),
         "n_samples": n, "cider": cider, "skipped": {}}
        for model, cider in cider_of.items() for dec, n in (("greedy", 1), ("sample20", 20))
    ])  # fmt: skip


SEED_OF = {"reference": ("reference", 0), "reference_s1": ("reference", 1),
           "unkt": ("unkt", 0), "unkt_s1": ("unkt", 1)}  # fmt: skip
ARMS = {"reference": {"method": "mle", "data": "all"}, "unkt": {"method": "unkt"}}


def test_the_tables_mean_is_the_mean_of_the_per_seed_rows(tmp_path):
    from distinctcap.report.summary import headline_markdown, pooled_metrics, write_summary
    from distinctcap.report.tables import tables_markdown

    metrics = seed_metrics({"reference": 0.9, "reference_s1": 1.1, "unkt": 1.0, "unkt_s1": 1.4})
    summary = write_summary(metrics, tmp_path / "s.csv", SEED_OF, tmp_path / "seeds.csv")
    assert list(summary.columns[:4]) == ["run", "seed", "split", "decoding"]
    assert list(zip(summary.run, summary.seed, strict=True))[::2] == list(SEED_OF.values())
    pooled = pd.read_csv(tmp_path / "seeds.csv").set_index(["run", "decoding"])
    per_seed = summary[summary.decoding == "greedy"].groupby("run").cider
    assert pooled.loc[("unkt", "greedy"), "cider_mean"] == pytest.approx(per_seed.mean()["unkt"])
    assert pooled.loc[("unkt", "greedy"), "cider_sd"] == pytest.approx(per_seed.std()["unkt"])
    assert pooled.n_seeds.tolist() == [2, 2, 2, 2]
    cells = "| unkt | 0.250 ± 0.000 (2) | 0.250 ± 0.000 (2) | 1.200 ± 0.283 (2) |"
    assert cells in headline_markdown(summary, ARMS)
    tables = tables_markdown(pooled_metrics(metrics, SEED_OF), "shapes")
    assert "| unkt | greedy | test | n/a | 0.250 ± 0.000 (2) | 1.200 ± 0.283 (2) |" in tables


def test_an_effect_holds_across_seeds_only_where_every_seed_and_the_interval_show_it():
    from distinctcap.report.effects import EFFECTS, effects_table

    cider = {"reference": [1.0, 1.1, 0.9], "cl": [1.2, 1.3, 1.0], "smile": [1.2, 1.0, 1.1],
             "teacher_pos": [0.5] * 3, "teacher_neg": [0.6, 0.4, 0.4]}  # fmt: skip
    summary = pd.DataFrame([
        {"run": run, "seed": seed, "split": "test", "decoding": "greedy", "cider": value,
         "r_at_1": value if run.startswith("teacher") else 0.3}
        for run, values in cider.items() for seed, value in enumerate(values)
    ])  # fmt: skip
    versus = pd.DataFrame([
        {"run": run, "decoding": "greedy", "split": "test", "metric": "cider", "difference": d,
         "ci_low": low, "ci_high": high, "verdict": v}
        for run, d, low, high, v in (("cl", 0.17, 0.01, 0.3, "better"),
                                     ("smile", 0.1, -0.1, 0.3, "no significant difference"))
    ])  # fmt: skip
    table = effects_table(summary, versus).set_index("effect")
    assert len(EFFECTS) == 10 and len(table) == 19  # and UNMET, and the field's 8 (issue 58)
    cl = table.loc["CL: greedy CIDEr above the reference's"]
    assert (cl.seeds, cl.holds, cl["difference per seed"]) == (3, "yes", "+0.200, +0.200, +0.100")
    assert cl["mean ± sd"] == "+0.167 ± 0.058"
    assert cl["interval (seeds, images)"] == "+0.170 [+0.010, +0.300]"
    assert table.loc["SMILE: greedy CIDEr above the reference's"].holds == "no: on 2 of 3 seeds"
    assert table.loc["CL: greedy R@1 above the reference's"].holds == "no: on 0 of 3 seeds"
    teachers = table.loc["D+ teacher: greedy R@1 above the D- teacher's"]  # paired by seed
    assert (teachers.holds, teachers["interval (seeds, images)"]) == ("no: on 2 of 3 seeds", "")
    assert table.loc["UNKT: greedy CIDEr above the reference's"].holds == "not run"
    versus.loc[0, ["ci_low", "verdict"]] = [-0.01, "no significant difference"]
    cl = effects_table(summary, versus).set_index("effect").loc[cl.name]
    assert cl.holds == "on every seed, interval includes 0"


def test_an_r_at_1_effect_is_read_by_the_independent_judges_seed_by_seed():
    """Issue 45: each judge confirms an R@1 effect where its mean gain over seeds is at least
    half the trainer-CLIP's and it shows a gain on every seed; none confirming is the flag."""
    from distinctcap.report.effects import effects_table
    from distinctcap.report.judged import FLAG

    gains = {  # run: (judge CLIP's R@1 gain per seed, the scene judge's)
        "cl": ([0.15] * 3, [0.12] * 3), "smile": ([0.15] * 3, [0.02] * 3),
        "specificity": ([0.02] * 3, [0.15] * 3), "unkt": ([0.3, 0.3, -0.15], [0.01] * 3),
        "reference": ([0.0] * 3, [0.0] * 3),
    }
    summary = pd.DataFrame([
        {"run": run, "seed": seed, "split": "test", "decoding": "greedy", "cider": 1.0,
         "r_at_1": 0.3 + (run != "reference") * 0.2, "judge_r_at_1": 0.3 + judge[seed],
         "scene_r_at_1": 0.3 + scene[seed]}
        for run, (judge, scene) in gains.items() for seed in range(3)
    ] + [{"run": run, "seed": seed, "split": "test", "decoding": "greedy", "r_at_1": r,
          "judge_r_at_1": np.nan, "scene_r_at_1": np.nan}
         for run, r in (("teacher_pos", 0.5), ("teacher_neg", 0.4)) for seed in range(3)])
    table = effects_table(summary).set_index("effect")
    judges = {run: table.loc[f"{name}: greedy R@1 above the reference's", "judges"]
              for run, name in (("cl", "CL"), ("smile", "SMILE"),
                                ("specificity", "specificity"), ("unkt", "UNKT"))}
    assert judges == {"cl": "survives both judges", "smile": "survives the judge CLIP only",
                      "specificity": "survives the scene judge only", "unkt": FLAG}
    unkt = table.loc["UNKT: greedy R@1 above the reference's"]
    assert unkt["judge CLIP per seed"] == "+0.300, +0.300, -0.150"  # mean +0.15, not every seed
    assert unkt["scene judge per seed"] == "+0.010, +0.010, +0.010"
    teachers = table.loc["D+ teacher: greedy R@1 above the D- teacher's"]
    assert (teachers.judges, teachers["judge CLIP per seed"]) == ("no judge", "")
    assert table.loc["CL: greedy CIDEr above the reference's", "judges"] == (
        "n/a (not a CLIP metric)")
    assert table.loc["UNKT: oracle CIDEr-D@20 above the reference's", "judges"] == ""  # not run
    coco = effects_table(summary.drop(columns="scene_r_at_1")).set_index("effect")  # no scenes
    assert coco.loc["CL: greedy R@1 above the reference's", "judges"] == (
        "survives the judge CLIP (the only judge evaluated)")
    assert coco.loc["specificity: greedy R@1 above the reference's", "judges"] == FLAG


def test_a_lower_cider_btw_is_the_gain_of_its_effect():
    """Issue 58: CIDErBtw is lower-better, so its effect holds where every seed lowers it and
    versus.csv calls the difference better; DisWordRate's where every seed raises it."""
    from distinctcap.report.effects import effects_table, field_effects

    values = {"reference": (0.50, 0.10), "cl": (0.40, 0.20), "smile": (0.55, 0.05)}
    summary = pd.DataFrame([
        {"run": run, "seed": seed, "split": "test", "decoding": "greedy",
         "cider_btw": btw + 0.01 * seed, "dis_word_rate": rate}
        for run, (btw, rate) in values.items() for seed in range(3)
    ])  # fmt: skip
    versus = pd.DataFrame([{"run": "cl", "decoding": "greedy", "split": "test",
                            "metric": "cider_btw", "difference": -0.1, "ci_low": -0.12,
                            "ci_high": -0.08, "verdict": "better"}])  # fmt: skip
    effects = field_effects((("cl", "CL"), ("smile", "SMILE")))
    table = effects_table(summary, versus, effects).set_index("effect")
    cl = table.loc["CL: greedy CIDErBtw below the reference's"]
    assert (cl.holds, cl["difference per seed"]) == ("yes", "-0.100, -0.100, -0.100")
    assert cl["interval (seeds, images)"] == "-0.100 [-0.120, -0.080]"
    assert table.loc["CL: greedy DisWordRate above the reference's"].holds == "yes"
    assert table.loc["SMILE: greedy CIDErBtw below the reference's"].holds == (
        "no: on 0 of 3 seeds")
    assert table.loc["SMILE: greedy DisWordRate above the reference's"].holds == (
        "no: on 0 of 3 seeds")


def scst_summary() -> pd.DataFrame:
    """Greedy test rows of presets/scst.yaml's arms over seeds 0-2: CIDEr-D and R@1 under the
    trainer's CLIP, the judge CLIP and the scene judge."""
    values = {  # run: (cider, r_at_1, judge_r_at_1, scene_r_at_1) per seed
        "reference": [(1.0, 0.30, 0.30, 0.30), (1.1, 0.30, 0.30, 0.30), (0.9, 0.30, 0.30, 0.30)],
        "scst": [(1.2, 0.30, 0.30, 0.30), (1.3, 0.32, 0.30, 0.30), (1.0, 0.28, 0.30, 0.30)],
        "scst_retrieval": [(1.1, 0.40, 0.36, 0.31), (1.2, 0.42, 0.38, 0.30),
                           (0.9, 0.38, 0.34, 0.29)],
    }  # fmt: skip
    columns = ("cider", "r_at_1", "judge_r_at_1", "scene_r_at_1")
    return pd.DataFrame([
        {"run": run, "seed": seed, "split": "test", "decoding": "greedy",
         **dict(zip(columns, row, strict=True))}
        for run, rows in values.items() for seed, row in enumerate(rows)
    ])  # fmt: skip


def test_the_scst_effects_are_judged_over_seeds_like_the_readmes():
    """Issue 49: SCST above the reference on greedy CIDEr-D (with versus.csv's interval) and
    the retrieval reward's R@1 over plain SCST, paired by seed and read by both judges."""
    from distinctcap.report.effects import SCST_EFFECTS, effects_table

    versus = pd.DataFrame([{"run": "scst", "decoding": "greedy", "split": "test",
                            "metric": "cider", "difference": 0.17, "ci_low": 0.05,
                            "ci_high": 0.29, "verdict": "better"}])  # fmt: skip
    table = effects_table(scst_summary(), versus, SCST_EFFECTS).set_index("effect")
    assert len(table) == 6  # and the field's 4 (issue 58), not run: no cider_btw column
    scst = table.loc["SCST: greedy CIDEr above the reference's"]
    assert (scst.seeds, scst["difference per seed"], scst.holds) == (
        3, "+0.200, +0.200, +0.100", "yes")
    assert (scst["mean ± sd"], scst["interval (seeds, images)"]) == (
        "+0.167 ± 0.058", "+0.170 [+0.050, +0.290]")
    assert scst.judges == "n/a (not a CLIP metric)"
    r1 = table.loc["SCST + retrieval reward: greedy R@1 above plain SCST's"]
    assert (r1["difference per seed"], r1.holds) == ("+0.100, +0.100, +0.100", "yes")
    assert r1["interval (seeds, images)"] == ""  # versus.csv compares with the reference only
    assert r1["judge CLIP per seed"] == "+0.060, +0.080, +0.040"  # mean +0.06 >= half of +0.10
    assert r1["scene judge per seed"] == "+0.010, +0.000, -0.010"
    assert r1.judges == "survives the judge CLIP only"


def test_the_scst_effects_not_run_where_the_summary_lacks_their_runs(tmp_path, capsys):
    """A summary without the preset's runs (the default's) shows each SCST effect "not run";
    the command line prints the table of SCST_EFFECTS from a summary.csv."""
    from distinctcap.report.effects import SCST_EFFECTS, effects_table, main

    summary = scst_summary()
    plain = summary[summary.run == "reference"]
    assert effects_table(plain, None, SCST_EFFECTS).holds.tolist() == ["not run"] * 6
    no_arm = effects_table(summary[summary.run != "scst_retrieval"], None, SCST_EFFECTS)
    assert no_arm.holds.tolist() == ["yes", *["not run"] * 5]
    summary.to_csv(tmp_path / "summary.csv", index=False)
    main(["--scst", str(tmp_path / "summary.csv")])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("| effect | seeds |") and len(lines) == 8  # header, rule, 6 rows
    assert lines[2].startswith("| SCST: greedy CIDEr above the reference's | 3 |")
    with pytest.raises(SystemExit):
        main(["--scst", str(tmp_path)])  # a metrics folder needs its --configs
    assert "give --configs" in capsys.readouterr().err


def test_make_scst_table_reads_the_metrics_folder_by_run_and_seed(tmp_path, capsys):
    """make scst-table: the metrics tables finished so far (results/metrics/<model>/), each
    model named by its run and seed under config.yaml + presets/scst.yaml (scst_s1 is scst's
    seed 1, paired with reference_s1)."""
    from distinctcap.core.io import write_table
    from distinctcap.report.effects import main

    cider = {"reference": 1.0, "reference_s1": 1.1, "reference_s2": 0.9,
             "scst": 1.2, "scst_s1": 1.3, "scst_s2": 0.95}  # fmt: skip
    metrics = seed_metrics(cider)
    for model, rows in metrics.groupby("run"):
        for decoding, table in rows.groupby("decoding"):
            (tmp_path / model).mkdir(exist_ok=True)
            table = table.assign(skipped=[json.dumps(s) for s in table.skipped])
            write_table(table, tmp_path / model / f"test-{decoding}.parquet")
    configs = [str(ROOT / "config.yaml"), str(ROOT / "presets/scst.yaml")]
    main(["--scst", str(tmp_path), "--configs", *configs])
    rows = capsys.readouterr().out.strip().splitlines()[2:]
    assert rows[0].startswith(
        "| SCST: greedy CIDEr above the reference's | 3 | +0.200, +0.200, +0.050 | "
    )
    assert "| 0 |" in rows[1] and "| not run |" in rows[1]  # scst_retrieval: not evaluated


def test_the_bars_of_a_run_over_seeds_stand_at_its_mean_with_a_dot_per_seed(tmp_path):
    from distinctcap.report.plots import bar_heights, plot_metric_bars
    from distinctcap.report.summary import with_seeds

    metrics = seed_metrics({"reference": 0.9, "reference_s1": 1.1, "unkt": 1.0, "unkt_s1": 1.4})
    runs = ["reference", "unkt"]
    heights, (at, values) = bar_heights(with_seeds(metrics, SEED_OF), runs, "test/greedy", "cider")
    assert heights.tolist() == pytest.approx([1.0, 1.2])
    assert (at, values.tolist()) == ([0, 0, 1, 1], pytest.approx([0.9, 1.1, 1.0, 1.4]))
    plot_metric_bars(metrics, tmp_path / "bars.png", order=runs, seed_of=SEED_OF)
    assert (tmp_path / "bars.png").read_bytes()[:4] == b"\x89PNG"


def test_one_seed_gives_todays_tables(tmp_path):
    """One seed a run: summary.csv only gains its seed column; the headline, paper-layout
    tables and summary_seeds.csv's means are today's numbers."""
    from distinctcap.report.summary import headline_markdown, pooled_metrics, write_summary
    from distinctcap.report.tables import tables_markdown

    metrics = seed_metrics({"reference": 0.9, "unkt": 1.0})
    seed_of = {"reference": ("reference", 0), "unkt": ("unkt", 0)}
    summary = write_summary(metrics, tmp_path / "s.csv", seed_of, tmp_path / "seeds.csv")
    before = write_summary(metrics, tmp_path / "before.csv")
    assert summary.drop(columns="seed").equals(before.assign(seed=None).drop(columns="seed"))
    assert headline_markdown(summary, ARMS) == headline_markdown(before.drop(columns="seed"), ARMS)
    assert pooled_metrics(metrics, seed_of) is metrics
    assert "| unkt | 0.250 | 0.250 | 1.000 |" in headline_markdown(summary, ARMS)
    assert "±" not in tables_markdown(pooled_metrics(metrics, seed_of), "shapes")
    pooled = pd.read_csv(tmp_path / "seeds.csv")
    assert pooled.cider_mean.tolist() == summary.cider.tolist()
    assert pooled.n_seeds.eq(1).all()


@pytest.mark.slow
def test_two_seeds_through_the_dag(tiny_dag, tmp_path):
    """The real DAG over seeds 0 and 1 of CL and the reference it starts from, on a copy of
    the shared tiny run (seed 0 is its own models: not retrained): the seeds' weights differ,
    cl_s1 starts from reference_s1, the summary pools the seeds and versus pairs them; the
    same config with one seed has its models up to date."""
    from conftest import snakemake

    shared, config = tiny_dag
    workdir = shutil.copytree(shared, tmp_path / "seeds", symlinks=True)
    runs = workdir / "results" / "runs"
    seed0 = {run: (runs / run / "model.pt").read_bytes() for run in ("reference", "cl")}
    targets = ["results/metrics/summary.csv", "results/report/versus.csv"]
    result = snakemake(workdir, *targets, config={**config, "only_runs": ["cl"], "seeds": [0, 1]})
    assert result.returncode == 0, result.stderr[-4000:]
    assert {p.name for p in runs.iterdir()} >= {"cl", "cl_s1", "reference", "reference_s1"}
    weights = {p.name: (p / "model.pt").read_bytes() for p in runs.iterdir()}
    assert {run: weights[run] for run in seed0} == seed0
    assert weights["reference"] != weights["reference_s1"] and weights["cl"] != weights["cl_s1"]
    trained = json.loads((runs / "cl_s1" / "summary.json").read_text())["config"]
    assert (trained["init"], trained["reference"], trained["seed"]) == ("reference_s1",) * 2 + (1,)
    summary = pd.read_csv(workdir / "results/metrics/summary.csv")
    assert sorted(set(zip(summary.run, summary.seed, strict=True))) == [
        ("cl", 0), ("cl", 1), ("reference", 0), ("reference", 1)]
    keys = ["run", "split", "decoding"]
    pooled = pd.read_csv(workdir / "results/metrics/summary_seeds.csv").set_index(keys)
    per_seed = summary.groupby(keys).cider.mean()
    assert pooled.cider_mean.to_numpy() == pytest.approx(per_seed[pooled.index].to_numpy())
    assert pooled.n_seeds.eq(2).all()
    versus = pd.read_csv(workdir / "results/report/versus.csv")
    assert set(versus.run) == {"cl"} and versus.n_seeds.eq(2).all()
    models = (f"results/runs/{run}/model.pt" for run in ("reference", "cl"))
    one_seed = snakemake(workdir, "-n", *models, config=config)
    assert "Nothing to be done" in one_seed.stdout + one_seed.stderr, one_seed.stdout[-3000:]
