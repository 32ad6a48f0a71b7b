"""CLIP weights where the libraries put them: a hub cache laid out as huggingface_hub writes it,
holding a random ViT-B-32 under the `openai` tag, read offline by open_clip and by the project
alike; a file with `clip.tag` keeps the tag's settings; bad weights stop with one line."""

import open_clip
import pytest
import torch
from hub_cache import copy_into_hub, point_hub_at, snapshot_folder
from open_clip.transformer import QuickGELU
from safetensors.torch import save_file
from tiny_blip import save_tiny_blip

from distinctcap.captioner.hf import HFCaptioner
from distinctcap.clip.load import load_clip
from distinctcap.clip.weights import resolve_weights
from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import read_json, read_table
from distinctcap.data.prepare import prepare
from distinctcap.features.extract import FeatureSettings, extract_features

ARCH, TAG = "ViT-B-32", "openai"
REPO = "timm/vit_base_patch32_clip_224.openai"  # open_clip's hf_hub of the tag
BLIP = "Salesforce/tiny-blip"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """A hub cache (refs/main, snapshots/<rev>/open_clip_model.safetensors) of a random
    ViT-B-32 in half precision, the hub offline, for the whole module."""
    root = tmp_path_factory.mktemp("hf")
    weights = snapshot_folder(root / "hub", REPO) / "open_clip_model.safetensors"
    torch.manual_seed(0)
    model = open_clip.create_model(ARCH, force_quick_gelu=True)
    save_file({k: v.half().contiguous() for k, v in model.state_dict().items()}, weights)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HOME", str(root))
        point_hub_at(mp, root / "hub")
        yield weights


@pytest.fixture(scope="module")
def ours(hub):
    """The project's CLIP of the cached tag (each ViT-B-32 build takes seconds)."""
    return load_clip(ARCH, TAG)


def assert_same_clip(ours, theirs, preprocess) -> None:
    assert str(ours.preprocess) == str(preprocess)
    state = theirs.state_dict()
    for name, value in ours.model.state_dict().items():
        torch.testing.assert_close(value, state[name], rtol=0, atol=0, msg=name)
    image = torch.randn(1, 3, 224, 224)
    torch.testing.assert_close(ours.model.encode_image(image), theirs.encode_image(image))


@torch.no_grad()
def test_the_tag_loads_offline_as_open_clip_builds_it(hub, ours):
    theirs, _, preprocess = open_clip.create_model_and_transforms(
        ARCH, pretrained=TAG, force_quick_gelu=True  # open_clip reads the cache itself
    )
    assert ours.weight_files == (str(hub),)
    assert isinstance(ours.model.visual.transformer.resblocks[0].mlp.gelu, QuickGELU)
    assert_same_clip(ours, theirs.eval(), preprocess)


@torch.no_grad()
def test_a_weights_file_with_clip_tag_keeps_the_tags_settings(hub, ours):
    tagged = load_clip(ARCH, str(hub), tag=TAG)
    assert isinstance(tagged.model.visual.transformer.resblocks[0].mlp.gelu, QuickGELU)
    assert_same_clip(tagged, ours.model, ours.preprocess)
    assert resolve_weights(ARCH, str(hub)).kwargs == {}  # no tag: the architecture's GELU


