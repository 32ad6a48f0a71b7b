"""Atomic writes: a full disk is named with the path, the last good file survives, and the
written file has the mode the umask gives."""

import os
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from distinctcap.core.errors import DistinctcapError
from distinctcap.core.io import atomic_path, read_table, write_table


@pytest.fixture
def tiny_disk(tmp_path):
    """A 512 KiB tmpfs, unmounted afterwards; skips where mounting is not permitted."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_full_disk_names_the_path_and_keeps_the_last_checkpoint(tiny_disk):
    path = tiny_disk / "model.pt"
    torch.save({"step": 1}, path)
    good = path.read_bytes()
    with pytest.raises(DistinctcapError, match=rf"no space left on device writing {path} "):
        with atomic_path(path) as tmp:
            torch.save({"weights": torch.zeros(1 << 20)}, tmp)  # 4 MiB
    assert path.read_bytes() == good
    assert [p.name for p in tiny_disk.iterdir()] == ["model.pt"]


def test_a_full_disk_names_the_table(tiny_disk):
    path = tiny_disk / "scores.parquet"
    noise = np.random.default_rng(0).random(200_000)  # incompressible, 1.6 MB
    with pytest.raises(DistinctcapError, match=rf"no space left on device writing {path} "):
        write_table(pd.DataFrame({"x": noise}), path)
    assert list(tiny_disk.iterdir()) == []


def test_enospc_inside_the_block_names_the_path(tmp_path):
    path = tmp_path / "out.json"
    with pytest.raises(DistinctcapError, match=f"no space left on device writing {path}") as info:
        with atomic_path(path), open("/dev/full", "wb") as full:
            full.write(b"x")
            full.flush()
    assert isinstance(info.value.__cause__, OSError)
    assert list(tmp_path.iterdir()) == []
    # the probe: Snakemake had removed the job's outputs, one written correctly among them,
    # while the message said "any previous out.json is kept"
    assert "is kept" not in str(info.value)
    assert "free space and rerun" in str(info.value)
    assert "Snakemake removes every output of a failed job" in str(info.value)


def test_other_errors_pass_unchanged(tmp_path):
    with pytest.raises(KeyError), atomic_path(tmp_path / "out.json"):
        raise KeyError("x")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_results_follow_the_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        write_table(pd.DataFrame({"x": [1]}), tmp_path / "t.parquet")
        with atomic_path(tmp_path / "m.pt") as tmp:
            torch.save({}, tmp)
    finally:
        os.umask(old)
    for name in ("t.parquet", "m.pt"):
        assert Path(tmp_path / name).stat().st_mode & 0o777 == mode, name
    assert read_table(tmp_path / "t.parquet").x.tolist() == [1]
