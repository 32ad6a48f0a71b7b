"""`distinctcap evaluate` on any file (issue 47): results files drawn in every shape (not JSON,
deep, not a list, entries of every type, ids that are floats, infinities, booleans, padded or
huge, captions that are not text or not UTF-8, too many samples of one image, too large) are
read into a generated table that passes its contract, or stopped with one line, never a
traceback; one scored end to end; SIGTERM and SIGINT leave no temporary files.

On the evaluation world of tests/evaluate_world.py (12 test images, random CLIP), built once.
Seeded, so CI draws the same files every time.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from conftest import ROOT
from evaluate_world import build, config
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import write_table
from distinctcap.runs import resultsfile as rf
from distinctcap.runs.cli import main

EXAMPLES = 300


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    world = build(tmp_path_factory.getbasetemp() / "evaluate-world")
    (world.root / "config.yaml").write_text(yaml.safe_dump(config()))
    return world


@pytest.fixture(scope="module")
def data(world):
    return rf.DataFolder.open(world.root / "data")


def split_ids(data, split: str) -> list[int]:
    return sorted(data.images[data.images.split == split].image_id.astype(int).tolist())


def ids(data):
    """Image ids of every kind: scorable, of another split, unknown, and not ids at all."""
    test, train = split_ids(data, "test"), split_ids(data, "train")
    edges = [-1, 0, 10**6, 2**63, -(2**63) - 1, 10**30, 280.9, 280.0, 1e400, math.nan, math.inf,
             -math.inf, True, False, None, "", " 34 ", "+34", "-34", "٣٤", "34a", "9" * 40,
             [], [34], {}, {"id": 34}]  # fmt: skip
    return st.one_of(
        st.sampled_from(test),
        st.sampled_from(test).map(str),
        st.sampled_from(train),
        st.sampled_from(edges),
        st.integers(),
        st.floats(),
        st.text(max_size=8),
    )


def captions():
    return st.one_of(
        st.sampled_from(["a red circle", "  ", "", "a\nblue\tsquare", "\ud800 lone", "x" * 300,
                         "ünïcødé ✓ 🙂", "a\x00b"]),  # fmt: skip
        st.text(max_size=40),
        st.none(),
        st.integers(),
        st.lists(st.text(max_size=3), max_size=2),
    )


def entries(data):
    entry = st.fixed_dictionaries({"image_id": ids(data), "caption": captions()})
    partial = st.dictionaries(st.sampled_from(["image_id", "caption", "x"]),
                              st.one_of(ids(data), captions()), max_size=3)  # fmt: skip
    other = st.one_of(st.none(), st.integers(), st.text(max_size=5), st.lists(st.integers()))
    return st.one_of(entry, entry, entry, partial, other)


def repeated(data):
    """One test image's samples, up to past the cap."""
    n = st.integers(0, rf.MAX_SAMPLES_PER_IMAGE + 5)
    image = st.sampled_from(split_ids(data, "test"))
    return st.tuples(image, n).map(lambda t: [{"image_id": t[0], "caption": f"a red circle {k}"}
                                              for k in range(t[1])])  # fmt: skip


def files(data):
    """A results file's bytes: JSON lists of drawn entries, other JSON, nesting, broken text."""
    listed = st.tuples(st.lists(entries(data), max_size=20), repeated(data)).map(
        lambda t: json.dumps([*t[0], *t[1]]).encode()
    )
    other = st.one_of(st.none(), st.integers(), st.text(), st.dictionaries(st.text(), st.none()))
    other_json = other.map(lambda v: json.dumps(v).encode())
    nested = st.integers(1, 5000).map(lambda d: b"[" * d + b"]" * d)
    broken = st.one_of(st.binary(max_size=50), st.just(b'[{"image_id": 34, "caption": "a"'),
                       st.just(b"\xff\xfe[]"))  # fmt: skip
    return st.one_of(listed, listed, listed, other_json, nested, broken)


