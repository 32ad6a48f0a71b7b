"""Rewrite a wheel without its Java parts: pycocoevalcap's 104 MB wheel is over what a device
call carries (64 MiB), and its jars and METEOR's paraphrase table serve Java, which the GPU
machine lacks. The Python files stay, so `import pycocoevalcap...` works there (the GPU check's
evaluate stage imports the metrics modules but starts no Java). RECORD is rewritten with the
kept files' hashes, as pip checks it.

    python bench/gpu/trim_wheel.py WHEEL OUT_FOLDER
"""

from __future__ import annotations

import base64
import hashlib
import sys
import zipfile
from pathlib import Path

DROP = (".jar", ".gz")  # the Java tools and METEOR's data


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def trim(wheel: Path, out_dir: Path) -> Path:
    out = out_dir / wheel.name
    tmp = out.with_suffix(".part")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        names = [n for n in src.namelist() if not n.endswith(DROP)]
        record = next(n for n in names if n.endswith(".dist-info/RECORD"))
        lines = []
        for name in names:
            if name != record:
                data = src.read(name)
                dst.writestr(name, data)
                lines.append(record_line(name, data))
        dst.writestr(record, "\n".join([*lines, f"{record},,"]) + "\n")
    tmp.replace(out)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[-1].strip())
    path = trim(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"trim_wheel: {path} ({path.stat().st_size / 1e6:.1f} MB, no jars)")
