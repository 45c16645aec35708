"""chatloom's inference engine: paged KV cache, continuous batching, prefix reuse.

Public API:
    from engine import LLM, AsyncEngine, SamplingParams, EngineConfig
"""

from engine.config import EngineConfig
from engine.outputs import CompletionOutput, RequestOutput, StepOutput, TokenLogprob
from runner.sampling_params import SamplingParams

__all__ = [
    "AsyncEngine",
    "CompletionOutput",
    "EngineConfig",
    "LLM",
    "RequestOutput",
    "SamplingParams",
    "StepOutput",
    "TokenLogprob",
]


def __getattr__(name: str):
    # torch-heavy classes load on first use so `import engine` stays light
    if name == "LLM":
        from engine.llm import LLM

        return LLM
    if name == "AsyncEngine":
        from engine.async_engine import AsyncEngine

        return AsyncEngine
    raise AttributeError(name)
