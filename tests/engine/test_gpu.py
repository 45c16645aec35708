"""GPU path against HF transformers on the GPU: bf16 greedy tokens (first 32 of 16 prompts) equal up
to near-ties within bf16 rounding; float32 (TF32 off) equal up to 1e-4 ties; CUDA graphs equal eager."""

from __future__ import annotations

import math
import random

import pytest
import torch

from engine import LLM, SamplingParams

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

NEW = 32
SHAPE = dict(
    hidden_size=512, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=8,
    num_key_value_heads=4, head_dim=128, max_position_embeddings=4096, rms_norm_eps=1e-6,
    rope_theta=1e6, tie_word_embeddings=True, initializer_range=0.05,
)  # fmt: skip


def prompts() -> list[list[int]]:
    rng = random.Random(7)
    return [[rng.randint(0, 10000) for _ in range(rng.randint(1, 600))] for _ in range(16)]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from models.tiny import build_checkpoint

    return build_checkpoint(tmp_path_factory.mktemp("gpu"), "qwen3", shape=SHAPE)


def hf_greedy(path, dtype, ps):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).cuda().eval()
    out = []
    with torch.no_grad():
        for p in ps:
            g = model.generate(
                torch.tensor([p], device="cuda"), max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                output_scores=True, return_dict_in_generate=True, pad_token_id=0,
            )  # fmt: skip
            out.append((g.sequences[0, len(p) :].tolist(), torch.stack([s[0].float() for s in g.scores])))
    return out


def bf16_tie(scores: torch.Tensor) -> float:
    top = scores.topk(2).values
    ulp = 2.0 ** (math.floor(math.log2(max(abs(float(top[0])), 1e-6))) - 7)
    return 4 * ulp  # a few bf16 roundings of the top logit


def compare(ours, ref, tie_fn) -> int:
    ties = 0
    for got, (want, scores) in zip(ours, ref, strict=True):
        for step, (a, b) in enumerate(zip(got, want, strict=True)):
            if a != b:
                gap = float(scores[step].topk(2).values.diff().abs())
                assert gap <= tie_fn(scores[step]), f"diverged at step {step}, HF gap {gap:.3g}"
                ties += 1
                break
    return ties


GREEDY = SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True)


def test_bf16_parity_and_graphs(ckpt):
    ps = prompts()
    ref = hf_greedy(ckpt, torch.bfloat16, ps)
    graphs = LLM(ckpt, dtype="bfloat16", max_model_len=1024)
    ours = [o.token_ids for o in graphs.generate(ps, GREEDY)]
    ties = compare(ours, ref, bf16_tie)
    assert graphs.core.runner.batch_graphs.replays > 0  # the prompts' steps replayed batch graphs
    # eager splits attention differently from the padded graphs: compared to HF the same way
    eager = LLM(ckpt, dtype="bfloat16", max_model_len=1024, enforce_eager=True)
    eager_ties = compare([o.token_ids for o in eager.generate(ps, GREEDY)], ref, bf16_tie)
    print(f"bf16: {len(ps)} prompts, near-tie divergences: graphs {ties}, eager {eager_ties}")


@pytest.mark.parametrize("tma", [False, True])
def test_batch_one_layers_match_hf(ckpt, tma, monkeypatch):
    """Requests one at a time (decode batch 1), where each layer's tail from o_proj to the next qkv is
    one launch (kernels.decode_tail, or with tma kernels.decode_tail_tma, which this model's shapes
    fit): greedy tokens equal HF's up to near-ties."""
    from kernels import decode_tail_tma, dispatch_linear

    if not tma:  # kernels.decode_tail, the fallback where the TMA tail does not fit
        monkeypatch.setattr(dispatch_linear, "_tail_tma", lambda x, w: None)
    calls = []
    launch = decode_tail_tma.decode_layer_tail
    counted = lambda *a, **k: calls.append(1) or launch(*a, **k)
    monkeypatch.setattr(decode_tail_tma, "decode_layer_tail", counted)
    ps = prompts()[:4]
    ref = hf_greedy(ckpt, torch.bfloat16, ps)
    llm = LLM(ckpt, dtype="bfloat16", max_model_len=1024)
    ours = [llm.generate([p], GREEDY)[0].token_ids for p in ps]
    ties = compare(ours, ref, bf16_tie)
    assert bool(calls) == tma  # the TMA tail ran (captured in the graphs) exactly when switched on
    print(f"bf16 batch 1 (one-launch tail, tma={tma}): near-tie {ties}")


