"""The copy bias (grammar/copying.py) and the call cursor under it (grammar/call_cursor.py), on the
real Qwen2.5 vocabulary: where a reply stands in its calls, and which tokens get which bias."""

from __future__ import annotations

import torch

from grammar.call_cursor import CallCursor
from grammar.copying import CopyBias
from grammar.dialects import HERMES, LLAMA3_JSON, MISTRAL
from grammar.vocab import MARKER_BYTES

CALL = '<tool_call>\n{"name": "get_score", "arguments": {"team": "'


def _cursor(dialect, *pieces: bytes) -> CallCursor:
    c = CallCursor(dialect)
    for p in pieces:
        c.feed(p)
    return c


def test_cursor_sees_argument_strings_only():
    c = _cursor(HERMES, CALL.encode() + b"Celt")
    assert c.in_call and c.argument_string() == b"Celt"
    # the function's name, a key and free text are not arguments
    assert _cursor(HERMES, b'<tool_call>\n{"name": "get_').argument_string() is None
    assert _cursor(HERMES, b'<tool_call>\n{"name": "f", "arguments": {"te').argument_string() is None
    assert _cursor(HERMES, b'I think "Celt').argument_string() is None
    # a value after the key's colon may open; after a finished value it may not
    assert _cursor(HERMES, b'<tool_call>\n{"name": "f", "arguments": {"team":').expects_argument_value()
    done = _cursor(HERMES, b'<tool_call>\n{"name": "f", "arguments": {"team": "A"')
    assert not done.expects_argument_value()
    assert not _cursor(HERMES, b'<tool_call>\n{"name":').expects_argument_value()


def test_cursor_follows_nesting_escapes_and_several_calls():
    c = _cursor(HERMES, b'<tool_call>\n{"name": "f", "arguments": {"q": {"tags": ["a", 3, "x\\"y')
    assert c.argument_string() == b'x\\"y'  # raw bytes, escape kept (copying skips escaped values)
    c.feed(b'"], "n": 2}}}')
    assert not c.in_call  # the call's object closed
    c.feed(b"\n</tool_call>\n<tool_call>\n")
    assert c.in_call and c.argument_string() is None
    c.feed(b'{"name": "g", "arguments": {"city": "Ky')
    assert c.argument_string() == b"Ky"


def test_cursor_other_dialects():
    # Mistral: the marker as its one special token's byte, then a list of calls
    c = _cursor(MISTRAL, MARKER_BYTES["[TOOL_CALLS]"] + b'[{"name": "f", "arguments": {"a": "b')
    assert c.argument_string() == b"b"
    c = _cursor(MISTRAL, b'[TOOL_CALLS][{"name": "f", "arguments": {"a": "x"}}, ')
    c.feed(b'{"name": "g", "arguments": {"b": "y')
    assert c.argument_string() == b"y"
    # Llama 3: a call is a reply that opens with `{`; braces inside prose are not calls
    assert _cursor(LLAMA3_JSON, b' {"name": "f", "parameters": {"a": "z').argument_string() == b"z"
    assert not _cursor(LLAMA3_JSON, b'Use {"name": "f", "parameters": {"a": "z').in_call


def _bias(vocab, tok, sources, text, dialect=HERMES) -> dict[bytes, float]:
    bias = CopyBias(vocab, dialect, sources)
    logits = torch.zeros(vocab.vocab_size)
    ids = tok.encode(text, add_special_tokens=False).ids
    out = bias(ids, logits)
    return {vocab.token_bytes[t]: float(out[t]) for t in out.nonzero().flatten().tolist()}


def test_a_word_being_copied_is_finished(vocab, tok):
    src = ["Did the Celtics win their last match?"]
    got = _bias(vocab, tok, src, CALL + "Celtic")
    assert got == {b"s": 24.0}  # the rest of the word; the closing quote untouched
    got = _bias(vocab, tok, ["How many kilograms is 186 pounds?"], CALL + "pound")
    assert got.get(b"s") == 24.0 and b'"' not in got


def test_short_tails_and_word_starts_get_the_mild_bias(vocab, tok):
    src = ["What time is it in Honolulu right now?"]
    got = _bias(vocab, tok, src, CALL + "Ho")  # two bytes: weak evidence of copying
    assert got and set(got.values()) == {2.0}
    assert all(b"Honolulu".startswith(b"Ho" + t) for t in got)
    got = _bias(vocab, tok, src, CALL)  # an empty value: tokens that start a source word
    assert got and set(got.values()) == {2.0}
    words = [w.encode() for w in src[0].rstrip("?").split()]
    assert all(any(w.startswith(t) for w in words) for t in got)


def test_no_bias_where_the_model_decides(vocab, tok):
    src = ["Did the Celtics win their last match?"]
    assert _bias(vocab, tok, src, CALL + "Celtics") == {}  # a whole word: stopping is the model's call
    assert _bias(vocab, tok, src, CALL + "Zulu") == {}  # nothing in the source matches
    assert _bias(vocab, tok, src, "The Celtic") == {}  # free text
    assert _bias(vocab, tok, src, '<tool_call>\n{"name": "Celtic') == {}  # the function's name
    assert _bias(vocab, tok, ['say "hi\\" there'], CALL + 'hi\\"') == {}  # escapes are not copied
    assert _bias(vocab, tok, [], CALL + "Celtic") == {}


def test_matching_is_case_exact_and_at_word_starts(vocab, tok):
    assert _bias(vocab, tok, ["the celtics"], CALL + "Celtic") == {}
    assert _bias(vocab, tok, ["Boston's subcategory"], CALL + "cat") == {}  # not at a word start
    # a phrase: after "New " the next word of the phrase starts
    got = _bias(vocab, tok, ["Flights to New Zealand tomorrow"], CALL + "New ")
    assert got and all(b"Zealand".startswith(t) for t in got)


def test_sequences_sharing_the_processor_keep_their_own_reading(vocab, tok):
    bias = CopyBias(vocab, HERMES, ["Did the Celtics win? Ask about Kyoto"])
    a = tok.encode(CALL + "Celtic", add_special_tokens=False).ids
    b = tok.encode(CALL + "Kyo", add_special_tokens=False).ids
    for ids, want in ((a, b"s"), (b, b"to"), (a, b"s"), (b, b"to")):
        out = bias(ids, torch.zeros(vocab.vocab_size))
        hit = {vocab.token_bytes[t] for t in out.nonzero().flatten().tolist()}
        assert want in hit
    assert len(bias._reads) == 2


def test_the_app_attaches_the_bias_to_constrained_tool_requests(tok, vocab):
    from app.chat.constraints import copy_processors
    from app.chat.template import ChatMessage

    msgs = [
        ChatMessage("system", "Be brief"),
        ChatMessage("user", "Kyoto weather"),
        {"role": "tool", "content": "ok"},
    ]
    kw = dict(dialect=HERMES, vocab_size=vocab.vocab_size)
    (bias,) = copy_processors(tok, True, sources=msgs, strength=24.0, **kw)
    assert isinstance(bias, CopyBias) and (bias.word, bias.start) == (24.0, 2.0)
    assert bias.source == b"Be brief\nKyoto weather\nok"
    assert copy_processors(tok, False, sources=msgs, strength=24.0, **kw) == []  # no grammar: no bias
    assert copy_processors(tok, True, sources=msgs, strength=0.0, **kw) == []  # turned off
    assert copy_processors(tok, True, sources=[ChatMessage("assistant", "x")], strength=24.0, **kw) == []