def test_drawn_results_files_read_or_stop_with_one_line(data, tmp_path_factory):
    folder = tmp_path_factory.mktemp("drawn")
    path = folder / "drawn.json"
    test = set(split_ids(data, "test"))
    outcomes = {"read": 0, "stopped": 0}

    @seed(47)
    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(files(data))
    def drawn(raw):
        path.write_bytes(raw)
        try:
            results = rf.read_results(path, data, "test")
        except DistinctcapError as error:
            assert "\n" not in str(error) and str(path) in str(error), str(error)
            outcomes["stopped"] += 1
            return
        generated = results.generated
        write_table(generated, folder / "generated.parquet", "generated")  # what score writes
        assert set(generated.image_id) <= test
        assert generated.groupby("image_id").size().max() <= rf.MAX_SAMPLES_PER_IMAGE
        assert all("\n" not in line for line in rf.problem_lines(results))
        outcomes["read"] += 1

    drawn()
    print(outcomes)
    assert min(outcomes.values()) >= EXAMPLES // 10, outcomes


@pytest.mark.parametrize("value, expected", [
    (34, 34), ("34", 34), ("0034", 34), (-5, -5), (280.9, None), (280.0, None), (True, None),
    (" 281 ", None), ("+1", None), ("٣٤", None), (math.inf, None), (2**63, None), ("9" * 19, None),
])  # fmt: skip
def test_an_image_id_is_an_integer_or_a_string_of_ascii_digits(value, expected):
    assert rf.image_id(value) == expected


def test_a_file_larger_than_the_data_can_need_is_refused_unread(data, tmp_path):
    n_images = len(split_ids(data, "test"))
    path = tmp_path / "big.json"
    room = n_images * rf.MAX_SAMPLES_PER_IMAGE * rf.MAX_ENTRY_BYTES
    path.write_bytes(b"[" + b" " * room + b"]")
    with pytest.raises(DistinctcapError, match=r"MB is more than .* nothing was read$"):
        rf.read_results(path, data, "test")


def test_a_file_nested_200000_deep_is_one_line(data, tmp_path):
    path = tmp_path / "deep.json"
    path.write_bytes(b"[" * 200_000 + b"]" * 200_000)
    with pytest.raises(DistinctcapError, match="nested too deeply"):
        rf.read_results(path, data, "test")


def evaluate(world, *files, env=None, **popen):
    """`distinctcap evaluate FILES` on the world as a user runs it, in a process of its own."""
    cmd = [sys.executable, "-m", "distinctcap", "evaluate", *map(str, files),
           "--data", str(world.root / "data"), "--configfile", str(world.root / "config.yaml")]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **popen)  # fmt: skip


def good_entries(data) -> list[dict]:
    return [{"image_id": str(i) if k % 2 else i, "caption": f"a red circle ✓ number {k}"}
            for k, i in enumerate(split_ids(data, "test"))]  # fmt: skip


def test_unusual_entries_are_set_aside_one_line_each_and_the_rest_scored(world, data, tmp_path,
                                                                         capsys):  # fmt: skip
    test = split_ids(data, "test")
    odd = [{"image_id": 280.9, "caption": "a"}, {"image_id": f" {test[0]} ", "caption": "a"},
           {"image_id": True, "caption": "a"}, {"image_id": test[1], "caption": "a \ud800"}]
    path = tmp_path / "mine.json"
    path.write_text(json.dumps([*good_entries(data), *odd]))
    code = main(["evaluate", str(path), "--data", str(world.root / "data"),
                 "--configfile", str(world.root / "config.yaml")])  # fmt: skip
    printed = capsys.readouterr()
    assert code == 1 and "| mine | 12 | 1 |" in printed.out, printed
    for reason in ("(280.9)", f'(" {test[0]} ")', "(true)", "not valid UTF-8"):
        assert reason in printed.err, printed.err
    assert "set aside 4 entries" in printed.err and "Traceback" not in printed.err


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_evaluate_removes_its_temporary_files(world, data, tmp_path, signum):
    path, tmp = tmp_path / "mine.json", tmp_path / "tmp"
    path.write_text(json.dumps(good_entries(data)))
    tmp.mkdir()
    proc = evaluate(world, path, env={"TMPDIR": str(tmp)})
    deadline = time.monotonic() + 120
    while not any(tmp.glob("distinctcap-evaluate-*")) and proc.poll() is None:
        assert time.monotonic() < deadline, "evaluate never started scoring"
        time.sleep(0.02)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, err
    assert err.strip().splitlines()[-1] == (
        f"distinctcap evaluate: stopped by {signal.Signals(signum).name}; temporary files "
        "removed; run the same command again to finish it"
    )
    left = list(tmp.glob("distinctcap-*"))  # torch may leave its own caches (torchinductor_*)
    assert "Traceback" not in err and not left, (err, left)