def test_wide_batch_longest_first_matches_plain_dispatch(ckpt, monkeypatch):
    """Decode batches of a wave or more of (sequence, KV head) programs run longest first, a sequence's
    KV heads side by side (kernels.decode_launch.wants_order; the order sorted on the device once per
    step, inside the graphs too): the same greedy tokens as the dispatch in row order, with CUDA graphs
    and eager."""
    from kernels import decode_launch as dl

    rng = random.Random(11)
    ps = [[rng.randint(0, 10000) for _ in range(rng.randint(1, 400))] for _ in range(40)]
    assert dl.wants_order(len(ps), SHAPE["num_key_value_heads"], torch.device("cuda"))
    got = {}
    for on in (True, False):
        if not on:
            monkeypatch.setattr(dl, "wants_order", lambda *args: False)
        for eager in (False, True):
            llm = LLM(ckpt, dtype="bfloat16", max_model_len=1024, enforce_eager=eager)
            got[on, eager] = [o.token_ids for o in llm.generate(ps, GREEDY)]
            del llm
    assert got[True, False] == got[False, False]
    assert got[True, True] == got[False, True]


@pytest.mark.parametrize("epilogue", [False, True])
def test_folded_norms_match_hf(tmp_path_factory, monkeypatch, epilogue):
    """bf16 on CUDA folds each RMSNorm's weight into the projection after it (models.loader
    build_model), so wide decode steps run no norm launch (dispatch.folded_decode_layer_tail: the residual
    adds in the cuBLAS GEMMs, 1 / rms applied by the SiLU and the decode attention). On norms that are
    not ones, greedy tokens equal HF's up to near-ties, with CUDA graphs and eager. With `epilogue`
    (dispatch_linear.QKV_EPILOGUE_MIN_M lowered to every folded step), the layers after the first project the
    residual with the new token's work in the projection (kernels.qkv_new_token)."""
    from kernels import dispatch, dispatch_linear
    from models.tiny import build_checkpoint

    path = build_checkpoint(tmp_path_factory.mktemp("gpu-norms"), "qwen3", shape=SHAPE, norm_spread=0.3)
    ps = prompts()
    ref = hf_greedy(path, torch.bfloat16, ps)
    calls, projected = [], []
    folded, qkv_new_token = dispatch.folded_decode_layer_tail, dispatch.qkv_new_token
    monkeypatch.setattr(
        dispatch, "folded_decode_layer_tail", lambda *a, **k: calls.append(1) or folded(*a, **k)
    )
    monkeypatch.setattr(dispatch, "qkv_new_token", lambda *a: projected.append(1) or qkv_new_token(*a))
    epilogue_rows = dispatch_linear.FOLD_MIN_M if epilogue else 1 << 30
    monkeypatch.setattr(dispatch_linear, "QKV_EPILOGUE_MIN_M", epilogue_rows)
    ties = {}
    for eager in (False, True):
        llm = LLM(path, dtype="bfloat16", max_model_len=1024, enforce_eager=eager)
        assert llm.core.runner.model.norms_folded
        ties[eager] = compare([o.token_ids for o in llm.generate(ps, GREEDY)], ref, bf16_tie)
        del llm
    assert calls  # the wide decode steps took the folded tails (captured in the graphs, and eager)
    assert bool(projected) == epilogue
    print(f"bf16 folded norms (epilogue {epilogue}): {len(ps)} prompts, near-tie divergences (eager: graphs) "
          f"{ties}")  # fmt: skip


def test_fp32_parity(ckpt):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    ps = prompts()
    ref = hf_greedy(ckpt, torch.float32, ps)
    llm = LLM(ckpt, dtype="float32", max_model_len=1024)
    ours = [o.token_ids for o in llm.generate(ps, GREEDY)]
    ties = compare(ours, ref, lambda s: 1e-4)
    print(f"fp32: {len(ps)} prompts, near-tie divergences {ties}")


def test_chat_turns_replay_prefill_graphs(ckpt):
    """One request at a time, each turn over the cached history of the last: the prefill chunks run
    as captured graphs and still match HF."""
    rng = random.Random(9)
    llm = LLM(ckpt, dtype="bfloat16", max_model_len=1024)
    history: list[int] = []
    ps, ours = [], []
    for _ in range(3):
        history = history + [rng.randint(0, 10000) for _ in range(rng.randint(40, 300))]
        ps.append(list(history))
        out = llm.generate([history], GREEDY)[0].token_ids
        ours.append(out)
        history = history + out
    assert llm.core.runner.extend_graphs.replays == 3
    assert llm.stats()["prefix_cache_hit_tokens"] > 0
    ties = compare(ours, hf_greedy(ckpt, torch.bfloat16, ps), bf16_tie)
    print(f"prefill graphs: 3 turns, near-tie divergences {ties}")


