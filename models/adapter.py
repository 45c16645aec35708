"""The shipped tool-use LoRA adapter of the embedded model, merged into its weights at load.

`adapters/smollm2_tools/` holds a peft adapter (adapter_config.json + fp16 adapter_model.safetensors,
trained by `python -m train.lora`) for SmolLM2-135M-Instruct. When the embedded GGUF is served, its
converted float folder is merged with the adapter once (W += alpha/r * B @ A for every adapted
projection) into a sibling folder keyed by the adapter's content, built under a file lock like the
conversion itself; later starts reuse it. On by default: the base model calls no held-out tool by
itself, the tuned one most of them (docs/performance.md, issue 44); CHATLOOM_EMBEDDED_ADAPTER=0 serves
the base weights (the tests do, to compare with HF on the file as it is).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from pathlib import Path

log = logging.getLogger("chatloom.engine")

SHIPPED = Path(__file__).with_name("adapters") / "smollm2_tools"
ENV_SWITCH = "CHATLOOM_EMBEDDED_ADAPTER"
MARKER = "chatloom-merged.json"
_KEY = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_A(?:\.default)?\.weight$")


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "off", "false", "no")


def adapter_digest(adapter: Path) -> str:
    h = hashlib.sha256()
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        h.update((adapter / name).read_bytes())
    return h.hexdigest()[:16]


def for_embedded(gguf_path: str | os.PathLike, converted: Path, adapter: Path = SHIPPED) -> Path:
    """The folder to serve for a converted GGUF: merged with the shipped adapter when the file is the
    embedded model's and the adapter ships (and is not switched off), else `converted` unchanged."""
    from models.gguf import embedded_gguf

    if not enabled() or not (adapter / "adapter_model.safetensors").is_file():
        return converted
    embedded = embedded_gguf()
    if embedded is None or Path(gguf_path).resolve() != embedded.resolve():
        return converted
    return merged_dir(converted, adapter)


def merged_dir(base: Path, adapter: Path) -> Path:
    """`base` merged with `adapter`, built once (under a lock) beside `base`."""
    from filelock import FileLock

    folder = base.parent / f"{base.name}-{adapter.name}-{adapter_digest(adapter)}"
    if (folder / MARKER).is_file():
        return folder
    with FileLock(str(folder.parent / f"{folder.name}.lock")):
        if (folder / MARKER).is_file():
            return folder
        tmp = folder.parent / f".{folder.name}.building-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(folder, ignore_errors=True)
        try:
            merge(base, adapter, tmp)
            tmp.rename(folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return folder


def merge(base: Path, adapter: Path, dest: Path) -> Path:
    """Write `base`'s checkpoint with the LoRA deltas added into `dest` (MARKER last)."""
    import torch
    from safetensors.torch import load_file, save_file

    config = json.loads((adapter / "adapter_config.json").read_text())
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise ValueError(f"adapter {adapter}: per-module ranks or alphas are not supported")
    rank = float(config["r"])
    scale = float(config["lora_alpha"]) / (rank**0.5 if config.get("use_rslora") else rank)
    lora = load_file(str(adapter / "adapter_model.safetensors"))
    files = sorted(base.glob("*.safetensors"))
    if len(files) != 1:
        raise ValueError(f"{base}: expected one safetensors file to merge into, found {len(files)}")
    weights = load_file(str(files[0]))
    merged = 0
    for key, a in lora.items():
        m = _KEY.match(key)
        if m is None:
            continue
        target = m.group("module") + ".weight"
        b = lora[key.replace(".lora_A", ".lora_B")]
        if target not in weights:
            raise ValueError(f"adapter {adapter} adapts {target!r}, which {base} lacks")
        w = weights[target]
        delta = scale * (b.to(torch.float32) @ a.to(torch.float32))  # (out, r) @ (r, in)
        if delta.shape != w.shape:
            raise ValueError(f"adapter delta for {target!r} is {tuple(delta.shape)}, weight {tuple(w.shape)}")
        weights[target] = (w.to(torch.float32) + delta).to(w.dtype)
        merged += 1
    if not merged:
        raise ValueError(f"adapter {adapter} holds no LoRA weights")
    dest.mkdir(parents=True, exist_ok=True)
    for item in base.iterdir():
        if item.is_file() and item.suffix != ".safetensors" and not item.name.startswith("chatloom-"):
            shutil.copy2(item, dest / item.name)
    save_file(weights, str(dest / files[0].name), metadata={"format": "pt"})
    info = {"base": str(base), "adapter": str(adapter), "digest": adapter_digest(adapter), "merged": merged}
    (dest / MARKER).write_text(json.dumps(info, indent=1))
    log.info("merged the tool-use adapter into %d projections of %s", merged, base.name)
    return dest
