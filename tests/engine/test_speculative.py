"""Speculative decoding (engine.speculative) on tiny random checkpoints: greedy tokens equal those
without speculation for every architecture (n-gram and self-draft), in batches that mix speculating
and plain sequences, with prefix caching, preemption and abort; a self-draft accepts everything and a
random draft almost nothing; sampled tokens keep the target's distribution (chi-square); grammar-
constrained tool calls stay valid."""

from __future__ import annotations

import random

import pytest
import torch

from engine import LLM, SamplingParams
from tests.engine.test_parity import ARCHS

KW = dict(device="cpu", dtype="float32", num_kv_blocks=1024)


def copy_prompts(seed: int, n: int = 8) -> list[list[int]]:
    """Prompts that repeat spans of themselves (so that prompt lookup proposes), and plain ones."""
    rng = random.Random(seed)
    prompts = []
    for i in range(n):
        span = [rng.randint(0, 10000) for _ in range(rng.randint(5, 40))]
        tail = [rng.randint(0, 10000) for _ in range(rng.randint(0, 30))]
        copy = span * rng.randint(1, 3) + tail + span[: rng.randint(2, len(span))]
        prompts.append(copy if i % 4 else tail + [7])
    return prompts


def greedy(max_tokens: int = 32, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, **kw)


def assert_free(llm: LLM) -> None:
    s = llm.stats()
    assert s["free_blocks"] == s["total_blocks"] and s["running"] == s["waiting"] == 0


# qwen3 in CI, the other architectures in `make test-all` (each ~15 s for both methods)
@pytest.fixture(
    scope="module",
    params=[pytest.param(a, marks=() if a == "qwen3" else pytest.mark.heavy) for a in ARCHS],
)
def arch_path(request, checkpoint_factory):
    return checkpoint_factory(request.param, **ARCHS[request.param])


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_greedy_equal_without_speculation(arch_path, method):
    prompts = copy_prompts(1)
    # every third request opts out: speculating and plain sequences share the steps
    params = [greedy(40, speculative_method="off" if i % 3 == 2 else None) for i in range(len(prompts))]
    want = [o.token_ids for o in LLM(arch_path, **KW).generate(prompts, params)]
    draft = {"draft_model": str(arch_path)} if method == "draft" else {}
    llm = LLM(arch_path, **KW, speculative_method=method, **draft)
    got = [o.token_ids for o in llm.generate(prompts, params)]
    assert got == want
    s = llm.stats()
    assert s["spec_proposed_tokens"] > 0 and s["spec_verify_steps"] > 0
    if method == "draft":  # the target as its own draft: every proposal is the target's own choice
        assert s["spec_accepted_tokens"] == s["spec_proposed_tokens"] > 0
    assert_free(llm)


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_greedy_equal_with_overlapped_steps(checkpoint_factory, method):
    """Overlapped steps (CUDA's default, forced on here): a step in flight is finished before one
    that proposes, the others overlap; tokens equal those without speculation."""
    path = checkpoint_factory("qwen3")
    prompts = copy_prompts(8)
    params = [greedy(40, speculative_method="off" if i % 3 == 2 else None) for i in range(len(prompts))]
    want = [o.token_ids for o in LLM(path, **KW).generate(prompts, params)]
    draft = {"draft_model": str(path)} if method == "draft" else {}
    llm = LLM(path, **KW, async_scheduling=True, speculative_method=method, **draft)
    assert llm.core.overlap
    got = [o.token_ids for o in llm.generate(prompts, params)]
    assert got == want
    s = llm.stats()
    assert s["spec_verify_steps"] > 0 and s["spec_accepted_tokens"] > 0
    assert_free(llm)


def _drains(llm: LLM, prompt: list[int], n: int) -> tuple[int, int, list[int]]:
    """One stream: (steps that began with a step in flight and finished it first, steps that began
    with a step in flight, its tokens)."""
    core, counts = llm.core, [0, 0]
    wants = core.spec.wants_tokens

    def counted(running):
        w = wants(running)
        counts[0] += w
        counts[1] += 1
        return w

    core.spec.wants_tokens = counted
    (out,) = llm.generate([prompt], greedy(n))
    core.spec.wants_tokens = wants
    return counts[0], counts[1], out.token_ids


