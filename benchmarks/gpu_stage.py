"""Stage what `benchmarks/gpu_linearize.sh` needs on an offline GPU machine, in parts that fit one call each.

    python benchmarks/gpu_stage.py [--out .gpu]

The GPU machine reaches no registry and receives at most 64 MiB per call (working tree
included), while SmolLM2's GGUF alone is 98 MB. So this writes two folders, each sent with one
call (as an ignored, carried path; the first stays on the warm machine for the second):

- ``.gpu/a/``: the first part of the GGUF;
- ``.gpu/b/``: the rest, the GGUF's sha256, the training split of the default corpus
  (gzip; the held-out documents never leave this machine, so `lola perplexity` here measures
  on text the GPU run never saw), and the wheels the machine's image lacks (``gguf``).

Then, on the GPU machine: ``bash benchmarks/gpu_linearize.sh`` (see its header).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from lola import models
from lola.data.text import load_split


def working_tree_bytes() -> int:
    """Bytes of what travels with every call: tracked files and untracked ones git does not ignore."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], capture_output=True, check=True).stdout
    paths = [Path(p.decode()) for p in listed.split(b"\0") if p]
    return sum(p.stat().st_size for p in paths if p.is_file())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=".gpu", help="staging folder (add it to .git/info/exclude)")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    args = parser.parse_args()
    out = Path(args.out)
    a, b = out / "a", out / "b"
    for d in (a, b):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)

    train, _ = load_split(None, 0.1)
    with gzip.open(b / "train.txt.gz", "wt", encoding="utf-8") as f:
        f.write(train)

    gguf = models.fetch(args.model)
    data = gguf.read_bytes()
    cut = (len(data) + (b / "train.txt.gz").stat().st_size) // 2  # both transfers about the same size
    (a / "model.gguf.part").write_bytes(data[:cut])
    (b / "model.gguf.part").write_bytes(data[cut:])
    (b / "model.sha256").write_text(f"{hashlib.sha256(data).hexdigest()}  {gguf.name}\n")

    wheels = b / "wheels"
    wheels.mkdir()
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(wheels), "gguf>=0.10"], check=True)

    tree = working_tree_bytes()
    for d in (a, b):
        size = sum(p.stat().st_size for p in d.rglob("*") if p.is_file())
        total = (size + tree) / 2**20
        print(f"{d}: {size / 2**20:.1f} MiB (+ the working tree: {total:.1f} MiB per transfer{'; over the 64 MiB limit!' if total > 64 else ''})")
    print(f"training text: {len(train):,} characters; GGUF {len(data):,} bytes in two parts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
