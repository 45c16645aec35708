"""Who is to blame when a grammar cannot be built: the request's own schema is a 400 naming the
field; a failure of ours (a broken compiler, a vocabulary we mishandle) is a logged 500, never an
invalid_request_error."""

from __future__ import annotations

import logging
import types

from app.chat import constraints
from grammar.errors import GrammarInputError
from tests.app.test_chat_wire import TOOLS, USER, post


def _stub(monkeypatch, error: Exception) -> None:
    def build_constraint(tokenizer, **kw):
        raise error

    monkeypatch.setattr(constraints, "api", types.SimpleNamespace(build_constraint=build_constraint))


def test_an_internal_grammar_failure_is_a_logged_500(fake_server, script, monkeypatch, caplog):
    _stub(monkeypatch, ValueError("b'\\x02' is not in list"))  # what a vocabulary bug used to raise
    script("never reached")
    with caplog.at_level(logging.ERROR):
        r = post(
            fake_server, "/v1/chat/completions", {"messages": USER, "tools": TOOLS, "tool_choice": "required"}
        )
    assert r.status_code == 500, r.text
    assert r.json()["error"]["type"] == "server_error"
    assert any(rec.exc_info for rec in caplog.records), "the failure is logged with its traceback"


def test_the_requests_own_schema_is_a_400_naming_the_field(fake_server, script, monkeypatch):
    _stub(monkeypatch, GrammarInputError("tools: function 'f': parameters: unsupported JSON schema"))
    script("never reached")
    r = post(
        fake_server, "/v1/chat/completions", {"messages": USER, "tools": TOOLS, "tool_choice": "required"}
    )
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "tools"


def test_real_grammar_refuses_what_it_cannot_compile_with_the_schema_path(fake_server, script):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookahead",
                "parameters": {
                    "type": "object",
                    "properties": {"q": {"type": "string", "pattern": "(?=a)b"}},
                },
            },
        }
    ]
    script("never reached")
    r = post(
        fake_server, "/v1/chat/completions", {"messages": USER, "tools": tools, "tool_choice": "required"}
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "tools" and "lookahead" in error["message"]