def test_overlap_kept_where_nothing_is_proposed(checkpoint_factory):
    """Empty proposals back off (1, 2, 4, ... steps), so a context without repeats keeps the overlap
    (the random checkpoint starts repeating itself after ~16 tokens, and from then on proposes); a
    repeating context finishes the step in flight and verifies proposals."""
    path = checkpoint_factory("qwen3")
    llm = LLM(path, **KW, async_scheduling=True, speculative_method="ngram")
    plain = LLM(path, **KW)
    rng = random.Random(3)
    fresh = rng.sample(range(10000), 60)  # no token twice: the prompt lookup finds nothing at first
    drained, in_flight, got = _drains(llm, fresh, 64)
    assert got == plain.generate([fresh], greedy(64))[0].token_ids
    assert in_flight - drained >= 10 and drained > 0  # steps overlapped, and steps that proposed
    span = rng.sample(range(10000), 20)
    before = llm.stats()["spec_verify_steps"]
    *_, got = _drains(llm, span * 4, 32)
    assert got == plain.generate([span * 4], greedy(32))[0].token_ids
    assert llm.stats()["spec_verify_steps"] > before
    assert_free(llm)


def test_random_draft_accepts_almost_nothing(checkpoint_factory):
    path, other = checkpoint_factory("qwen3"), checkpoint_factory("qwen3", seed=11)
    prompts = copy_prompts(2)
    want = [o.token_ids for o in LLM(path, **KW).generate(prompts, greedy(40))]
    llm = LLM(path, **KW, speculative_method="draft", draft_model=str(other))
    assert [o.token_ids for o in llm.generate(prompts, greedy(40))] == want
    s = llm.stats()
    assert s["spec_proposed_tokens"] > 50 and s["spec_accepted_tokens"] <= 0.05 * s["spec_proposed_tokens"]
    assert_free(llm)


def test_chunked_prefill_and_budget(checkpoint_factory):
    # a token budget smaller than prompt + proposals: chunks end short of the proposals, proposals are cut
    path = checkpoint_factory("qwen3")
    prompts = copy_prompts(3)
    want = [o.token_ids for o in LLM(path, **KW, max_num_batched_tokens=24).generate(prompts, greedy(40))]
    llm = LLM(path, **KW, max_num_batched_tokens=24, speculative_method="ngram", num_speculative_tokens=6)
    assert [o.token_ids for o in llm.generate(prompts, greedy(40))] == want
    assert llm.stats()["spec_accepted_tokens"] > 0
    assert_free(llm)


