"""The rows of a second training pass: generated rows whose target calls a round-4 pattern tool,
mixed with a share of the others (so the adapter keeps what the first pass taught).

    python -m train.pass2 --data train/out/round4.jsonl --seed 4 --out train/out/round4_pass2.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from app.chat.tool_parser import parse_whole
from grammar.dialects import GENERIC
from train.generate import END, Generator


def _called(row: dict) -> set[str]:
    """The names of the functions a generated row's targets call."""
    names = set()
    for text, trained in row["segments"]:
        if trained:
            _, calls = parse_whole(text.removesuffix(END), fmt=GENERIC)
            names.update(c.name for c in calls or [])
    return names


def select(lines: list[str], names: set[str], pattern: int, other: int, seed: int) -> list[str]:
    """`pattern` rows calling a tool of `names` and `other` rows of the rest, seeded and shuffled."""
    hits, rest = [], []
    for line in lines:
        (hits if _called(json.loads(line)) & names else rest).append(line)
    rng = random.Random(seed)
    chosen = rng.sample(hits, min(pattern, len(hits))) + rng.sample(rest, min(other, len(rest)))
    rng.shuffle(chosen)
    return chosen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="rows of `train.generate` (jsonl)")
    ap.add_argument("--seed", type=int, default=4, help="the seed the rows were generated with")
    ap.add_argument("--pattern", type=int, default=1100)
    ap.add_argument("--other", type=int, default=700)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    names = {t.name for t in Generator(args.seed).families["pattern"]}
    lines = Path(args.data).read_text().splitlines(keepends=True)
    chosen = select(lines, names, args.pattern, args.other, args.seed)
    Path(args.out).write_text("".join(chosen))
    print(f"wrote {len(chosen)} rows to {args.out}")


if __name__ == "__main__":
    main()
