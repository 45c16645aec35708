"""Offline batch generation: LLM(path, **EngineConfig fields).generate(prompts, params)."""

from __future__ import annotations

import itertools

from engine.config import EngineConfig
from engine.engine_core import EngineCore
from engine.outputs import CompletionOutput, RequestOutput
from engine.step_thread import StepThread
from runner.sampling_params import SamplingParams


class LLM:
    def __init__(self, model: str, **kwargs) -> None:
        self.config = EngineConfig(model=str(model), **kwargs)
        # loaded and stepped on one thread of its own, as AsyncEngine is (engine.step_thread says why)
        self._stepper = StepThread("chatloom-llm", owner=self)
        self.core: EngineCore = self._stepper.call(EngineCore, self.config)
        self.tokenizer = self.core.tokenizer
        self._ids = itertools.count()

    def generate(
        self,
        prompts: list[str] | list[list[int]] | str,
        params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        if params is None:
            params = SamplingParams()
        plist = params if isinstance(params, list) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"{len(plist)} SamplingParams for {len(prompts)} prompts")
        order: list[str] = []
        for prompt, p in zip(prompts, plist, strict=True):
            rid = f"llm-{next(self._ids)}"
            self.core.add_request(rid, prompt, p)
            order.append(rid)
        seqs = {rid: self.core.requests[rid] for rid in order}
        bar = None
        if use_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=len(order), desc="generating", unit="req")

        def run() -> None:
            done: set[str] = set()
            while self.core.has_unfinished():
                self.core.step()
                if bar is not None:
                    now = {r for r, ss in seqs.items() if all(s.is_finished for s in ss)}
                    bar.update(len(now - done))
                    done = now

        try:
            self._stepper.call(run)
        except BaseException:
            for rid in order:  # a failed step (e.g. a raising logits processor) must not wedge the engine
                self.core.abort(rid)
            raise
        if bar is not None:
            bar.close()
        results = []
        for rid in order:
            outs = [
                CompletionOutput(
                    s.index, s.output_token_ids, s.detok.text, s.finish_reason, s.logprobs, s.stop_reason
                )
                for s in seqs[rid]
            ]
            first = seqs[rid][0]
            results.append(RequestOutput(rid, first.prompt_token_ids, outs, first.num_cached_tokens))
        return results

    def reset_prefix_cache(self) -> None:
        self.core.reset_prefix_cache()

    def stats(self) -> dict:
        return self.core.stats()