def test_launch_ahead_matches_synchronous(ckpt):
    """Rows that read their previous token on the host (frequency penalties) take the launch-ahead
    path on CUDA (the next forward launched before their tokens are read back): the same tokens as
    the synchronous engine, with the next step launched ahead on most steps."""
    torch.backends.cuda.matmul.allow_tf32 = False
    ps = prompts()[:6]
    params = [
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, frequency_penalty=0.5 + i % 3 / 4)
        for i in range(len(ps))
    ]
    kw = dict(dtype="float32", max_model_len=1024, max_num_seqs=8, num_kv_blocks=1024)
    sync = LLM(ckpt, async_scheduling=False, **kw)
    want = [o.token_ids for o in sync.generate(ps, params)]
    core = LLM(ckpt, async_scheduling=True, **kw).core
    for i, (p, sp) in enumerate(zip(ps, params, strict=True)):
        core.add_request(str(i), p, sp)
    got: dict[str, list[int]] = {}
    ahead = 0
    while core.has_unfinished():
        for out in core.step():
            got.setdefault(out.request_id, []).extend(out.new_token_ids)
        ahead += core._ahead is not None
    assert [got[str(i)] for i in range(len(ps))] == want
    assert ahead >= 20


def test_grammar_masks_from_the_device_table(ckpt):
    """Tool calls under a grammar: the fused sampler reading each row's mask from the device table
    gives the tokens of the host path (whole masks uploaded and applied to the logits), greedy in
    float32. The grammar's constraints key no rows (llguidance's state is each request's own), so
    every row goes through the table's upload path and none is looked up."""
    from bench.grammar import g1_tools
    from grammar.api import build_constraint

    torch.backends.cuda.matmul.allow_tf32 = False
    kw = dict(dtype="float32", max_model_len=1024, max_num_seqs=8, num_kv_blocks=1024)
    outs = {}
    for rows in (0, 4096):
        llm = LLM(ckpt, device_mask_rows=rows, **kw)
        f = build_constraint(
            llm.tokenizer,
            tools=g1_tools(),
            tool_choice="required",
            max_tokens=96,
            vocab_size=llm.core.vocab_size,
        )
        params = SamplingParams(temperature=0.0, max_tokens=96, constraint=f)
        results = llm.generate(prompts()[:6], params)
        assert all(r.finish_reason == "stop" for r in results)
        outs[rows] = [r.token_ids for r in results]
        table = llm.core.sampler.device_masks
        assert (table is None) if rows == 0 else (table.hits == 0 and llm.core.sampler.graphs.replays > 0)
    assert outs[0] == outs[4096]


def test_sampler_graphs_draw_from_softmax():
    """The sampler graph's draws follow softmax(logits / T) and change every replay (device seed)."""
    from runner.sampler_graphs import SamplerGraphs
    from tests.kernels.test_sampling import _chi2_ok

    g = SamplerGraphs(64, torch.device("cuda"), seed=5)
    row = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, 3.0, float("-inf"), 1.5], device="cuda")
    static = row.expand(64, -1).contiguous()
    temps = torch.full((64,), 0.7, device="cuda")
    draws = [g.sample(static, 64, temps, None, None).clone() for _ in range(100)]
    tokens = torch.cat(draws).cpu()
    assert not torch.equal(draws[0], draws[1]) and g.replays == 100 and len(g.graphs) == 1
    assert _chi2_ok(tokens, torch.softmax(row.cpu() / 0.7, dim=-1))
    greedy = g.sample(static, 64, torch.zeros(64, device="cuda"), None, None)
    assert (greedy == 5).all()


def test_step_graphs_sample_plain_decode_steps(ckpt):
    """Plain decode steps (no logit edits, masks, filters or logprobs) are one replay of a step graph
    whose first launch reads the tokens still in flight from the previous replay: float32 greedy tokens
    equal those of the engine without it (forward graph, then the sampler), and a batch with a row
    that asks for logprobs takes the forward graph and the sampler."""
    from runner import cuda_graphs

    torch.backends.cuda.matmul.allow_tf32 = False
    ps = prompts()[:6]
    kw = dict(dtype="float32", max_model_len=1024, max_num_seqs=8, num_kv_blocks=1024)
    want = [o.token_ids for o in LLM(ckpt, sampler_graphs=False, **kw).generate(ps, GREEDY)]
    llm = LLM(ckpt, **kw)
    graphs = llm.core.runner.graphs
    assert sorted(graphs.step_graphs) == [s for s in graphs.sizes if s <= cuda_graphs.STEP_GRAPH_MAX_SIZE]
    replays = []
    run_step = graphs.run_step
    graphs.run_step = lambda *a: replays.append(a[0]) or run_step(*a)
    assert [o.token_ids for o in llm.generate(ps, GREEDY)] == want
    assert len(replays) >= NEW - 2  # every decode step but the ones that follow a prefill
    replays.clear()
    with_lp = [GREEDY] * 5 + [SamplingParams(temperature=0.0, max_tokens=NEW, ignore_eos=True, logprobs=2)]
    out = llm.generate(ps, with_lp)
    assert [o.token_ids for o in out] == want and not replays and len(out[5].outputs[0].logprobs) == NEW


