"""Incremental detokenization with the real Qwen tokenizer: UTF-8 safe token by token, stop strings cut
exactly, and nothing past a stop string ever handed out."""

from __future__ import annotations

import random

import pytest

from engine.detokenizer import IncrementalDetokenizer

MIXED = "Héllo wörld — naïve café, Ærø! 🎉🚀 你好，世界！日本語のテキスト 👨‍👩‍👧 ok ∑≠∞ 한국어 done"
FOX = "The quick brown fox jumps over the lazy dog. The fox sleeps."


def stream(tok, ids, stop=(), include=False, prompt=()):
    """Drive the detokenizer as EngineCore._append does; returns (detok, deltas, stop hit)."""
    d = IncrementalDetokenizer(tok, list(prompt), list(stop), True, include)
    deltas: list[str] = []
    hit = None
    for i, t in enumerate(ids):
        before = len(d.text)
        d.add(t)
        hit = d.find_stop(len(d.text) - before)
        finished = hit is not None or i == len(ids) - 1
        if finished and hit is None:
            d.flush()  # a "length" finish
        deltas.append(d.delta(finished))
        if hit is not None:
            break
    return d, deltas, hit


def test_multibyte_text_token_by_token(qwen_tokenizer):
    tok = qwen_tokenizer
    ids = tok.encode(MIXED, add_special_tokens=False)
    # the test means something: some tokens hold only part of a character
    assert any("\ufffd" in tok.decode([t]) for t in ids)
    d, deltas, hit = stream(tok, ids)
    assert hit is None
    assert d.text == tok.decode(ids) == MIXED
    assert "".join(deltas) == MIXED
    assert all("\ufffd" not in delta for delta in deltas)  # never a partial character


def test_incremental_text_is_always_a_prefix(qwen_tokenizer):
    tok = qwen_tokenizer
    ids = tok.encode(MIXED, add_special_tokens=False)
    d = IncrementalDetokenizer(tok, [], [], True)
    for t in ids:
        d.add(t)
        assert MIXED.startswith(d.text)
        assert "\ufffd" not in d.text
    assert d.text == MIXED


def test_prompt_context_does_not_leak_into_output(qwen_tokenizer):
    tok = qwen_tokenizer
    prompt = tok.encode("Prompt: 你好 🎉", add_special_tokens=False)
    ids = tok.encode(" answer: 世界 🚀 é", add_special_tokens=False)
    d, deltas, _ = stream(tok, ids, prompt=prompt)
    assert d.text == tok.decode(ids) == "".join(deltas)


def test_truncated_character_at_length_finish_matches_decode(qwen_tokenizer):
    tok = qwen_tokenizer
    ids = tok.encode("ok 🎉", add_special_tokens=False)
    cut = ids[:-1]  # the emoji's last byte token is missing
    assert tok.decode(cut).endswith("\ufffd")
    d, deltas, _ = stream(tok, cut)
    assert d.text == tok.decode(cut)
    assert "".join(deltas) == d.text


def test_random_multibyte_strings(qwen_tokenizer):
    tok = qwen_tokenizer
    rng = random.Random(0)
    pool = list("abc xyz.,!") + list("éüñçø") + list("你好世界日本") + ["🎉", "🚀", "👍🏽", "😀"]
    for _ in range(30):
        text = "".join(rng.choice(pool) for _ in range(rng.randint(1, 25)))
        ids = tok.encode(text, add_special_tokens=False)
        d, deltas, _ = stream(tok, ids)
        assert d.text == tok.decode(ids) == text
        assert "".join(deltas) == text and all("\ufffd" not in x for x in deltas)


def test_stop_spanning_several_tokens(qwen_tokenizer):
    tok = qwen_tokenizer
    ids = tok.encode(FOX, add_special_tokens=False)
    assert len(tok.encode(" fox jumps over", add_special_tokens=False)) >= 3
    d, deltas, hit = stream(tok, ids, stop=["fox jumps over"])
    assert hit == "fox jumps over"
    assert d.text == "The quick brown "
    assert "".join(deltas) == d.text


def test_stop_at_the_very_start(qwen_tokenizer):
    tok = qwen_tokenizer
    ids = tok.encode(FOX, add_special_tokens=False)
    d, deltas, hit = stream(tok, ids, stop=["The"])
    assert hit == "The" and d.text == "" and deltas == [""]


def test_two_stops_earliest_wins(qwen_tokenizer):
    tok = qwen_tokenizer
    ids = tok.encode(FOX, add_special_tokens=False)
    d, _, hit = stream(tok, ids, stop=["lazy", "brown"])
    assert hit == "brown" and d.text == "The quick "
    # both complete with the same token " brown": the one that starts first wins
    d, _, hit = stream(tok, ids, stop=["brown", "quick brown"])
    assert hit == "quick brown" and d.text == "The "