def test_prefix_cache_hashes_cover_accepted_tokens_only(checkpoint_factory):
    path = checkpoint_factory("qwen3")
    rng = random.Random(4)
    prefix = [rng.randint(0, 10000) for _ in range(48)]
    prompts = [prefix + prefix[: rng.randint(3, 20)] for _ in range(6)]
    off = LLM(path, **KW, block_size=16)
    want = [o.token_ids for o in off.generate(prompts, greedy(48))]
    llm = LLM(path, **KW, block_size=16, speculative_method="ngram")
    outs = llm.generate(prompts, greedy(48))
    assert [o.token_ids for o in outs] == want
    assert llm.stats()["spec_accepted_tokens"] > 0
    # every cached block holds the tokens some request really has at that place
    bm, bs = llm.core.block_manager, 16
    slices = set()
    for p, o in zip(prompts, outs, strict=True):
        full = p + o.token_ids
        slices |= {tuple(full[i : i + bs]) for i in range(0, len(full) - bs + 1, bs)}
    cached = [b.token_ids for b in bm.blocks if b.token_ids is not None]
    assert cached and all(t in slices for t in cached)
    # and whole outputs are found again: prompt + output as a new prompt hits the cache
    again = llm.generate([p + o.token_ids for p, o in zip(prompts, outs, strict=True)], greedy(4))
    assert all(o.cached_tokens >= (len(p) + 48) // bs * bs - bs for p, o in zip(prompts, again, strict=True))
    assert_free(llm)


def test_preemption_mid_speculation(checkpoint_factory):
    path = checkpoint_factory("qwen3")
    prompts = copy_prompts(5, n=12)
    kw = dict(device="cpu", dtype="float32", num_kv_blocks=24, block_size=16)
    want = [o.token_ids for o in LLM(path, **kw).generate(prompts, greedy(48))]
    llm = LLM(path, **kw, speculative_method="ngram")
    assert [o.token_ids for o in llm.generate(prompts, greedy(48))] == want
    s = llm.stats()
    assert s["num_preemptions"] > 0 and s["spec_accepted_tokens"] > 0
    assert_free(llm)


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_abort_mid_speculation(checkpoint_factory, method):
    path = checkpoint_factory("qwen3")
    prompts = copy_prompts(6)
    want = [o.token_ids for o in LLM(path, **KW).generate(prompts, greedy(40))]
    draft = {"draft_model": str(path)} if method == "draft" else {}
    llm = LLM(path, **KW, speculative_method=method, **draft)
    core = llm.core
    seqs = [core.add_request(f"r{i}", p, greedy(40))[0] for i, p in enumerate(prompts)]
    while core.stats()["spec_verify_steps"] < 3:
        core.step()
    aborted = {1, 4}
    for i in aborted:
        out = core.abort(f"r{i}")
        assert out and out[0].finish_reason == "abort"
    while core.has_unfinished():
        core.step()
    for i, seq in enumerate(seqs):
        if i in aborted:
            assert seq.output_token_ids == want[i][: len(seq.output_token_ids)]
        else:
            assert seq.output_token_ids == want[i] and seq.finish_reason == "length"
    assert_free(llm)
    if method == "draft":  # the draft's shadows of finished sequences are freed on the next proposal
        core.spec.propose([], core.max_model_len)
        dbm = core.spec.draft.bm
        assert dbm.num_free_blocks == dbm.num_blocks


def test_stops_inside_accepted_tokens(checkpoint_factory):
    # max_tokens and stop tokens falling inside a run of accepted proposals end the output right there
    path = checkpoint_factory("qwen3")
    prompts = copy_prompts(7)
    draft = dict(speculative_method="draft", draft_model=str(path))
    plain, spec = LLM(path, **KW), LLM(path, **KW, **draft)  # one engine each, reused (greedy: same tokens)
    for n in (1, 2, 5, 13):
        want = plain.generate(prompts, greedy(n))
        got = spec.generate(prompts, greedy(n))
        assert [o.token_ids for o in got] == [o.token_ids for o in want]
    base = plain.generate(prompts, greedy(30))
    stop = [SamplingParams(temperature=0.0, max_tokens=30, stop_token_ids=[o.token_ids[9]]) for o in base]
    want = plain.generate(prompts, stop)
    got = spec.generate(prompts, stop)
    assert [(o.token_ids, o.finish_reason) for o in got] == [(o.token_ids, o.finish_reason) for o in want]


def test_config_and_request_checks(checkpoint_factory):
    from engine.config import EngineConfig

    with pytest.raises(ValueError, match="speculative_method"):
        EngineConfig(model="x", speculative_method="eagle")
    with pytest.raises(ValueError, match="draft_model"):
        EngineConfig(model="x", speculative_method="draft")
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        EngineConfig(model="x", num_speculative_tokens=0)
    with pytest.raises(ValueError, match="speculative_method"):
        SamplingParams(speculative_method="medusa")
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SamplingParams(num_speculative_tokens=0)
    llm = LLM(checkpoint_factory("qwen3"), **KW, speculative_method="ngram")
    with pytest.raises(ValueError, match="draft"):
        llm.core.add_request("x", [1, 2, 3], SamplingParams(speculative_method="draft"))
    plain = LLM(checkpoint_factory("qwen3"), **KW)
    with pytest.raises(ValueError, match="ngram"):
        plain.core.add_request("x", [1, 2, 3], SamplingParams(speculative_method="ngram"))


# ---- the sampled distribution ------------------------------------------------------------------
VOCAB = 32
N_SAMPLES = 800


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_first_sampled_token_distribution(checkpoint_factory, method):
    """The first token of every sample is verified with proposals (the prompt's last chunk ends in
    them: its first chunk fills the token budget); its frequencies match the target's softmax."""
    from transformers import AutoModelForCausalLM

    path = checkpoint_factory("qwen3", vocab_size=VOCAB, seed=5)
    prompt = [3, 17, 9, 25, 4, 11] * 6 + [3, 17, 9]  # 39 tokens: prompt lookup proposes 25, 4, 11, ...
    temperature = 0.7
    with torch.no_grad():
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        probs = torch.softmax(model(torch.tensor([prompt])).logits[0, -1] / temperature, dim=-1)
    draft = {"draft_model": str(path)} if method == "draft" else {}
    llm = LLM(path, device="cpu", dtype="float32", num_kv_blocks=4096, max_num_batched_tokens=32,
              enable_prefix_caching=False, max_num_seqs=64, speculative_method=method, **draft)  # fmt: skip
    params = SamplingParams(n=N_SAMPLES, temperature=temperature, max_tokens=2, ignore_eos=True)
    outs = llm.generate([prompt], params)[0].outputs
    s = llm.stats()
    # nearly every sample's first token came out of a verification (a sample admitted into a step's
    # leftover budget may need more chunks, the last without room for proposals: sampled plainly)
    assert s["spec_verify_steps"] >= 0.9 * N_SAMPLES
    assert s["spec_proposed_tokens"] > s["spec_accepted_tokens"] > 0
    counts = torch.bincount(torch.tensor([o.token_ids[0] for o in outs]), minlength=VOCAB).double()
    expected = probs.double() * N_SAMPLES
    big = expected >= 5  # the rare tokens pooled into one bin
    obs = torch.cat([counts[big], counts[~big].sum().view(1)])
    exp = torch.cat([expected[big], expected[~big].sum().view(1)])
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    df = int(big.sum())  # bins - 1
    p_value = float(torch.special.gammaincc(torch.tensor(df / 2), torch.tensor(chi2 / 2)))
    assert p_value > 1e-3, f"chi2={chi2:.1f} df={df} p={p_value:.2e}"


# ---- grammars ------------------------------------------------------------------------------------
# overlapped steps (CUDA's default): grammar rows read the tokens in flight, steps launched ahead
@pytest.mark.parametrize("method,overlap", [("ngram", False), ("draft", False), ("ngram", True)])
def test_constrained_tool_calls_stay_valid(tiny_qwen3, method, overlap):
    import jsonschema

    from bench.grammar import g1_tools
    from grammar.api import build_constraint
    from tests.grammar.driver import split_output

    tools = g1_tools()
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    off = LLM(str(tiny_qwen3), **KW)
    draft = {"draft_model": str(tiny_qwen3)} if method == "draft" else {}
    on = LLM(str(tiny_qwen3), **KW, speculative_method=method, async_scheduling=overlap, **draft)
    f = build_constraint(off.tokenizer, tools=tools, tool_choice="required", max_tokens=96,
                         vocab_size=off.core.vocab_size)  # fmt: skip
    rng = random.Random(8)
    prompts = [[rng.randint(0, 5000) for _ in range(20)] for _ in range(6)]
    # a first call's text in the next prompts: prompt lookup copies its keys and punctuation
    first = off.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=96, constraint=f))[0]
    prompts = [p + first.token_ids for p in prompts]
    for params in (
        [SamplingParams(temperature=0, max_tokens=f.min_tokens + 8 * i, constraint=f) for i in range(6)],
        [SamplingParams(temperature=1.0, seed=i, max_tokens=96, constraint=f) for i in range(6)],
    ):
        before = on.stats()["spec_accepted_tokens"]
        got = on.generate(prompts, params)
        if params[0].temperature == 0:
            want = off.generate(prompts, params)
            assert [o.token_ids for o in got] == [o.token_ids for o in want]
        assert on.stats()["spec_accepted_tokens"] > before
        for out in got:
            o = out.outputs[0]
            assert o.finish_reason == "stop"
            _, calls = split_output(on.tokenizer.decode(o.token_ids, skip_special_tokens=False))
            assert calls
            for call in calls:
                jsonschema.validate(call["arguments"], schemas[call["name"]])
    assert_free(on)


