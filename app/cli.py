"""chatloom command line: `serve` (the HTTP API), `bench` (engine benchmarks), `chat` (a terminal chat),
`batch` (a file of OpenAI Batch API requests, offline)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any


class _RefusedApiKeyFlag(argparse.Action):
    """--api-key is gone: a key on the command line is visible to every user in `ps`."""

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(
            "--api-key is not accepted (the command line shows in `ps`): "
            "use --api-key-file PATH or the CHATLOOM_API_KEY environment variable"
        )


def _serve_parser(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="serve the OpenAI-compatible API (and the n8n chat endpoints)",
        description="Serve the API. Every flag can also be set as a CHATLOOM_* environment variable "
        "(e.g. CHATLOOM_API_KEY); flags win.",
    )
    p.add_argument(
        "--model",
        help="checkpoint folder or .gguf file (default: the embedded SmolLM2-135M-Instruct)",
    )
    p.add_argument(
        "--served-model-name", help="the model id clients see (default: the folder or .gguf file name)"
    )
    p.add_argument(
        "--strict-model-names",
        action="store_true",
        default=None,
        help="answer an unknown `model` with 404 instead of serving it anyway",
    )
    p.add_argument("--host", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 8000)")
    p.add_argument(
        "--api-key-file",
        help="file holding the key required as `Authorization: Bearer KEY` on /v1/* (or set "
        "CHATLOOM_API_KEY; never a flag: the command line shows in `ps`)",
    )
    p.add_argument("--api-key", action=_RefusedApiKeyFlag, help=argparse.SUPPRESS)
    p.add_argument(
        "--allowed-host",
        action="append",
        dest="allowed_hosts",
        help="a Host this server answers to, '*.domain' or '*' (repeat; default: localhost, 127.0.0.1, "
        "::1 and --host)",
    )
    p.add_argument("--device", help="auto | cpu | cuda[:N]")
    p.add_argument("--dtype", help="auto | float32 | float16 | bfloat16")
    p.add_argument("--max-model-len", type=int, help="context length (default: the checkpoint's)")
    p.add_argument("--num-kv-blocks", type=int, help="KV cache blocks (default: sized from memory)")
    p.add_argument("--max-num-seqs", type=int, help="most sequences decoded at once")
    _engine_flags(p)
    p.add_argument(
        "--database-url",
        help="SQLAlchemy URL of the conversation store (default: chatloom.db in the data directory)",
    )
    p.add_argument(
        "--data-dir",
        help="folder of the default SQLite store (default: $XDG_DATA_HOME/chatloom, else "
        "~/.local/share/chatloom)",
    )
    p.add_argument(
        "--cors-origin", action="append", dest="cors_origins", help="allowed browser origin (repeat)"
    )
    p.add_argument("--log-level", help="debug | info | warning | error")
    p.add_argument(
        "--tool-call-format",
        choices=["auto", "hermes", "llama3_json", "mistral", "generic"],
        help="how the model writes tool calls (default auto: from its chat template)",
    )


def _json_object(text: str) -> dict:
    import json

    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


# the rest of EngineConfig's knobs (engine/config.py), each also a CHATLOOM_<NAME> variable
_ENGINE_FLAGS: dict[str, tuple[Any, str]] = {
    "block_size": (int, "tokens a KV-cache block holds, a power of two (default: 32 on CUDA, 16 on CPU)"),
    "gpu_memory_utilization": (float, "fraction of free GPU memory the KV cache may take (default 0.85)"),
    "cpu_kv_cache_bytes": (int, "KV cache bytes on the CPU when --num-kv-blocks is unset"),
    "max_num_batched_tokens": (int, "token budget of one engine step (default: 8192 on CUDA, 2048 on CPU)"),
    "enable_prefix_caching": (bool, "reuse the KV blocks of a shared prompt prefix (default on)"),
    "enable_chunked_prefill": (bool, "split long prompts over steps (default on)"),
    "enforce_eager": (bool, "no CUDA graphs (debugging)"),
    "async_scheduling": (bool, "prepare step N+1 while the GPU runs step N (default: on CUDA only)"),
    "launch_ahead": (bool, "with async scheduling, launch the next forward before host-side sampling"),
    "device_mask_rows": (int, "grammar mask rows cached on the GPU (0: upload masks each step)"),
    "sampler_graphs": (bool, "replay the fused sampling from CUDA graphs (default on)"),
    "load_format": (str, "auto | safetensors | dummy (random weights of the checkpoint's shape)"),
    "tokenizer": (str, "tokenizer folder (default: the checkpoint's)"),
    "hf_overrides": (_json_object, "JSON object of config fields overriding the checkpoint's (dummy shapes)"),
    "cuda_graph_sizes": (str, "comma list of decode batch sizes captured as CUDA graphs"),
    "prefill_graph_max_tokens": (int, "a lone prefill chunk up to N tokens replays a graph (0: eager)"),
    "batch_graph_max_tokens": (int, "a step with prefill chunks up to N tokens replays a graph (0: eager)"),
    "num_threads": (int, "torch CPU threads (default: torch's)"),
    "quantization": (str, "none | int8 | int4: CPU weights quantized at load (default none: float)"),
    "cpu_compile": (bool, "compile a quantized model's CPU decode step (default: on with --quantization)"),
    "speculative_method": (str, "speculative decoding: off | ngram (prompt lookup) | draft (--draft-model)"),
    "num_speculative_tokens": (int, "most tokens proposed per sequence and step (default 4)"),
    "draft_model": (str, "with --speculative draft: a smaller checkpoint with the same tokenizer"),
    "seed": (int, "sampling seed of requests that set none (default 0)"),
}


def _engine_flags(p: argparse.ArgumentParser) -> None:
    for name, (kind, text) in _ENGINE_FLAGS.items():
        flags = ["--" + name.replace("_", "-")] + (["--speculative"] if name == "speculative_method" else [])
        if kind is bool:
            p.add_argument(*flags, action=argparse.BooleanOptionalAction, default=None, help=text)
        else:
            p.add_argument(*flags, type=kind, help=text)


def _chat_parser(sub: Any) -> None:
    p = sub.add_parser("chat", help="chat with the model in the terminal (no server)")
    p.add_argument(
        "--model",
        help="checkpoint folder or .gguf file (default: the embedded SmolLM2-135M-Instruct)",
    )
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--system", help="system prompt")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.7)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chatloom", description="chatloom: a chat backend for workflow automation"
    )
    parser.add_argument("--version", action="version", version=f"chatloom {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    sub.add_parser("bench", help="engine benchmarks (see `chatloom bench --help`)", add_help=False)
    _chat_parser(sub)
    from app.batch.cli import add_parser as _batch_parser

    _batch_parser(sub)
    return parser


def settings_from_args(args: argparse.Namespace):
    from app.settings import Settings

    keys = (
        "model",
        "served_model_name",
        "strict_model_names",
        "host",
        "port",
        "api_key_file",
        "allowed_hosts",
        "device",
        "dtype",
        "max_model_len",
        "num_kv_blocks",
        "max_num_seqs",
        "database_url",
        "data_dir",
        "cors_origins",
        "log_level",
        "tool_call_format",
        *_ENGINE_FLAGS,
    )
    overrides = {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}
    return Settings(**overrides)


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("chatloom")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def settings_error(exc: Exception) -> str:
    """A pydantic ValidationError of Settings as one line: each field and what is wrong with it."""
    parts = []
    for err in exc.errors():  # type: ignore[attr-defined]
        msg = str(err.get("msg", "")).removeprefix("Value error, ")
        field = ".".join(str(x) for x in err.get("loc", ()))
        parts.append(f"{field}: {msg}" if field else msg)
    return "; ".join(parts)


def serve(args: argparse.Namespace) -> int:
    from app import serve as server

    return server.run(settings_from_args(args))


async def _chat(args: argparse.Namespace) -> int:
    from app.chat.template import ChatMessage, PromptRenderer
    from app.main import build_engine
    from app.serve import StartupError
    from app.settings import Settings
    from engine import SamplingParams

    settings = Settings(model=args.model, device=args.device, dtype=args.dtype)
    try:
        engine = await asyncio.to_thread(build_engine, settings)
        await engine.start()
    except Exception as exc:
        raise StartupError(f"the model failed to load: {type(exc).__name__}: {exc}") from exc
    renderer = PromptRenderer(engine.tokenizer)
    history: list[ChatMessage] = [ChatMessage("system", args.system)] if args.system else []
    print("chatloom chat: empty line or Ctrl-D to quit, /reset to forget the conversation", file=sys.stderr)
    try:
        while True:
            try:
                line = await asyncio.to_thread(input, "you> ")
            except EOFError:
                break
            if not line.strip():
                break
            if line.strip() == "/reset":
                history = history[:1] if args.system else []
                continue
            history.append(ChatMessage("user", line))
            ids = renderer.encode(renderer.render(history, None))
            room = engine.max_model_len - len(ids)
            if room <= 0:
                print("(the conversation no longer fits the context; /reset)", file=sys.stderr)
                history.pop()
                continue
            params = SamplingParams(max_tokens=min(args.max_tokens, room), temperature=args.temperature)
            parts: list[str] = []
            print("assistant> ", end="", flush=True)
            async for out in engine.generate(ids, params):
                parts.append(out.text_delta)
                print(out.text_delta, end="", flush=True)
            print()
            history.append(ChatMessage("assistant", "".join(parts)))
    finally:
        await engine.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        import importlib

        # the laboratory (bench/) is imported by name, on demand: nothing shipped depends on it
        workloads = importlib.import_module("bench.workloads")
        workloads.main(argv[1:])  # prints its report; returns the numbers for programmatic callers
        return 0
    args = build_parser().parse_args(argv)
    from pydantic import ValidationError

    from app.serve import StartupError

    # a start that cannot succeed is one line and a non-zero exit, never a traceback: 2 for a
    # configuration that is refused, 1 for what failed (a busy port, a model that does not load)
    try:
        if args.command == "serve":
            return serve(args)
        if args.command == "chat":
            return asyncio.run(_chat(args))
        if args.command == "batch":
            from app.batch.cli import run as run_batch

            return run_batch(args)
    except ValidationError as exc:
        print(f"chatloom {args.command}: {settings_error(exc)}", file=sys.stderr)
        return 2
    except StartupError as exc:
        print(f"chatloom {args.command}: {exc.message}", file=sys.stderr)
        return exc.code
    return 2


if __name__ == "__main__":
    sys.exit(main())
