"""Incremental detokenization with the real Qwen tokenizer: UTF-8 safe token by token, stop strings cut
exactly, and nothing past a stop string ever handed out. Then every tokenizer family of tests/families.py
(byte-level BPE, SentencePiece with byte fallback, tiktoken-style): the streamed text is exactly
decode(output ids)."""

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
    for random ids (partial characters, special tokens); the prompts given are no context to either."""
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


# ---- every tokenizer family (tests/families.py): the streamed text is exactly decode(output ids)

FAMILY_TEXTS = [
    MIXED,
    FOX,
    "  leading spaces,\n\nnewlines\n  indented\ttab  end  ",
    "emoji 🎉🚀👍🏽😀 joined 👨‍👩‍👧 flags 🇫🇷🇯🇵 and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝄞",
    "中文：你好，世界！日本語のテキスト、カタカナ。한국어 문장입니다. 龘靐齉",
    '{"name": "get_weather", "arguments": {"city": "東京", "note": "naïve ☃"}}',
]


@pytest.fixture(scope="module", params=["qwen", "smollm2", "mistral_v3", "mistral_tekken", "llama3"])
def family_tok(request, family_checkpoint):
    from tests.families import load_tokenizer

    return request.param, load_tokenizer(family_checkpoint(request.param))


def check_exact(tok, ids, skip_special, prompt=(), stop=()):
    """Streams ids; every delta extends a prefix of decode(ids) and together they are all of it."""
    want = tok.decode(ids, skip_special_tokens=skip_special)
    d = IncrementalDetokenizer(tok, list(prompt), list(stop), skip_special)
    emitted = ""
    for t in ids:
        d.add(t)
        emitted += d.delta(False)
        assert want.startswith(emitted), (tok.convert_ids_to_tokens(ids), emitted, want)
    d.flush()
    emitted += d.delta(True)
    assert emitted == want, (tok.convert_ids_to_tokens(ids), emitted, want)
    return emitted


def test_family_texts_stream_exactly(family_tok):
    """Slices of encoded texts (any start, so a slice may begin inside a character or a word) after
    random prompts, with and without special tokens skipped."""
    name, tok = family_tok
    rng = random.Random(3)
    split_chars = 0
    for text in FAMILY_TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        split_chars += sum("\ufffd" in tok.decode([t]) for t in ids)
        streamed = check_exact(tok, ids, True)
        # SentencePiece's encoder adds a '▁' its decoder strips again: a leading space is lost in the
        # round trip itself (decode(encode(text))), which the stream reproduces
        assert streamed == (text[1:] if name == "mistral_v3" and text.startswith("  ") else text)
        for _ in range(12):
            a = rng.randrange(len(ids))
            piece = ids[a : a + rng.randint(1, 30)]
            prompt = [rng.randrange(len(tok)) for _ in range(rng.randint(0, 6))]
            check_exact(tok, piece, rng.random() < 0.5, prompt=prompt)
    assert split_chars > 5  # the texts do split characters across tokens in this vocabulary
    if name == "mistral_v3":  # SentencePiece: newlines and rare characters as <0xNN> byte fallback
        tokens = tok.convert_ids_to_tokens(
            tok.encode(FAMILY_TEXTS[2] + FAMILY_TEXTS[4], add_special_tokens=False)
        )
        assert "<0x0A>" in tokens and sum(t.startswith("<0x") for t in tokens) > 5


def test_family_random_ids_stream_exactly(family_tok):
    """Random valid ids: byte tokens (valid and invalid UTF-8 runs), special tokens, space pieces."""
    name, tok = family_tok
    rng = random.Random(4)
    vocab = tok.get_vocab()
    byte_ids = [vocab[f"<0x{b:02X}>"] for b in range(256) if f"<0x{b:02X}>" in vocab]
    if not byte_ids:  # byte-level vocabularies: tokens holding parts of characters
        byte_ids = [t for t in tok.encode(FAMILY_TEXTS[3] + FAMILY_TEXTS[4]) if "\ufffd" in tok.decode([t])]
    special = sorted(tok.added_tokens_decoder)[:40]
    spaced = [i for t, i in vocab.items() if t[:1] in ("▁", "Ġ")][:300]
    for _ in range(150):
        pool = byte_ids + special + spaced + [rng.randrange(len(tok)) for _ in range(40)]
        ids = [rng.choice(pool) for _ in range(rng.randint(1, 30))]
        prompt = [rng.randrange(len(tok)) for _ in range(rng.randint(0, 6))]
        check_exact(tok, ids, rng.random() < 0.5, prompt=prompt)


def test_family_stop_strings_cut_exactly(family_tok):
    _, tok = family_tok
    rng = random.Random(5)
    for text in FAMILY_TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        text = tok.decode(ids)
        for _ in range(4):
            i = rng.randrange(len(text))
            stop = text[i : i + rng.randint(1, 5)]
            d, deltas, hit = stream(tok, ids, stop=[stop])
            want = text[: text.find(stop)]
            assert hit == stop and d.text == want == "".join(deltas)


def test_sentencepiece_first_piece_drops_its_space(family_checkpoint):
    """The output's first '▁' is no space after the prompt (as decode(output ids) and mistral-common
    say): "[/INST]" then "▁It▁is" streams "It is"."""
    from tests.families import load_tokenizer

    tok = load_tokenizer(family_checkpoint("mistral_v3"))
    prompt = tok.encode("<s>[INST] Hi[/INST]", add_special_tokens=False)
    ids = tok.encode("[/INST] It is  here.", add_special_tokens=False)[1:]
    assert tok.convert_ids_to_tokens(ids)[0] == "▁It"
    d, deltas, _ = stream(tok, ids, prompt=prompt)
    assert "".join(deltas) == "It is  here." == tok.decode(ids)


def test_byte_fallback_run_waits_for_its_end(family_checkpoint):
    """SentencePiece byte fallback decodes a <0xNN> run all or nothing: "é" as two byte tokens is
    handed out only when a non-byte token ends the run, since a third byte could make all of it
    U+FFFD; a skipped special token inside a run does not end it."""
    from tests.families import load_tokenizer

    tok = load_tokenizer(family_checkpoint("mistral_v3"))
    v = tok.get_vocab()
    c3, a9, b80, word = v["<0xC3>"], v["<0xA9>"], v["<0x80>"], v["▁ok"]
    assert tok.decode([c3, a9]) == "é" and tok.decode([c3, a9, b80]) == "\ufffd" * 3
    d = IncrementalDetokenizer(tok, [], [], True)
    d.add(c3)
    d.add(a9)
    assert d.delta(False) == ""
    d.add(v["[INST]"])  # skipped: the run goes on
    d.add(b80)
    d.add(word)
    assert (
        d.delta(False)
        == "\ufffd" * 3 + " ok"
        == tok.decode([c3, a9, v["[INST]"], b80, word], skip_special_tokens=True)
    )
    d = IncrementalDetokenizer(tok, [], [], True)
    for t in (c3, a9, word):
        d.add(t)
    assert d.delta(False) == "é ok"