def test_features_of_the_cached_tag_are_extracted_offline(hub, ours, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = {"source": "shapes", "shapes": {"n_train": 2, "n_val": 1, "n_test": 1, "seed": 0}}
    outputs = {k: f"data/{k}.parquet" for k in ("images", "captions", "quarantine")}
    prepare(data, "skip", {**outputs, "vocab": "data/vocab.json"})
    captions = read_table("data/captions.parquet", "captions")
    extract_features(
        read_table("data/images.parquet", "images"),
        captions[captions.image_id.isin(captions.image_id.unique())].head(8),
        ours,
        index_path="features/index.json",
        cache_dir="features/cache",
        settings=FeatureSettings(batch_size=4, workers=0),
    )
    manifest = read_json("features/index.json")["manifest"]
    assert manifest["pretrained"] == TAG and manifest["weight_files"] == [str(hub)]
    assert manifest["preprocess"]["interpolation"] == "bicubic"


def one_line(error: pytest.ExceptionInfo) -> str:
    text = str(error.value)
    assert "\n" not in text
    return text


def test_a_tag_missing_from_the_cache_names_the_key_the_cache_and_the_fix(tmp_path):
    with pytest.MonkeyPatch.context() as mp:
        point_hub_at(mp, tmp_path)
        with pytest.raises(DistinctcapError) as error:
            load_clip(ARCH, TAG)
    text = one_line(error)
    assert "clip.pretrained = 'openai'" in text and str(tmp_path) in text
    assert "timm/vit_base_patch32_clip_224.openai" in text and "distinctcap fetch" in text


def test_downloads_allowed_behind_a_proxy_read_the_cache_without_probing(hub, tmp_path):
    with pytest.MonkeyPatch.context() as mp:
        point_hub_at(mp, hub.parents[3], offline=False)  # <cache>/<repo>/snapshots/<rev>/
        mp.setenv("HTTPS_PROXY", "http://127.0.0.1:9")  # nothing listens: any request fails
        assert resolve_weights(ARCH, TAG).files == (str(hub),)


def test_a_wrong_tag_a_missing_file_and_a_corrupt_file_each_stop_in_one_line(hub, tmp_path):
    with pytest.raises(DistinctcapError, match="clip.pretrained = 'no-such-tag' .*tags: .*openai"):
        load_clip(ARCH, "no-such-tag")
    with pytest.raises(DistinctcapError, match="clip.tag = 'no-such-tag' is not a known tag"):
        load_clip(ARCH, str(hub), tag="no-such-tag")
    missing = tmp_path / "gone.safetensors"
    with pytest.raises(DistinctcapError, match=f"clip.pretrained = '{missing}': no such file"):
        load_clip(ARCH, str(missing), tag=TAG)
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(hub.read_bytes()[:4096])
    with pytest.raises(DistinctcapError) as error:
        load_clip(ARCH, str(corrupt), tag=TAG)
    assert f"clip.pretrained = '{corrupt}': open_clip could not build" in one_line(error)


def test_the_captioner_loads_from_the_hub_cache_offline_or_names_the_fix(hub, tmp_path):
    cache = hub.parents[3]
    copy_into_hub(cache, BLIP, save_tiny_blip(tmp_path / "blip"))
    assert HFCaptioner.from_pretrained(BLIP, max_len=8).source == BLIP  # the id, not the path
    with pytest.raises(DistinctcapError) as error:
        HFCaptioner.from_pretrained("Salesforce/not-fetched", max_len=8)
    text = one_line(error)
    assert "captioner.pretrained = 'Salesforce/not-fetched'" in text and str(cache) in text
    assert "distinctcap fetch" in text


def fetch_lines(config: dict, offline: bool) -> tuple[int, list[str]]:
    from distinctcap.runs.fetch import run_fetch

    lines: list[str] = []
    return run_fetch(config, offline=offline, say=lines.append), lines


def test_fetch_offline_says_what_is_in_the_cache_and_what_is_missing(hub):
    config = {
        "data": {"source": "shapes"},
        "clip": {"arch": ARCH, "pretrained": TAG},
        "captioner": {"kind": "transformers", "pretrained": "Salesforce/not-fetched"},
    }
    code, lines = fetch_lines(config, offline=True)
    assert code == 1
    assert lines[0] == f"ok       CLIP {ARCH} {TAG}: {hub}"
    assert lines[1].startswith("missing  captioner Salesforce/not-fetched: captioner.pretrained")
    assert lines[2] == "1 of 2 missing (above)"
    code, lines = fetch_lines({**config, "captioner": {}}, offline=True)
    assert code == 0 and "  export HF_HUB_OFFLINE=1" in lines


def test_fetch_downloads_coco_by_the_data_stage_then_finds_it_offline(tmp_path):
    from minicoco import MiniServer, build_minicoco

    from distinctcap.data.coco import SPLIT_ARCHIVES

    mini = build_minicoco(tmp_path / "mini")
    block = {
        "split": "karpathy",
        "download_dir": str(tmp_path / "coco"),
        "checksums": {n: mini.md5[n] for n in SPLIT_ARCHIVES["karpathy"]},
        "backoff": 0.0,
    }
    config = {"data": {"source": "coco", "coco": block}, "clip": {"pretrained": "train"}}
    assert fetch_lines(config, offline=True)[0] == 1  # nothing downloaded yet
    with MiniServer(mini.serve) as server:
        block["base_url"] = server.url
        code, lines = fetch_lines(config, offline=False)
    assert code == 0 and lines[0] == f"ok       COCO (karpathy): {tmp_path / 'coco'}"
    assert fetch_lines(config, offline=True)[0] == 0
