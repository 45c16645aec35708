"""The `chatloom batch` subcommand (its parser and entry point; app.cli wires it in)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> None:
    from app.cli import _engine_flags

    p = sub.add_parser(
        "batch",
        help="run a file of OpenAI Batch API requests through the engine (no server)",
        description="Reads request lines ({custom_id, method, url, body}; url /v1/chat/completions, "
        "/v1/completions or /v1/responses), answers them all in one continuous batch and appends "
        "result lines ({id, custom_id, response: {status_code, request_id, body}, error}) to OUTPUT; "
        "lines that fail go to the errors file. Rerunning the same command resumes: lines already "
        "answered are skipped.",
    )
    p.add_argument("input", type=Path, help="request lines (JSONL)")
    p.add_argument("output", type=Path, help="result lines of the 200 answers (JSONL, appended)")
    p.add_argument(
        "--errors", type=Path, help="result lines of failed requests (default: OUTPUT's name + .errors.jsonl)"
    )
    p.add_argument(
        "--model", help="checkpoint folder or .gguf file (default: the embedded SmolLM2-135M-Instruct)"
    )
    p.add_argument("--served-model-name", help="the model id in the answers (default: the checkpoint's name)")
    p.add_argument("--device", help="auto | cpu | cuda[:N]")
    p.add_argument("--dtype", help="auto | float32 | float16 | bfloat16")
    p.add_argument("--max-model-len", type=int, help="context length (default: the checkpoint's)")
    p.add_argument("--num-kv-blocks", type=int, help="KV cache blocks (default: sized from memory)")
    p.add_argument("--max-num-seqs", type=int, help="most sequences decoded at once")
    p.add_argument(
        "--tool-call-format",
        choices=["auto", "hermes", "llama3_json", "mistral", "generic"],
        help="how the model writes tool calls (default auto: from its chat template)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--log-level", help="debug | info | warning | error")
    _engine_flags(p)


def run(args: argparse.Namespace) -> int:
    from app.batch.offline import report, run_cli
    from app.cli import settings_from_args

    settings = settings_from_args(args)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        summary = asyncio.run(
            run_cli(settings, args.input, args.output, args.errors, progress=not args.no_progress)
        )
    except (FileNotFoundError, ValueError) as exc:
        print(f"chatloom batch: {exc}", file=sys.stderr)
        return 2
    print(report(summary), file=sys.stderr)
    return 0