def test_include_stop_str_in_output(qwen_tokenizer):
    tok = qwen_tokenizer
    ids = tok.encode(FOX, add_special_tokens=False)
    d, deltas, hit = stream(tok, ids, stop=["jumps over"], include=True)
    assert hit == "jumps over"
    assert d.text == "The quick brown fox jumps over" == "".join(deltas)


def test_stop_inside_a_token(qwen_tokenizer):
    tok = qwen_tokenizer
    ids = tok.encode(FOX, add_special_tokens=False)
    d, _, hit = stream(tok, ids, stop=["ump"])  # " jumps" is one token: cut inside it
    assert hit == "ump" and d.text == "The quick brown fox j"


def test_multibyte_stop_string(qwen_tokenizer):
    tok = qwen_tokenizer
    ids = tok.encode(MIXED, add_special_tokens=False)
    d, deltas, hit = stream(tok, ids, stop=["世界"])
    assert hit == "世界"
    assert d.text == MIXED[: MIXED.index("世界")] == "".join(deltas)
    d, _, hit = stream(tok, ids, stop=["🚀"])
    assert d.text == MIXED[: MIXED.index("🚀")]


@pytest.mark.parametrize(
    "stop",
    [["fox sleeps"], ["lazy dog"], ["The fox"], ["o"], ["dog. The"], ["not there"], ["sleeps.", "x"]],
)
def test_nothing_past_a_stop_is_ever_emitted(qwen_tokenizer, stop):
    tok = qwen_tokenizer
    ids = tok.encode(FOX, add_special_tokens=False)
    d, deltas, hit = stream(tok, ids, stop=stop)
    first = min((FOX.find(s) for s in stop if s in FOX), default=-1)
    want = FOX if first == -1 else FOX[:first]
    assert d.text == want
    emitted = ""
    for delta in deltas:
        emitted += delta
        assert want.startswith(emitted)  # a held-back partial stop never leaks out
    assert emitted == want


def test_partial_stop_match_is_released(qwen_tokenizer):
    tok = qwen_tokenizer
    text = "fox runs, fox walks, fox jumps"
    ids = tok.encode(text, add_special_tokens=False)
    d, deltas, hit = stream(tok, ids, stop=["fox jumps"])
    assert hit == "fox jumps" and d.text == "fox runs, fox walks, " == "".join(deltas)
    # while running, text that might begin the stop was held back, the rest came out early
    assert "".join(deltas[:-1]) != ""


def test_random_single_stop_strings(qwen_tokenizer):
    tok = qwen_tokenizer
    rng = random.Random(1)
    pool = list("ab ,.") + list("é你好") + ["🎉"]
    for _ in range(40):
        text = "".join(rng.choice(pool) for _ in range(rng.randint(2, 30)))
        i = rng.randrange(len(text))
        stop = text[i : i + rng.randint(1, 4)]
        include = rng.random() < 0.5
        ids = tok.encode(text, add_special_tokens=False)
        d, deltas, hit = stream(tok, ids, stop=[stop], include=include)
        pos = text.find(stop)
        assert hit == stop
        assert d.text == text[: pos + (len(stop) if include else 0)]
        emitted = ""
        for delta in deltas:
            emitted += delta
            assert d.text.startswith(emitted)
        assert emitted == d.text


@pytest.mark.parametrize("skip_special", [True, False])
def test_rust_window_matches_the_python_rule(qwen_tokenizer, skip_special):
    """DecodeStream (one Rust call per token) gives the python window rule's text after every token,
    for random ids (partial characters, special tokens) after random prompt contexts."""
    tok = qwen_tokenizer
    rng = random.Random(7)
    partial = list(range(200, 260))  # byte tokens: mostly pieces of multi-byte characters
    special = [151643, 151644, 151645, 151657]
    text_ids = tok.encode(MIXED + FOX, add_special_tokens=False)
    pool = partial + special + text_ids + [rng.randrange(151643) for _ in range(200)]
    used_stream = 0
    for _ in range(60):
        prompt = [rng.choice(pool) for _ in range(rng.randint(0, 8))]
        ids = [rng.choice(pool) for _ in range(rng.randint(1, 40))]
        fast = IncrementalDetokenizer(tok, prompt, [], skip_special)
        slow = IncrementalDetokenizer(tok, prompt, [], skip_special)
        slow._stream = None
        used_stream += fast._stream is not None
        for t in ids:
            fast.add(t)
            slow.add(t)
            assert fast.text == slow.text
        fast.flush()
        slow.flush()
        assert fast.text == slow.text
    assert used_stream > 30  # most contexts end in a whole character
