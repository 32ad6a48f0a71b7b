"""COCO download (resume, retry, verify, skip), splits, normalisation and bad-input handling,
against a generated mini-COCO served from 127.0.0.1 (tests/minicoco.py)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from minicoco import (
    BAD_BYTES,
    DEFECTS,
    IDS,
    KTEST,
    KVAL,
    VAL2017,
    MiniServer,
    build_minicoco,
    caption_id,
)

from distinctcap.core.download import download
from distinctcap.core.errors import DistinctcapError
from distinctcap.data import coco
from distinctcap.data.quality import check_tables
from distinctcap.data.readers import normalize_caption

KARPATHY_ZIP = "/people/karpathy/deepimagesent/caption_datasets.zip"


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    return build_minicoco(tmp_path_factory.mktemp("minicoco"))


@pytest.fixture
def server(mini):
    with MiniServer(mini.serve) as srv:
        yield srv


def _md5(path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def _cfg(mini, server, tmp_path, split, **extra) -> dict:
    names = coco.SPLIT_ARCHIVES[split]
    return {
        "split": split,
        "download_dir": str(tmp_path / "coco"),
        "base_url": server.url,
        "checksums": {n: mini.md5[n] for n in names},
        "backoff": 0.0,
        **extra,
    }


def _split_counts(images) -> dict:
    return images.split.value_counts().to_dict()


# ---------------------------------------------------------------------------------------------
# downloader


def test_interrupted_download_resumes_from_the_part(mini, server, tmp_path):
    """A run stopped after 300 bytes left them in the .part; the next run asks for the rest."""
    url, dest = server.url + "/zips/val2014.zip", tmp_path / "val2014.zip"
    full = (mini.serve / "zips" / "val2014.zip").read_bytes()
    part = tmp_path / "val2014.zip.part"
    part.write_bytes(full[:300])
    download(url, dest, md5=mini.md5["val2014.zip"], backoff=0)
    assert server.requests == [{"path": "/zips/val2014.zip", "range": "bytes=300-", "status": 206}]
    assert dest.read_bytes() == full and not part.exists()


def test_attempts_without_progress_are_bounded(server, tmp_path):
    for _ in range(3):
        server.state.fail_once["/zips/val2017.zip"] = 503
        with pytest.raises(DistinctcapError, match="failed after 0 retries: HTTP Error 503"):
            download(server.url + "/zips/val2017.zip", tmp_path / "v.zip", retries=0)
    assert [r["status"] for r in server.requests] == [503, 503, 503]


def test_dropped_connection_resumes_within_one_call(mini, server, tmp_path):
    """The server closes after 1000 bytes; the retry continues the .part with a Range request."""
    server.state.drop_after["/zips/val2017.zip"] = 1000
    dest = download(server.url + "/zips/val2017.zip", tmp_path / "v.zip", backoff=0)
    assert [r["range"] for r in server.requests] == [None, "bytes=1000-"]
    assert _md5(dest) == mini.md5["val2017.zip"]


def test_server_ignoring_range_restarts_the_part(mini, server, tmp_path):
    (tmp_path / "v.zip.part").write_bytes(b"x" * 100)  # would corrupt the file if appended to
    server.state.ignore_range = True
    dest = download(
        server.url + "/zips/val2017.zip", tmp_path / "v.zip", md5=mini.md5["val2017.zip"]
    )
    assert server.requests == [{"path": "/zips/val2017.zip", "range": "bytes=100-", "status": 200}]
    assert _md5(dest) == mini.md5["val2017.zip"]


def test_complete_part_is_finished_without_refetching(mini, server, tmp_path):
    (tmp_path / "v.zip.part").write_bytes((mini.serve / "zips" / "val2017.zip").read_bytes())
    dest = download(
        server.url + "/zips/val2017.zip", tmp_path / "v.zip", md5=mini.md5["val2017.zip"]
    )
    assert [r["status"] for r in server.requests] == [416]
    assert _md5(dest) == mini.md5["val2017.zip"]


def test_5xx_is_retried_and_4xx_is_not(mini, server, tmp_path):
    server.state.fail_once["/zips/val2017.zip"] = 503
    download(server.url + "/zips/val2017.zip", tmp_path / "v.zip", backoff=0)
    assert [r["status"] for r in server.requests] == [503, 200]
    with pytest.raises(DistinctcapError, match="HTTP 404"):
        download(server.url + "/zips/nope.zip", tmp_path / "nope.zip", backoff=0)
    assert [r["status"] for r in server.requests][2:] == [404]


def test_checksum_mismatch_names_file_expected_and_got(mini, server, tmp_path):
    dest = tmp_path / "val2017.zip"
    with pytest.raises(DistinctcapError) as err:
        download(server.url + "/zips/val2017.zip", dest, md5="0" * 32)
    message = str(err.value)
    assert "val2017.zip.part" in message and "0" * 32 in message
    assert mini.md5["val2017.zip"] in message
    assert not dest.exists() and not (tmp_path / "val2017.zip.part").exists()
    size = (mini.serve / "zips" / "val2017.zip").stat().st_size
    with pytest.raises(DistinctcapError, match=f"expected {size + 1} bytes, the server has {size}"):
        download(server.url + "/zips/val2017.zip", dest, size=size + 1)
    assert not dest.exists() and not (tmp_path / "val2017.zip.part").exists()


def test_corrupt_existing_download_is_fetched_again(mini, server, tmp_path):
    dest = tmp_path / "val2017.zip"
    dest.write_bytes(b"not the archive")
    download(server.url + "/zips/val2017.zip", dest, md5=mini.md5["val2017.zip"])
    assert _md5(dest) == mini.md5["val2017.zip"] and len(server.requests) == 1


def test_completed_download_is_skipped(mini, server, tmp_path):
    url, dest = server.url + "/zips/val2017.zip", tmp_path / "v.zip"
    download(url, dest, md5=mini.md5["val2017.zip"])
    mtime = dest.stat().st_mtime_ns
    download(url, dest, md5=mini.md5["val2017.zip"])
    download(url, dest)
    assert len(server.requests) == 1 and dest.stat().st_mtime_ns == mtime


# ---------------------------------------------------------------------------------------------
# COCO end to end


def test_karpathy_end_to_end_from_local_server(mini, server, tmp_path):
    cfg = _cfg(mini, server, tmp_path, "karpathy")
    images, captions, root = coco.prepare_tables(cfg)
    assert sorted(r["path"] for r in server.requests) == sorted(
        ["/zips/train2014.zip", "/zips/val2014.zip", KARPATHY_ZIP]
    )
    images, captions, quarantine = check_tables(images, captions, root, "skip")
    assert _split_counts(images) == mini.karpathy_counts and len(quarantine) == 0
    assert set(images[images.split == "val"].image_id) == set(KVAL)
    assert set(images[images.split == "test"].image_id) == set(KTEST)
    assert len(captions) == 5 * len(IDS)
    assert (captions.merge(images, on="image_id").pipe(lambda d: d.split_x == d.split_y)).all()
    first = images.set_index("image_id").loc[IDS[0]]
    assert first.file == f"train2014/COCO_train2014_{IDS[0]:012d}.jpg"
    assert (first.width, first.height) == (32 + 8 * (IDS[0] % 3), 24)
    assert (root / first.file).is_file()

    coco.prepare_tables(cfg)  # rerun: downloads and extraction are skipped
    assert len(server.requests) == 3


def test_mrnn_end_to_end_from_local_server(mini, server, tmp_path):
    cfg = _cfg(mini, server, tmp_path, "mrnn", mrnn_val_images=3)
    images, captions, quarantine = coco.build_tables(
        coco.fetch(coco.CocoConfig.from_dict(cfg)), "mrnn", mrnn_val_images=3
    )
    assert sorted(r["path"] for r in server.requests) == sorted(
        ["/zips/train2017.zip", "/zips/val2017.zip", "/annotations/annotations_trainval2017.zip"]
    )
    assert _split_counts(images) == mini.mrnn_counts and len(quarantine) == 0
    ordered = sorted(VAL2017)  # the first 3 by image id are val, the rest test
    assert set(images[images.split == "val"].image_id) == set(ordered[:3])
    assert set(images[images.split == "test"].image_id) == set(ordered[3:])
    assert images.set_index("image_id").file[IDS[0]] == f"train2017/{IDS[0]:012d}.jpg"
    assert set(captions.split) == {"train", "val", "test"}


def test_mrnn_val_images_must_leave_a_test_split(mini):
    with pytest.raises(DistinctcapError, match="mrnn_val_images = 5 leaves no test"):
        coco.build_tables(mini.tree, "mrnn", mrnn_val_images=5)


def test_local_root_needs_no_server(mini):
    cfg = {"root": str(mini.tree), "base_url": "http://127.0.0.1:9", "split": "karpathy"}
    images, captions, root = coco.prepare_tables(cfg)
    assert root == mini.tree and len(images) == len(IDS)
    images, _, _ = coco.build_tables(mini.tree, "mrnn", mrnn_val_images=3)
    assert _split_counts(images) == mini.mrnn_counts


def test_local_root_missing_files_are_named(mini, tmp_path):
    shutil.copytree(mini.tree / "train2014", tmp_path / "train2014")
    with pytest.raises(DistinctcapError, match="lacks val2014, dataset_coco.json") as err:
        coco.prepare_tables({"root": str(tmp_path)})
    assert "split 'karpathy'" in str(err.value)
    with pytest.raises(DistinctcapError, match="lacks train2017, val2017, annotations/"):
        coco.build_tables(tmp_path, "mrnn")


def test_extraction_resumes_and_is_skipped_when_done(mini, tmp_path):
    zip_path = mini.serve / "zips" / "val2017.zip"
    coco.extract(zip_path, tmp_path)
    member = tmp_path / "val2017" / f"{VAL2017[0]:012d}.jpg"
    good = member.read_bytes()
    member.write_bytes(good[:10])  # as if interrupted while writing this member
    coco.extract(zip_path, tmp_path)  # done-file present: skipped, damage stays
    assert member.stat().st_size == 10
    (tmp_path / ".val2017.zip.done").unlink()
    coco.extract(zip_path, tmp_path)
    assert member.read_bytes() == good


def test_zips_are_removed_only_after_their_extraction_finished(mini, server, tmp_path):
    cfg = _cfg(mini, server, tmp_path, "karpathy", keep_zips=False)
    _, _, root = coco.prepare_tables(cfg)
    assert list((root / "zips").glob("*.zip")) == []
    first = coco.prepare_tables(cfg)[0]
    assert len(server.requests) == 3  # the rerun trusts the done-files: nothing fetched again
    assert len(first) == len(IDS)

    zip_path = mini.serve / "zips" / "val2017.zip"
    copy = shutil.copy(zip_path, tmp_path / "val2017.zip")
    assert not coco.remove_extracted_zip(copy, tmp_path / "out")  # never extracted: kept
    coco.extract(copy, tmp_path / "out")
    (tmp_path / "out" / "zips").mkdir()
    moved = shutil.move(copy, tmp_path / "out" / "zips" / "val2017.zip")
    assert coco.remove_extracted_zips(tmp_path / "out") == [Path(moved)]
    assert not Path(moved).exists()


def test_config_and_url_rebasing():
    assert coco.rebase_url("https://cs.stanford.edu/a/b.zip?x=1", "http://127.0.0.1:81") == (
        "http://127.0.0.1:81/a/b.zip?x=1"
    )
    assert coco.rebase_url("http://images.cocodataset.org/zips/v.zip", "http://m.org/coco/") == (
        "http://m.org/coco/zips/v.zip"
    )
    assert coco.rebase_url("http://h/x", None) == "http://h/x"
    with pytest.raises(DistinctcapError, match="unknown key data.coco.spilt"):
        coco.CocoConfig.from_dict({"spilt": "mrnn"})
    with pytest.raises(DistinctcapError, match="data.coco.split = 'flickr'"):
        coco.CocoConfig.from_dict({"split": "flickr"})
    official = coco.archives(coco.CocoConfig())
    assert [a.url for a in official] == [
        "http://images.cocodataset.org/zips/train2014.zip",
        "http://images.cocodataset.org/zips/val2014.zip",
        "https://cs.stanford.edu/people/karpathy/deepimagesent/caption_datasets.zip",
    ]
    assert official[0].md5 == "0da8c0bd3d6becc4dcb32757491aca88"


# ---------------------------------------------------------------------------------------------
# normalisation


def test_normalize_caption():
    assert normalize_caption("A Man's  RED-hat, on   the\ttable.") == (
        "a mans red hat on the table"
    )
    assert normalize_caption("Two dogs;   playing!!  ") == "two dogs playing"
    assert normalize_caption("ÉLAN café_bar 3rd") == "élan café bar 3rd"
    assert normalize_caption("one two three four", max_words=2) == "one two"
    assert normalize_caption("...!?") == ""


def test_captions_are_normalised_and_truncated_in_the_table(mini):
    _, captions, _ = coco.build_tables(mini.tree, "karpathy")
    text = captions.set_index("caption_id").text
    assert text[caption_id(IDS[0], 0)] == " ".join(f"word{i}" for i in range(20))
    assert text[caption_id(IDS[0], 1)] == "a mans red hat on the table"
    _, captions, _ = coco.build_tables(mini.tree, "mrnn", max_words=3, mrnn_val_images=3)
    assert captions.set_index("caption_id").text[caption_id(IDS[0], 0)] == "word0 word1 word2"


# ---------------------------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize("split", ["karpathy", "mrnn"])
@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_bad_input_is_quarantined_or_fails(defect, split, tmp_path):
    mini = build_minicoco(tmp_path, defects=(defect,), zips=False)
    kind, item = DEFECTS[defect]
    images, captions, quarantine = coco.build_tables(mini.tree, split, mrnn_val_images=3)
    first = quarantine.iloc[0]
    assert (first.kind, first.id) == (kind, str(item))
    reason = {
        "truncated_jpeg": "unreadable image",
        "missing_file": "missing file",
        "empty_caption": "empty caption",
        "non_utf8_caption": "not valid UTF-8",
        "duplicate_image_id": "duplicate image_id",
        "duplicate_caption_id": "duplicate caption_id",
    }[defect]
    assert reason in first.reason
    if kind == "image" and defect != "duplicate_image_id":
        assert item not in set(images.image_id)  # and its five captions went with it
        assert (quarantine.kind == "caption").sum() == 5 and len(quarantine) == 6
        assert item not in set(captions.image_id)
    elif defect == "duplicate_image_id" and split == "karpathy":  # the twin lists 5 captions
        assert quarantine.reason.tolist()[1:] == [
            f"repeats a caption of image {item}, whose id is listed twice"] * 5
        assert (captions.image_id == item).sum() == 5
    else:
        assert len(quarantine) == 1
    if kind == "caption" and defect != "duplicate_caption_id":
        assert item not in set(captions.caption_id)
    assert (images.image_id.value_counts() == 1).all()
    assert (captions.caption_id.value_counts() == 1).all()
    assert all(isinstance(t, str) for t in captions.text)

    with pytest.raises(DistinctcapError, match=rf"\b{kind} {item}\b.*{reason}"):
        coco.build_tables(mini.tree, split, on_bad_input="fail", mrnn_val_images=3)


def test_non_utf8_caption_keeps_its_bytes_for_the_report(tmp_path):
    mini = build_minicoco(tmp_path, defects=("non_utf8_caption",), zips=False)
    _, captions = coco.read_tables(mini.tree, "karpathy")
    assert captions.set_index("caption_id").text[DEFECTS["non_utf8_caption"][1]] == BAD_BYTES


def test_an_image_whose_captions_are_all_quarantined_is_quarantined_too(tmp_path):
    """The probe emptied every caption of test image 122: the image stayed, and the run died at
    `evaluate` after every training run ("image ids [122] have no test captions")."""
    mini = build_minicoco(tmp_path, zips=False)
    path = mini.tree / "dataset_coco.json"
    dataset = json.loads(path.read_text())
    (entry,) = [e for e in dataset["images"] if e["cocoid"] == 122]
    for sentence in entry["sentences"]:
        sentence["raw"] = ""
    path.write_text(json.dumps(dataset))
    images, captions, quarantine = coco.build_tables(mini.tree, "karpathy")
    assert 122 not in set(images.image_id)
    assert quarantine.iloc[-1].tolist() == [
        "image", "122", entry["filepath"] + "/" + entry["filename"],
        "no usable caption in its split (test)",
    ]
    assert set(captions.image_id) == set(images.image_id)
    with pytest.raises(DistinctcapError, match="caption .* empty caption"):
        coco.build_tables(mini.tree, "karpathy", on_bad_input="fail")
