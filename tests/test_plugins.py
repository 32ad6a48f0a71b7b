"""Method plugins (issue 57; docs/extending.md): a method registered from outside the
repository through the entry-point group `distinctcap.methods`, taken like a built-in; a
registration missing a part is one line naming it, before any job runs.

Plugins are installed into a temporary folder put first on PYTHONPATH of a subprocess, so that
importlib.metadata finds their entry points and the shared venv stays as it is."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, SHIPPED_CLIP, copy_workflow, snakemake, tiny_config

from distinctcap.core.errors import DistinctcapError
from distinctcap.methods import facts

EXAMPLE = ROOT / "examples" / "label-smoothing"
FACTS_OK = """
from distinctcap.core.schema import method_options
from distinctcap.methods.base import Objective

class Facts(Objective):
    options = method_options("{name}")
    objective_class = "{objective}"
"""
SCHEMA_OK = "type: object\nproperties:\n  alpha: {type: number, default: 0.5}\n"


def plugin_env(*folders: Path) -> dict[str, str]:
    """Our environment with `folders` first on PYTHONPATH, then this checkout's src."""
    path = [*map(str, folders), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in path if p)}


def fake_plugin(site: Path, name: str, facts_src: str | None = None, schema: str | None = SCHEMA_OK,
                package: str = "fakeplug", objective: str = "fakeplug.objective:Objective") -> Path:
    """An installed distribution `package` in `site` (its dist-info, as pip writes it)
    registering method `name`: facts module `facts_src` (default a good one naming
    `objective`), the options schema `schema` (None: none shipped), an empty objective module."""
    info = site / f"{package}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        f"[distinctcap.methods]\n{name} = {package}.facts:Facts\n"
    )
    pkg = site / package
    (pkg / "schemas" / "methods").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "objective.py").write_text("")
    (pkg / "facts.py").write_text(facts_src or FACTS_OK.format(name=name, objective=objective))
    if schema is not None:
        (pkg / "schemas" / "methods" / f"{name}.yaml").write_text(schema)
    return site


def check_config(tmp_path: Path, runs: dict, site: Path) -> subprocess.CompletedProcess:
    config = tmp_path / "runs.yaml"
    config.write_text(yaml.safe_dump({"runs": runs}))
    cmd = [sys.executable, "-m", "distinctcap", "check-config", str(config)]
    return subprocess.run(cmd, capture_output=True, text=True, env=plugin_env(site), timeout=120)


def test_a_plugin_is_taken_like_a_builtin(tmp_path):
    """Its options are checked by its own schema, its name joins the methods that an unknown
    method's error lists, and its facts load without torch."""
    site = fake_plugin(tmp_path / "site", "mine")
    good = check_config(tmp_path, {"r": {"method": "mine", "alpha": 0.2}}, site)
    assert good.returncode == 0, good.stderr
    typo = check_config(tmp_path, {"r": {"method": "mine", "alpah": 0.2}}, site)
    assert typo.returncode == 2 and "runs.r" in typo.stderr and "alpah" in typo.stderr
    unknown = check_config(tmp_path, {"r": {"method": "nope"}}, site)
    assert (
        "runs.r.method = 'nope' is not allowed; choose one of "
        "['cl', 'mle', 'scst', 'smile', 'specificity', 'unkt', 'mine'] (a plugin's method is "
        "listed once its package is installed in this Python)"
    ) in unknown.stderr
    code = ("import sys; from distinctcap.methods.facts import FACTS; "
            "print(FACTS['mine'].options, 'torch' in sys.modules)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=plugin_env(site), timeout=120)  # fmt: skip
    assert out.stdout.split() == ["{'alpha':", "0.5}", "False"], out.stderr


BROKEN = {  # case -> (fake_plugin's arguments, the error's text after "method plugin ...")
    "name of a built-in": (dict(name="mle"), "its name is a built-in method's"),
    "no schema": (dict(name="mine", schema=None), "has no options schema: ship "),
    "no objective": (dict(name="mine", objective=""), "has no objective: set Facts.objective_"),
    "objective not installed": (
        dict(name="mine", objective="fakeplug.gone:Objective"), "names no installed module"
    ),
    "facts do not import": (
        dict(name="mine", facts_src="import not_a_module\n"), "its facts fakeplug.facts:Facts"
    ),
}


@pytest.mark.parametrize("case", BROKEN)
def test_an_incomplete_plugin_is_one_line_naming_it(tmp_path, case):
    kwargs, text = BROKEN[case]
    site = fake_plugin(tmp_path / "site", **kwargs)
    result = check_config(tmp_path, {"r": {"method": "mle"}}, site)
    assert result.returncode == 2
    line = result.stderr.strip()
    assert "\n" not in line and "Traceback" not in line
    assert line.startswith(f"distinctcap: method plugin {kwargs['name']!r} (package fakeplug)")
    assert text in line


def test_an_incomplete_builtin_registration_is_named(monkeypatch):
    """A schema file without its facts (issue 57: a KeyError in `snakemake -n`), facts without
    an objective (the job failed when it trained): each one line from the registry check."""
    builtins = (*facts.builtin_method_names(), "newone")
    monkeypatch.setattr(facts, "builtin_method_names", lambda: builtins)
    found = facts.registry.__wrapped__()
    assert found.problems == (
        "method 'newone' has an options schema (schemas/methods/newone.yaml) but no facts "
        "class: register it in distinctcap.methods.facts.BUILTIN_FACTS",
    )
    assert "newone" not in found.facts

    class NoObjective(facts.Objective):
        pass

    monkeypatch.setitem(facts.BUILTIN_FACTS, "newone", NoObjective)
    found = facts.registry.__wrapped__()
    assert found.problems == ('method \'newone\' has no objective: set NoObjective.'
                              'objective_class to the "module:Class" of its loss',)  # fmt: skip
    monkeypatch.setattr(facts, "registry", lambda: found)
    with pytest.raises(DistinctcapError, match="method 'newone' has no objective"):
        facts.check_registry()


def test_label_smoothing_loss_is_mle_at_zero_and_torchs_smoothing():
    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(EXAMPLE / "src"))
    try:
        from distinctcap_labelsmooth.losses import label_smoothing_loss
    finally:
        sys.path.remove(str(EXAMPLE / "src"))
    from distinctcap.methods.losses import mle_loss

    logits = torch.randn(3, 5, 11, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([[4, 2, 7, 0, 0], [1, 1, 3, 9, 0], [5, 6, 0, 0, 0]])
    assert torch.allclose(label_smoothing_loss(logits, labels, 0, 0.0), mle_loss(logits, labels, 0))
    ours = label_smoothing_loss(logits, labels, 0, 0.2)
    torchs = torch.nn.functional.cross_entropy(
        logits.transpose(1, 2), labels, ignore_index=0, label_smoothing=0.2
    )
    assert torch.allclose(ours, torchs)


def install_example(tmp_path: Path) -> Path:
    """The example plugin installed into a folder of its own (pip --target, no dependencies,
    built by the venv's setuptools): nothing of the shared venv or the checkout changes."""
    source = shutil.copytree(EXAMPLE, tmp_path / "example")  # pip builds in its source tree
    site = tmp_path / "site"
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
           "--no-build-isolation", "--no-index", "--target", str(site), str(source)]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return site


