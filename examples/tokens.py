"""A token file for `data=tokens`, offline: text files as bytes (a byte-level tokenizer: 256 ids, model=gpt's
default vocabulary), written as a flat uint16 array, the layout of nanoGPT's train.bin.

    python -m examples.tokens README.md docs/*.md --out runs/tokens.bin
    python run.py model=gpt data=tokens data.file=runs/tokens.bin

A file from a real tokenizer works the same (`model.vocab_size` at least its largest id + 1)."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)


def write_tokens(texts: Sequence[Path], out: Path) -> int:
    """Every file's bytes, one after another, as uint16 ids; returns how many were written."""
    ids = np.concatenate([np.frombuffer(path.read_bytes(), dtype=np.uint8) for path in texts]).astype(np.uint16)
    out.parent.mkdir(parents=True, exist_ok=True)
    ids.tofile(out)
    return int(ids.size)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("texts", nargs="+", type=Path, help="text files to tokenize, as bytes")
    parser.add_argument("--out", type=Path, default=Path("runs/tokens.bin"), help="the uint16 token file to write")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    missing = [str(p) for p in args.texts if not p.is_file()]
    if missing:
        parser.error(f"not a file: {missing[0]}")
    count = write_tokens(args.texts, args.out)
    log.info("%s: %d tokens (bytes, vocabulary 256)", args.out, count)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
