"""llguidance must spell every token as the tokenizer does: a byte-level vocabulary whose decoder is
the chain transformers 5.17 writes for GGUF `gpt2` vocabularies (ByteFallback, Fuse, Replace,
ByteLevel) made it read "Ċ" for a newline, and every tool call with tool_choice auto stopped after
its opening marker (issue 50)."""

from __future__ import annotations

import json

import llguidance
import pytest
from tokenizers import Tokenizer

from grammar.vocab import _check_spelling, llguidance_json, vocab_for

CHAIN = {
    "type": "Sequence",
    "decoders": [
        {"type": "ByteFallback"},
        {"type": "Fuse"},
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
    ],
}


@pytest.fixture(scope="module")
def chained(tok):
    """The real Qwen2.5 tokenizer with the decoder chain and byte_fallback of such a conversion."""
    spec = json.loads(tok.to_str())
    spec["decoder"] = CHAIN
    spec["model"]["byte_fallback"] = True
    return Tokenizer.from_str(json.dumps(spec))


def test_the_chain_changes_nothing_for_the_tokenizer(tok, chained):
    text = 'Hi\n<tool_call>\n{"name": "f"}\n  caf\u00e9'
    assert chained.encode(text).ids == tok.encode(text).ids
    assert chained.decode(chained.encode(text).ids, skip_special_tokens=False) == text


def test_llguidance_alone_misreads_it_and_the_check_refuses_that(chained):
    ll = llguidance.LLTokenizer(chained.to_str(), n_vocab=151936, eos_token=151645)
    newline = chained.encode("\n").ids
    assert ll.decode_bytes(newline) != b"\n"
    with pytest.raises(ValueError, match="differently from the tokenizer"):
        _check_spelling(chained, ll)


def test_the_grammar_vocabulary_spells_it_as_the_tokenizer_does(tok, chained):
    assert json.loads(llguidance_json(chained))["decoder"]["type"] == "ByteLevel"
    assert llguidance_json(tok) == tok.to_str()  # a plain ByteLevel decoder is left as it is
    vocab = vocab_for(chained, 151936)
    for text in ("\n", " the", '{"name": "get_weather"}', "\u4e2d\u6587"):
        ids = chained.encode(text).ids
        assert b"".join(vocab.token_bytes[i] for i in ids) == text.encode()
        assert vocab.ll_tokenizer.decode_bytes(ids) == text.encode()
