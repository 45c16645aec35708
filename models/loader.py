"""Load a HF Llama-family checkpoint folder (single or sharded safetensors) into our model, or
fill it with random weights at the real shape (load_format="dummy"). Every parameter must be
loaded exactly once with the right shape."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from models.llama import LlamaForCausalLM

log = logging.getLogger("chatloom.engine")

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "BloomForCausalLM": "bloom",  # ALiBi: models.alibi
    "MptForCausalLM": "mpt",
}
ALIBI_MODEL_TYPES = ("bloom", "mpt")

# HF name fragment -> (our fused parameter, shard index among the fused parts)
_FUSED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


def load_hf_config(model_path: str, overrides: dict | None = None):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path, **(overrides or {}))
    archs = getattr(config, "architectures", None) or []
    arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        named = ", ".join(archs) or f"model_type {config.model_type!r}"
        known = ", ".join(sorted(SUPPORTED_ARCHITECTURES))
        raise ValueError(f"unsupported architecture {named}; chatloom supports {known}")
    if config.model_type == "mpt":  # MPT names its context max_seq_len (raise it with hf_overrides)
        config.max_position_embeddings = config.max_seq_len
    return config


def _fused_slices(model: LlamaForCausalLM) -> dict[str, list[int]]:
    attn = model.layers[0].self_attn
    inter = model.layers[0].mlp.down_proj.in_features
    return {"qkv_proj": [attn.q_size, attn.kv_size, attn.kv_size], "gate_up_proj": [inter, inter]}


def _safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / n for n in names]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors weights in {folder}")
    return files


def checkpoint_tensors(folder: str | Path, progress: bool = False):
    """(file name, tensor name, open file) for every tensor of a folder's safetensors files, a
    progress bar over the files; the caller reads a tensor with `f.get_tensor(name)` only if it
    wants it."""
    from safetensors import safe_open

    files = _safetensors_files(Path(folder))
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(files), desc="loading weights", unit="file")
    try:
        for path in files:
            with safe_open(str(path), framework="pt") as f:
                for hf_name in f.keys():  # noqa: SIM118 (safe_open is not iterable)
                    yield path.name, hf_name, f
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()


@torch.no_grad()
def load_weights(model: LlamaForCausalLM, folder: str | Path, progress: bool = False) -> None:
    folder = Path(folder)
    params = dict(model.named_parameters())
    sizes = _fused_slices(model)
    loaded: dict[str, set[int]] = {name: set() for name in params}
    for file_name, hf_name, f in checkpoint_tensors(folder, progress):
        name = hf_name.removeprefix("model.")
        if "rotary_emb" in name:
            continue
        if name == "lm_head.weight" and model.tie_word_embeddings:
            continue
        shard = None
        for frag, (fused, idx) in _FUSED.items():
            if f".{frag}." in name:
                name, shard = name.replace(f".{frag}.", f".{fused}."), idx
                break
        if name not in params:
            raise ValueError(f"unexpected weight {hf_name!r} in {file_name}")
        tensor = f.get_tensor(hf_name)
        param = params[name]
        if shard is None:
            target = param.data
        else:
            parts = sizes[name.split(".")[-2]]
            start = sum(parts[:shard])
            target = param.data.narrow(0, start, parts[shard])
        if tuple(target.shape) != tuple(tensor.shape):
            raise ValueError(
                f"shape mismatch for {hf_name!r}: checkpoint {tuple(tensor.shape)}, "
                f"model {tuple(target.shape)}"
            )
        target.copy_(tensor)
        key = 0 if shard is None else shard
        if key in loaded[name]:
            raise ValueError(f"weight {hf_name!r} appears twice")
        loaded[name].add(key)
    missing = []
    for name, got in loaded.items():
        want = len(sizes[name.split(".")[-2]]) if name.split(".")[-2] in sizes else 1
        if len(got) != want:
            missing.append(name)
    if missing:
        raise ValueError(f"checkpoint {folder} lacks weights for: {', '.join(missing[:8])}")


@torch.no_grad()
def init_dummy_weights(model: LlamaForCausalLM, seed: int, std: float = 0.02) -> None:
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        elif name.endswith(".bias"):
            p.zero_()
        else:
            p.normal_(0.0, std, generator=gen)


def build_model(config, load_format: str, model_path: str, device: str, dtype, max_positions: int, seed: int):
    if config.model_type in ALIBI_MODEL_TYPES:
        from models.alibi_weights import build_alibi_model

        return build_alibi_model(config, load_format, model_path, device, dtype, max_positions, seed)
    with torch.device(device):
        model = LlamaForCausalLM(config, max_positions)
    model.to(dtype=dtype)
    model.cos_sin = model.cos_sin.float()  # rope table stays fp32
    if load_format == "dummy":
        init_dummy_weights(model, seed, getattr(config, "initializer_range", 0.02))
    else:
        load_weights(model, model_path, progress=True)
    if torch.device(device).type == "cuda" and dtype in (torch.float16, torch.bfloat16):
        # RMSNorm weights folded into the projections after them, so that wide decode steps run no norm
        # launch (kernels.dispatch.folded_decode_layer_tail)
        model.fold_norms()
    return model.eval()
