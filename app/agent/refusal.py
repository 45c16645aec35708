"""The end of a turn whose tool cannot run: a webhook target the policy refuses (app.agent.targets)
is refused the same way every round, so calling it again only spends rounds."""

from __future__ import annotations

from typing import Any

from app.agent.webhooks import ToolResult
from app.errors import APIError


def end_if_refused(
    calls: list[Any],  # app.chat's ParsedCall: .name
    results: list[ToolResult],
    choice: Any,
    refused_before: set[str],
    stored: list[int],
    unanswered: list[int] | None,
) -> None:
    """A tool whose webhook target is refused (app.agent.targets) never runs, so a forced tool
    choice (required or named) would call it again every round until the round cap: the turn ends at
    the first refusal of a forced call, or the second of one tool, with a 400 that says why. The
    turn's messages are taken back (through `unanswered`, which run_turn forgets on failure)."""
    forced = choice == "required" or isinstance(choice, dict)
    for call, result in zip(calls, results, strict=True):
        if result.refused is None:
            continue
        if forced or call.name in refused_before:
            if unanswered is not None:
                unanswered[:] = stored
            raise APIError(
                f"The tool {call.name!r} cannot run: its webhook target is refused ({result.refused}). "
                "Change the tool's url, or allow the host (CHATLOOM_WEBHOOK_ALLOWED_HOSTS, "
                "CHATLOOM_WEBHOOK_ALLOWED_NETWORKS).",
                400,
                code="webhook_target_refused",
                param="tools",
            )
        refused_before.add(call.name)
