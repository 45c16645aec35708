"""The one entry point the API server uses: request fields -> a ConstraintFactory (or None)."""

from __future__ import annotations

from typing import Any

from grammar.compiler import compiler_for
from grammar.constraint import GrammarConstraintFactory
from grammar.dialects import Dialect, dialect_for
from grammar.errors import GrammarInputError
from grammar.tools import grammar_spec
from grammar.vocab import vocab_for


def build_constraint(
    tokenizer: Any,
    tools: list | None = None,
    tool_choice: Any = None,
    parallel_tool_calls: bool | None = True,
    response_format: Any = None,
    max_tokens: int | None = None,
    vocab_size: int | None = None,
    dialect: Dialect | str | None = None,
) -> GrammarConstraintFactory | None:
    """A ConstraintFactory for SamplingParams.constraint, None when nothing needs constraining.

    dialect: the tool-call dialect (a Dialect, a name, or None: detected from the tokenizer's chat
    template). Raises GrammarInputError (message starts with the field's name) for: tool_choice
    naming an unknown function, a mode that needs tools without any, schemas llguidance cannot
    compile, and max_tokens below the shortest valid output. Any other exception is an internal
    failure. With max_tokens the call waits for the budget tables of a new grammar (tens to hundreds
    of ms, once per tool set; call it off the event loop); the llguidance compile goes on in the
    background and the factory is ready() when it is done.
    """
    if not isinstance(dialect, Dialect):
        dialect = dialect_for(tokenizer, dialect)
    vocab = vocab_for(tokenizer, vocab_size)
    spec = grammar_spec(tools, tool_choice, parallel_tool_calls, response_format, dialect, vocab)
    if spec is None:
        return None
    factory = compiler_for(vocab).submit(spec)
    if max_tokens is not None:
        need = factory.min_tokens
        if max_tokens < need:
            what = "tool call" if spec.mode in ("required",) or spec.mode.startswith("named:") else "output"
            raise GrammarInputError(
                f"max_tokens ({max_tokens}) is too small for the shortest valid {what} "
                f"({need} tokens with the end-of-turn token); raise max_tokens to at least {need}"
            )
    return factory


def warmup(tokenizer: Any, vocab_size: int | None = None) -> None:
    """Build the token tables and llguidance's tokenizer once (seconds), e.g. at start-up."""
    from grammar.budget import vocab_tables
    from grammar.copying import token_table

    vocab = vocab_for(tokenizer, vocab_size)
    vocab_tables(vocab)
    compiler_for(vocab)
    token_table(vocab)  # the copy bias's