def test_constrained_rows_keep_speculating_with_overlapped_steps(tiny_qwen3):
    """Grammar rows read the tokens in flight, and such steps launch the next one ahead; a step is
    not launched ahead of one that proposes, and sequences sitting out count down in steps launched
    ahead, so overlapped steps verify about as often as synchronous ones (they once stopped
    proposing after the first empty proposal: 3 verification steps against 82)."""
    from bench.grammar import g1_tools
    from grammar.api import build_constraint

    off = LLM(str(tiny_qwen3), **KW)
    f = build_constraint(off.tokenizer, tools=g1_tools(), tool_choice="required", max_tokens=120,
                         vocab_size=off.core.vocab_size)  # fmt: skip
    rng = random.Random(8)
    prompts = [rng.sample(range(5000), 40) for _ in range(3)]
    params = [SamplingParams(temperature=0, max_tokens=120, constraint=f) for _ in prompts]
    want = [o.token_ids for o in off.generate(prompts, params)]
    steps = {}
    for overlap in (False, True):
        llm = LLM(str(tiny_qwen3), **KW, speculative_method="ngram", async_scheduling=overlap)
        assert [o.token_ids for o in llm.generate(prompts, params)] == want
        steps[overlap] = llm.stats()["spec_verify_steps"]
    assert steps[False] > 20 and steps[True] >= steps[False] // 2, steps


# ---- serve flag and /metrics ---------------------------------------------------------------------
def test_serve_flag_and_metrics():
    from prometheus_client import generate_latest

    from app.cli import build_parser, settings_from_args
    from app.metrics import Metrics

    args = build_parser().parse_args(["serve", "--speculative", "ngram", "--num-speculative-tokens", "6"])
    config = settings_from_args(args).engine_config("m")
    assert (config.speculative_method, config.num_speculative_tokens) == ("ngram", 6)
    with pytest.raises(ValueError, match="draft_model"):
        settings_from_args(build_parser().parse_args(["serve", "--speculative", "draft"]))

    class Engine:
        def stats(self):
            return {"spec_proposed_tokens": 40, "spec_accepted_tokens": 30, "spec_verify_steps": 10}

    text = generate_latest(Metrics(lambda: Engine()).registry).decode()
    assert "chatloom_spec_accepted_tokens_total 30.0" in text
    assert "chatloom_spec_acceptance_rate 0.75" in text
    assert "chatloom_spec_tokens_per_step 4.0" in text  # (30 accepted + 10 sampled) / 10 steps
