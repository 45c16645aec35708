"""The one exception grammar/ raises for the caller's input (a schema, a tool set, a mode).

Anything else raised while building a grammar is a bug or an internal failure: the app reports it as
a 500, never as the user's fault."""

from __future__ import annotations


class GrammarInputError(ValueError):
    """The request's tools / tool_choice / response_format cannot be served; the message starts with
    the field's name (tools, tool_choice, response_format, max_tokens)."""
