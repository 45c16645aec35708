"""Load BLOOM and MPT safetensors checkpoints into models.alibi (or fill it with random weights at
the real shape: load_format="dummy"). Every parameter must be loaded exactly once with the right shape.
HF names map onto ours by fragment; BLOOM's per-head qkv rows are reordered to [q; k; v] on the way."""

from __future__ import annotations

import torch

from models.alibi import AlibiForCausalLM

# (HF fragment, ours), applied in order to a name without its "transformer." prefix
_RENAMES = {
    "bloom": (
        ("word_embeddings_layernorm.", "embed_norm."),
        ("word_embeddings.", "embed_tokens."),
        ("h.", "layers."),
        (".input_layernorm.", ".norm1."),
        (".post_attention_layernorm.", ".norm2."),
        (".self_attention.query_key_value.", ".self_attn.qkv."),
        (".self_attention.dense.", ".self_attn.out."),
        (".mlp.dense_h_to_4h.", ".up."),
        (".mlp.dense_4h_to_h.", ".down."),
        ("ln_f.", "norm."),
    ),
    "mpt": (
        ("wte.", "embed_tokens."),
        ("blocks.", "layers."),
        (".norm_1.", ".norm1."),
        (".norm_2.", ".norm2."),
        (".attn.Wqkv.", ".self_attn.qkv."),
        (".attn.out_proj.", ".self_attn.out."),
        (".ffn.up_proj.", ".up."),
        (".ffn.down_proj.", ".down."),
        ("norm_f.", "norm."),
    ),
}


def our_name(arch: str, hf_name: str) -> str:
    name = hf_name.removeprefix("transformer.")
    for frag, ours in _RENAMES[arch]:
        if frag.startswith("."):
            name = name.replace(frag, ours)
        elif name.startswith(frag):  # a top-level module: only at the start of the name
            name = ours + name[len(frag) :]
    return name


def _per_head_to_qkv(tensor: torch.Tensor, num_heads: int) -> torch.Tensor:
    """BLOOM's qkv rows (heads, 3, head_dim) -> (3, heads, head_dim): [q; k; v] as AlibiAttention reads."""
    rest = tensor.shape[1:]
    return tensor.reshape(num_heads, 3, -1, *rest).transpose(0, 1).reshape(tensor.shape)


@torch.no_grad()
def load_alibi_weights(model: AlibiForCausalLM, folder, progress: bool = False) -> None:
    from models.loader import checkpoint_tensors

    spec = model.spec
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for file_name, hf_name, f in checkpoint_tensors(folder, progress):
        name = our_name(spec.arch, hf_name)
        if name == "lm_head.weight" and model.tie_word_embeddings:
            continue
        if name not in params:
            raise ValueError(f"unexpected weight {hf_name!r} in {file_name}")
        if name in loaded:
            raise ValueError(f"weight {hf_name!r} appears twice")
        tensor = f.get_tensor(hf_name)
        param = params[name]
        if tuple(param.shape) != tuple(tensor.shape):
            raise ValueError(
                f"shape mismatch for {hf_name!r}: checkpoint {tuple(tensor.shape)}, "
                f"model {tuple(param.shape)}"
            )
        if spec.qkv_per_head and ".self_attn.qkv." in name:
            tensor = _per_head_to_qkv(tensor, spec.num_heads)
        param.data.copy_(tensor)
        loaded.add(name)
    missing = [n for n in params if n not in loaded]
    if missing:
        raise ValueError(f"checkpoint {folder} lacks weights for: {', '.join(missing[:8])}")


@torch.no_grad()
def init_dummy_alibi_weights(model: AlibiForCausalLM, seed: int, std: float = 0.02) -> None:
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    for name, p in model.named_parameters():
        if name.split(".")[-2] in ("norm", "norm1", "norm2", "embed_norm") and name.endswith(".weight"):
            p.fill_(1.0)
        elif name.endswith(".bias"):
            p.zero_()
        else:
            p.normal_(0.0, std, generator=gen)


def build_alibi_model(config, load_format: str, model_path: str, device: str, dtype, max_positions: int,
                      seed: int) -> AlibiForCausalLM:  # fmt: skip
    with torch.device(device):
        model = AlibiForCausalLM(config, max_positions)
    model.to(dtype=dtype)
    if load_format == "dummy":
        init_dummy_alibi_weights(model, seed, getattr(config, "initializer_range", 0.02))
    else:
        load_alibi_weights(model, model_path, progress=True)
    return model.eval()