def test_step_graphs_exchange_steps_through_pinned_memory(ckpt, monkeypatch):
    """The step graph's first launch reads the step from pinned host
    memory and its last launch writes the tokens there (kernels.step_inputs, kernels.publish): the same
    float32 greedy tokens as the engine without step graphs, over more steps than the rings have rows,
    batches shrinking as requests of several lengths end."""

    torch.backends.cuda.matmul.allow_tf32 = False
    ps = prompts()[:6]
    params = [SamplingParams(temperature=0.0, max_tokens=8 + 5 * i, ignore_eos=True) for i in range(6)]
    kw = dict(dtype="float32", max_model_len=1024, max_num_seqs=8, num_kv_blocks=1024)
    want = [o.token_ids for o in LLM(ckpt, sampler_graphs=False, **kw).generate(ps, params)]
    llm = LLM(ckpt, **kw)
    graphs = llm.core.runner.graphs
    assert graphs.host_ring is not None and graphs.host_ring.is_pinned() and graphs.host64.is_pinned()
    assert [o.token_ids for o in llm.generate(ps, params)] == want
    assert graphs.step_replays >= 30 and graphs.published.item() == graphs.step_replays


def test_async_engine_serves_arriving_requests_like_hf(ckpt):
    """The serving engine on the GPU (its step loop on a thread, CUDA graphs, overlapped steps):
    requests arriving one by one while others decode get HF's greedy tokens up to near-ties, a
    request aborted mid-way ends with finish reason "abort", and once all have ended every KV block
    is free again."""
    import asyncio

    from engine import AsyncEngine, EngineConfig

    ps = prompts()[:8]
    ref = hf_greedy(ckpt, torch.bfloat16, ps)

    async def serve():
        eng = AsyncEngine(EngineConfig(model=str(ckpt), dtype="bfloat16", max_model_len=1024))
        await eng.start()

        async def one(i: int) -> list[int]:
            await asyncio.sleep(0.05 * i)  # each arrives while the earlier ones decode
            toks: list[int] = []
            async for out in eng.generate(ps[i], GREEDY, request_id=f"r{i}"):
                toks.extend(out.new_token_ids)
            return toks

        async def aborted() -> list[str | None]:
            reasons = []
            long = SamplingParams(temperature=0.0, max_tokens=800, ignore_eos=True)
            async for out in eng.generate(ps[0][:50], long, request_id="to-abort"):
                reasons.append(out.finish_reason)
                if len(reasons) == 3:
                    await eng.abort("to-abort")
            return reasons

        *ours, reasons = await asyncio.gather(*(one(i) for i in range(len(ps))), aborted())
        end = asyncio.get_running_loop().time() + 30
        while (s := eng.stats())["running"] or s["free_blocks"] != s["total_blocks"]:
            assert asyncio.get_running_loop().time() < end, f"engine did not go idle: {s}"
            await asyncio.sleep(0.01)
        has_graphs = eng.core.runner.graphs is not None
        await eng.shutdown()
        return ours, reasons, has_graphs

    ours, reasons, graphs = asyncio.run(serve())
    assert graphs  # the engine ran with CUDA graphs
    assert reasons[-1] == "abort" and all(r is None for r in reasons[:-1]) and len(reasons) < 800
    ties = compare(ours, ref, bf16_tie)
    print(f"AsyncEngine bf16: {len(ps)} arriving requests, near-tie divergences {ties}")


def test_speculation_verifies_in_batch_graphs(ckpt):
    """Speculation on CUDA: the steps that verify proposals replay batch graphs, and float32 greedy
    tokens equal the engine's without speculation (one prompt may part at a near-tie: the chunk's rows
    run the prefill attention where plain decoding runs the decode attention). The target is its own
    draft, so that proposals are accepted (this random model's replies repeat no n-gram of the
    prompts: an H100 run with prompt lookup accepted none)."""
    from tests.engine.test_speculative import copy_prompts
    from tests.runner.test_batch_graphs import count_verifications

    torch.backends.cuda.matmul.allow_tf32 = False
    ps = copy_prompts(1)
    kw = dict(dtype="float32", max_model_len=1024, num_kv_blocks=1024)
    want = [o.token_ids for o in LLM(ckpt, **kw).generate(ps, GREEDY)]
    llm = LLM(ckpt, **kw, speculative_method="draft", draft_model=str(ckpt))
    verified = count_verifications(llm.core.runner.batch_graphs)
    got = [o.token_ids for o in llm.generate(ps, GREEDY)]
    assert llm.stats()["spec_accepted_tokens"] > 0 and sum(verified) > 4
    assert sum(a == b for a, b in zip(got, want, strict=True)) >= len(ps) - 1
