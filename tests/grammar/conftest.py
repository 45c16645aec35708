"""Grammar fixtures: the real Qwen2.5 tokenizer (151,665 tokens) and the model's 151,936-row vocab."""

from __future__ import annotations

import pytest

MODEL_VOCAB = 151936


@pytest.fixture(scope="session")
def tok():
    from tokenizers import Tokenizer

    from models.qwen_vocab import qwen_tokenizer_json

    return Tokenizer.from_file(str(qwen_tokenizer_json()))


@pytest.fixture(scope="session")
def vocab(tok):
    from grammar.api import warmup
    from grammar.vocab import vocab_for

    warmup(tok, MODEL_VOCAB)
    return vocab_for(tok, MODEL_VOCAB)
