"""What one assistant turn cost, for the client that watches it: token counts and decode speed."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any


@dataclass
class TurnUsage:
    """What a turn cost, filled while it runs: the last model call's prompt, all calls' output
    tokens, and when the first and last output tokens came (time.monotonic())."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    first_token_at: float | None = None
    last_token_at: float | None = None

    def tokens(self, n: int) -> None:
        """n output tokens came now."""
        now = time.monotonic()
        if self.first_token_at is None:
            self.first_token_at = now
        self.last_token_at = now
        self.completion_tokens += n

    def as_dict(self) -> dict[str, Any]:
        span = (self.last_token_at or 0.0) - (self.first_token_at or 0.0)
        # decode speed: the tokens after the first over the time they took
        rate = (self.completion_tokens - 1) / span if span > 0 and self.completion_tokens > 1 else None
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "seconds": round(span, 3),
            "tokens_per_second": round(rate, 1) if rate is not None else None,
        }
