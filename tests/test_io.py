"""Atomic writes: a full disk is named with the path and the last good file survives."""

import subprocess

import numpy as np
import pandas as pd
import pytest
import torch

from distinctcap.errors import DistinctcapError
from distinctcap.io import atomic_path, write_table


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


def test_other_errors_pass_unchanged(tmp_path):
    with pytest.raises(KeyError), atomic_path(tmp_path / "out.json"):
        raise KeyError("x")
    assert list(tmp_path.iterdir()) == []
