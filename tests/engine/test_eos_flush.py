"""Text the detokenizer holds back (a SentencePiece run of <0xNN> byte tokens waits for its end) is
handed out when the output ends on the end-of-turn token, not only when max_tokens cuts it."""

from __future__ import annotations

import torch

from engine import LLM, SamplingParams


class _Script:
    """A constraint that allows exactly one token per step: the script, then nothing."""

    def __init__(self, ids: list[int]):
        self.ids, self.pos = ids, 0

    def fill_bitmask(self, bitmask, row: int, remaining_tokens: int) -> None:
        bitmask[row].zero_()
        t = self.ids[self.pos]
        word = 1 << (t % 32)
        bitmask[row, t // 32] = word - (1 << 32) if word >= 1 << 31 else word

    def accept_token(self, token_id: int) -> bool:
        ok = token_id == self.ids[self.pos]
        self.pos += ok
        return ok

    def is_terminated(self) -> bool:
        return self.pos >= len(self.ids)

    def rollback(self, num_tokens: int) -> None:
        self.pos -= num_tokens


class _Factory:
    def __init__(self, ids: list[int]):
        self.ids = ids

    def ready(self) -> bool:
        return True

    def new(self) -> _Script:
        return _Script(self.ids)


def test_a_byte_run_before_eos_is_flushed(family_checkpoint):
    torch.manual_seed(0)
    llm = LLM(str(family_checkpoint("mistral_v3")), device="cpu", dtype="float32", max_model_len=256)
    tok = llm.tokenizer
    hello = tok.encode("ok", add_special_tokens=False)
    e_acute = [tok.convert_tokens_to_ids("<0xC3>"), tok.convert_tokens_to_ids("<0xA9>")]
    script = hello + e_acute + [tok.eos_token_id]
    params = SamplingParams(max_tokens=16, temperature=0, constraint=_Factory(script))
    out = llm.generate([tok.encode("Hi", add_special_tokens=False)], params)[0].outputs[0]
    assert out.finish_reason == "stop"
    assert out.text == tok.decode(hello + e_acute) == "oké"