def test_the_try_preset_is_valid_with_the_example_installed(tmp_path):
    """presets/try.yaml (`make try`) over the quick preset: its run is the example plugin's."""
    site = install_example(tmp_path)
    files = [str(ROOT / name) for name in ("config.yaml", "presets/quick.yaml", "presets/try.yaml")]
    cmd = [sys.executable, "-m", "distinctcap", "check-config", *files]
    result = subprocess.run(cmd, capture_output=True, text=True, env=plugin_env(site), timeout=120)
    assert result.returncode == 0, result.stderr
    shown = subprocess.run(
        [sys.executable, "-m", "distinctcap", "show-run", "smoothed", "--configfile", *files[1:]],
        capture_output=True, text=True, env=plugin_env(site), timeout=120, cwd=ROOT,
    )
    assert shown.returncode == 0, shown.stderr
    run = yaml.safe_load(shown.stdout)
    assert (run["method"], run["epsilon"], run["train"]["steps"]) == ("label_smoothing", 0.1, 600)


def plugin_config() -> dict:
    """The tiny config with two runs, the reference and the plugin's, the shipped CLIP (no CLIP
    training), greedy decoding and no judge: the fewest jobs that train, decode, evaluate,
    summarise and compare a plugin's run."""
    config = tiny_config()
    config["clip"] = {**config["clip"], "pretrained": str(SHIPPED_CLIP)}
    config["runs"] = {"reference": {"method": "mle", "data": "all"},
                      "smoothed": {"method": "label_smoothing", "epsilon": 0.1}}  # fmt: skip
    config["decoding"] = {"greedy": {"kind": "greedy"}}
    config["evaluate"] = {k: v for k, v in config["evaluate"].items() if k != "judge"}
    return config


@pytest.mark.slow
def test_example_plugin_runs_through_the_tiny_dag(tmp_path):
    """Issue 57: the example plugin, installed, is trained, evaluated, summarised and compared
    like a built-in method."""
    start = time.monotonic()
    env = plugin_env(install_example(tmp_path))
    (tmp_path / "work").mkdir()
    workdir = copy_workflow(tmp_path / "work")
    result = snakemake(workdir, config=plugin_config(), env=env)
    assert result.returncode == 0, result.stderr[-5000:]
    summary = (workdir / "results/metrics/summary.csv").read_text()
    assert any(line.startswith("smoothed,") for line in summary.splitlines()), summary
    run = yaml.safe_load((workdir / "results/runs/smoothed/run.json").read_text())
    assert run["method"] == "label_smoothing" and run["run"]["epsilon"] == 0.1
    cmd = [sys.executable, "-m", "distinctcap", "compare", "--results", str(workdir / "results")]
    compared = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert compared.returncode == 0, compared.stderr
    assert "smoothed" in compared.stdout
    print(f"plugin DAG: {time.monotonic() - start:.0f} s")
