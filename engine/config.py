"""EngineConfig: every engine knob in one validated dataclass, passed down whole."""

from __future__ import annotations

from dataclasses import dataclass, field

_DTYPES = ("float32", "float16", "bfloat16", "auto")
_LOAD_FORMATS = ("auto", "safetensors", "dummy")
_QUANTIZATIONS = ("none", "int8", "int4")


@dataclass
class EngineConfig:
    model: str = ""
    # tokens a KV-cache block holds; None: 32 on CUDA (the step's block-table rows, uploaded, copied
    # into the graph and held by the decode attention, are half as wide as with 16), 16 on the CPU
    block_size: int | None = None
    num_kv_blocks: int | None = None  # None: size the pool from memory (see gpu_memory_utilization)
    gpu_memory_utilization: float = 0.85  # fraction of free device memory the KV pool may take
    cpu_kv_cache_bytes: int = 256 << 20  # KV pool budget on the CPU when num_kv_blocks is None
    max_num_seqs: int = 256
    # token budget of one step (prefill chunks + decodes); None: 8192 on CUDA, 2048 on the CPU (a CPU
    # step's activations and scratch grow with it, and a long step stalls every stream's next token)
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None  # None: the checkpoint's max_position_embeddings
    dtype: str = "auto"  # auto: bfloat16 on CUDA, float32 on CPU
    device: str = "auto"  # auto: cuda when available, else cpu
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    enforce_eager: bool = False  # no CUDA graphs
    # prepare step N+1 while the device runs step N; None: on CUDA only (no gain on the CPU)
    async_scheduling: bool | None = None
    # with async scheduling, a step whose rows read the previous tokens on the host (grammars,
    # penalties, logits processors) prepares the next step before it launches its sampling, and
    # launches the next forward right after: the device no longer waits for that preparation
    launch_ahead: bool = True
    # CUDA: grammar mask rows cached on the device by grammar state (~19 KB each at a 152k vocabulary),
    # applied inside the fused sampler; 0: masks are uploaded whole each step and applied apart
    device_mask_rows: int = 4096
    # CUDA: a decode step's fused sampling replays a captured graph (captured on first use), and small
    # decode batches of plain rows are sampled inside the forward's graph (cuda_graphs.DecodeGraphs)
    sampler_graphs: bool = True
    seed: int = 0
    load_format: str = "auto"
    tokenizer: str | None = None  # defaults to the model folder
    hf_overrides: dict = field(default_factory=dict)  # config fields for load_format="dummy" shapes
    cuda_graph_sizes: list[int] | None = None  # batch sizes captured; None: a ladder up to max_num_seqs
    # a lone prefill chunk of up to this many tokens (a chat turn over a cached history) replays a
    # captured graph; 0: always eager
    prefill_graph_max_tokens: int = 512
    # CUDA: a step with prefill chunks (any mix of sequences) of up to this many tokens replays a
    # captured graph (runner.batch_graphs), capped at max_num_batched_tokens; 0: always eager
    batch_graph_max_tokens: int = 8192
    num_threads: int | None = None  # torch CPU threads
    # CPU: the projections' and lm_head's weights quantized at load ("int8" per row, "int4" per group
    # of 32), products on torch's packed kernels (kernels.quant_linear); "none": float, exact
    quantization: str = "none"
    # CPU: a quantized model's decode-only steps run as one torch.compile'd program (runner.cpu_step; the
    # first decode step of each shape class compiles); None: on where it applies (CPU, int8 or int4),
    # False: eager
    cpu_compile: bool | None = None
    # speculative decoding (engine.speculative): off | ngram (prompt lookup) | draft (draft_model: a
    # smaller checkpoint, same tokenizer); on, async scheduling is off (proposals read host tokens)
    speculative_method: str = "off"
    num_speculative_tokens: int = 4  # most tokens proposed per sequence and step
    draft_model: str | None = None

    def __post_init__(self) -> None:
        def positive(name: str) -> None:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"EngineConfig.{name} must be a positive integer, got {value!r}")

        for name in ("max_num_seqs", "num_speculative_tokens"):
            positive(name)
        if self.max_num_batched_tokens is not None:
            positive("max_num_batched_tokens")
        if self.block_size is not None:
            positive("block_size")
            if self.block_size & (self.block_size - 1):
                raise ValueError(f"EngineConfig.block_size must be a power of two, got {self.block_size}")
        for name in ("prefill_graph_max_tokens", "batch_graph_max_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"EngineConfig.{name} must be a non-negative integer, got {value!r}")
        if self.num_kv_blocks is not None:
            positive("num_kv_blocks")
        method = self.speculative_method
        if method not in ("off", "ngram", "draft"):
            raise ValueError(f"EngineConfig.speculative_method must be off, ngram or draft: {method!r}")
        if (self.speculative_method == "draft") != bool(self.draft_model):
            raise ValueError("EngineConfig.draft_model is needed with (only with) speculative_method 'draft'")
        if self.max_model_len is not None:
            positive("max_model_len")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(
                f"EngineConfig.gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}"
            )
        if self.dtype not in _DTYPES:
            raise ValueError(f"EngineConfig.dtype must be one of {_DTYPES}, got {self.dtype!r}")
        if self.cpu_compile not in (None, True, False):
            raise ValueError(f"EngineConfig.cpu_compile must be True, False or None: {self.cpu_compile!r}")
        if self.quantization not in _QUANTIZATIONS:
            raise ValueError(
                f"EngineConfig.quantization must be one of {_QUANTIZATIONS}, got {self.quantization!r}"
            )
        if self.quantization != "none" and self.device not in ("auto", "cpu"):
            raise ValueError("EngineConfig.quantization runs on the CPU only (device='cpu')")
        if self.load_format not in _LOAD_FORMATS:
            raise ValueError(
                f"EngineConfig.load_format must be one of {_LOAD_FORMATS}, got {self.load_format!r}"
            )
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ValueError(f"EngineConfig.device must be 'auto', 'cpu' or 'cuda[:N]', got {self.device!r}")
        if (
            not self.enable_chunked_prefill
            and self.max_model_len is not None
            and self.max_num_batched_tokens is not None
            and self.max_num_batched_tokens < self.max_model_len
        ):
            raise ValueError(
                "EngineConfig.max_num_batched_tokens must be >= max_model_len when chunked prefill is off"
            )

    def resolve_device(self) -> str:
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    def resolve_block_size(self, device: str) -> int:
        if self.block_size is not None:
            return self.block_size
        return 32 if device.startswith("cuda") else 16

    def resolve_max_num_batched_tokens(self, device: str) -> int:
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        if device.startswith("cuda") or not self.enable_chunked_prefill:  # unchunked: a prompt per step
            return 8192
        return 2048

    def resolve_dtype(self, device: str):
        import torch

        if self.dtype == "auto":
            return torch.bfloat16 if device.startswith("cuda") else torch.float32
        return getattr(torch, self.dtype)
