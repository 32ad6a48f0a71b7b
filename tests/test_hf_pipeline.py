"""End to end with the transformers captioner backend: the tiny DAG with `captioner.pretrained`
pointing at a tiny random BLIP saved with save_pretrained (the path a hub id takes, offline):
an MLE run, a SMILE fine-tune of it, decoding, evaluation, and each run's `hf` folder."""

import shutil

import pandas as pd
import pytest
from conftest import ROOT, SHIPPED_CLIP, snakemake, tiny_config
from tiny_blip import save_tiny_blip

pytestmark = pytest.mark.slow


def blip_config(blip_dir) -> dict:
    """The tiny config on the tiny BLIP: the reference and its SMILE fine-tune, greedy only."""
    config = tiny_config()
    config["captioner"] = {"kind": "transformers", "pretrained": str(blip_dir), "max_len": 16}
    # the CLIP serves entropy and evaluation only here: the shipped one, not trained
    config["clip"] = {**config["clip"], "pretrained": str(SHIPPED_CLIP)}
    config["runs"] = {
        "reference": {"method": "mle", "data": "all"},
        "smile": {"method": "smile", "init": "reference",
                  "train": {"select_metric": "self_retrieval"}},
    }
    config["decoding"] = {"greedy": {"kind": "greedy"}}
    return config


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("hf-pipeline")
    for name in ("Snakefile", "workflow", "envs", "config.yaml"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, workdir / name)
    config = blip_config(save_tiny_blip(tmp_path_factory.mktemp("blip") / "tiny-blip"))
    result = snakemake(workdir, config=config, timeout=1500)
    assert result.returncode == 0, result.stderr[-5000:]
    return workdir, config


def test_runs_are_trained_decoded_and_evaluated(finished):
    workdir, config = finished
    summary = pd.read_csv(workdir / "results/metrics/summary.csv")
    assert set(summary.run) == {"reference", "smile"}
    assert summary.cider.notna().all()
    generated = pd.read_parquet(workdir / "results/generated/smile/test-greedy.parquet")
    assert generated.text.str.len().gt(0).all()
    index = workdir / "results/features/captioner/index.json"
    assert '"grid_tokens": 17' in index.read_text()  # BLIP's CLS + 4 x 4 patches


def test_a_run_folder_loads_in_a_transformers_pipeline(finished):
    from PIL import Image
    from transformers import logging, pipeline

    logging.set_verbosity_error()  # transformers 5.24's "image-to-text" notice breaks logging

    workdir, _ = finished
    captioner = pipeline("image-to-text", model=str(workdir / "results/runs/smile/hf"))
    image = Image.open(sorted((workdir / "results/data").rglob("*.png"))[0])
    out = captioner(image, text="")  # transformers 5: the image-text-to-text pipeline
    assert out[0]["generated_text"].strip()


def test_a_hub_id_offline_stops_at_config_check(tmp_path):
    for name in ("Snakefile", "workflow", "envs", "config.yaml"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name)
    config = blip_config("Salesforce/blip-image-captioning-base")
    result = snakemake(tmp_path, "-n", config=config, timeout=300)
    assert result.returncode == 1
    assert "config error: captioner.pretrained = 'Salesforce/blip-image-captioning-base'" in (
        result.stderr
    )
