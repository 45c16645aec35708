"""A stand-in with AsyncEngine's interface that "generates" scripted text, token by token through
the real tokenizer: for tests of the HTTP layer that need exact model output (tool calls)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from engine.outputs import StepOutput, TokenLogprob
from runner.sampling_params import SamplingParams

Script = Callable[[list[int], SamplingParams, int], str]  # (prompt ids, params, sample index) -> text


def default_script(prompt: list[int], params: SamplingParams, index: int) -> str:
    return f"Hello from sample {index}. " * 8


class FakeEngine:
    def __init__(self, tokenizer, max_model_len: int = 2048, script: Script = default_script) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.script = script
        self.started = False
        self.aborted: set[str] = set()
        self.finished: set[str] = set()
        self.requests: list[tuple[str, list[int], SamplingParams]] = []
        self.delay = 0.0  # seconds between tokens

    async def start(self) -> None:
        self.started = True

    async def shutdown(self) -> None:
        self.started = False

    def stats(self) -> dict:
        return {
            "free_blocks": 90,
            "total_blocks": 100,
            "running": 0,
            "waiting": 0,
            "prefix_cache_hit_tokens": 0,
        }

    async def abort(self, request_id: str) -> None:
        self.aborted.add(request_id)

    async def generate(self, prompt, params: SamplingParams, request_id: str = "r", retention_key=None):
        ids = (
            self.tokenizer.encode(prompt, add_special_tokens=False)
            if isinstance(prompt, str)
            else list(prompt)
        )
        self.requests.append((request_id, ids, params))
        streams = [self._sample(ids, params, i) for i in range(params.n)]
        live = list(range(params.n))
        while live:
            for i in list(live):
                if request_id in self.aborted:
                    yield StepOutput(request_id, i, [], "", "abort", prompt_tokens=len(ids))
                    live.remove(i)
                    continue
                out = next(streams[i])
                out.request_id = request_id
                out.prompt_tokens = len(ids)
                if out.finish_reason is not None:
                    live.remove(i)
                yield out
                await asyncio.sleep(self.delay)
        self.finished.add(request_id)

    def _sample(self, prompt: list[int], params: SamplingParams, index: int):
        text = self.script(prompt, params, index)
        tokens = self.tokenizer.encode(text, add_special_tokens=False)
        limit = params.max_tokens if params.max_tokens is not None else self.max_model_len - len(prompt)
        emitted = ""
        done_ids: list[int] = []
        for n, tok in enumerate(tokens):
            done_ids.append(tok)
            full = self.tokenizer.decode(done_ids)
            if full.endswith("\ufffd"):
                delta = ""  # an incomplete UTF-8 sequence: wait for the next token
            else:
                delta, emitted = full[len(emitted) :], full
            finish = "length" if n + 1 >= limit else None
            for stop in params.stop:
                cut = emitted.find(stop)
                if cut >= 0:
                    keep = cut - (len(emitted) - len(delta))
                    delta = delta[: max(keep, 0)]
                    finish = "stop"
                    break
            if n + 1 == len(tokens) and finish is None:
                finish = "stop"
            lp = None
            if params.logprobs is not None:
                top = [(tok, -0.25), (tok + 1, -1.5), (tok + 2, -2.0)][: params.logprobs]
                lp = [TokenLogprob(tok, -0.25, top)]
            yield StepOutput("", index, [tok], delta, finish, lp)
            if finish is not None:
                return
        yield StepOutput("", index, [], "", "stop")
