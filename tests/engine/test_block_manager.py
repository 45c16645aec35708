"""BlockManager on plain Python objects (no torch): reference counts, hash-chained prefix reuse with
its token-equality guard, LRU eviction of cached free blocks, retention keys, cache reset."""

from __future__ import annotations

import subprocess
import sys

import pytest

import engine.block_manager as block_manager_module
from engine.block_manager import BlockManager
from runner.sampling_params import SamplingParams
from runner.sequence import Sequence

BS = 4


def make_seq(tokens: list[int], key: str | None = None) -> Sequence:
    return Sequence("r", tokens, SamplingParams(), retention_key=key)


def run_prompt(bm: BlockManager, tokens: list[int], key: str | None = None) -> Sequence:
    """Admit a sequence the way the scheduler does (prefix hits, then new blocks) and compute it all."""
    seq = make_seq(tokens, key)
    hits = bm.match_prefix(seq.token_ids)
    bm.allocate_prefix(seq, hits)
    assert bm.allocate(seq, seq.num_tokens)
    seq.num_computed_tokens = seq.num_tokens
    bm.commit_full_blocks(seq)
    return seq


def blocks(n: int, start: int) -> list[int]:
    """n full blocks of distinct token ids starting at start."""
    return list(range(start, start + n * BS))


def eviction_order(bm: BlockManager, count: int) -> list[int]:
    """Block ids handed out by the next `count` allocations (one block each)."""
    order = []
    for _ in range(count):
        seq = make_seq([0])
        assert bm.allocate(seq, 1)
        order.extend(seq.block_table)
    return order


def test_imports_no_torch():
    code = (
        "import sys; import engine.block_manager, engine.scheduler; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_ref_counts_shared_prefix_counted_twice_freed_once_each():
    bm = BlockManager(16, BS)
    start = bm.num_free_blocks
    prefix = blocks(2, 100)
    a = run_prompt(bm, prefix + [1, 2])
    b = run_prompt(bm, prefix + [3, 4, 5])
    shared = a.block_table[:2]
    assert b.block_table[:2] == shared
    assert b.num_cached_tokens == 2 * BS and b.num_computed_tokens == b.num_tokens
    assert [bm.blocks[i].ref_count for i in shared] == [2, 2]
    assert bm.blocks[a.block_table[2]].ref_count == 1 and bm.blocks[b.block_table[2]].ref_count == 1
    assert bm.num_free_blocks == start - 4  # 2 shared + 1 tail each

    bm.free(a)
    assert [bm.blocks[i].ref_count for i in shared] == [1, 1]
    assert bm.num_free_blocks == start - 3  # only a's tail came back
    assert a.block_table == [] and a.num_computed_tokens == 0
    bm.free(a)  # a sequence without blocks frees nothing
    assert [bm.blocks[i].ref_count for i in shared] == [1, 1]

    bm.free(b)
    assert all(blk.ref_count == 0 for blk in bm.blocks)
    assert bm.num_free_blocks == start


def test_free_block_count_returns_to_start():
    bm = BlockManager(12, BS)
    start = bm.num_free_blocks
    seqs = [run_prompt(bm, blocks(2, 0) + [i] * (i + 1)) for i in range(4)]
    seqs.append(run_prompt(bm, [7, 8, 9]))
    assert bm.num_free_blocks < start
    for seq in seqs:
        bm.free(seq)
    assert bm.num_free_blocks == start == bm.num_blocks
    # cached prefix blocks count as free and are still findable
    assert bm.match_prefix(blocks(2, 0) + [0]) != []


def test_allocate_fails_without_changing_anything():
    bm = BlockManager(3, BS)
    a = make_seq(list(range(3 * BS)))
    assert bm.allocate(a, a.num_tokens)
    b = make_seq([1, 2])
    assert not bm.allocate(b, 2)
    assert b.block_table == [] and bm.num_free_blocks == 0
    assert bm.blocks_needed(a, 3 * BS + 1) == 1


def test_chain_hash_same_tokens_other_position_or_prefix_do_not_hit():
    bm = BlockManager(16, BS)
    x, y, z = blocks(1, 100), blocks(1, 200), blocks(1, 300)
    run_prompt(bm, x + y + [1])
    assert len(bm.match_prefix(x + y + [2])) == 2
    assert bm.match_prefix(y + [2]) == []  # y's tokens, but at position 0
    assert bm.match_prefix(z + y + [2]) == []  # y's tokens after another prefix
    assert len(bm.match_prefix(x + z + [2])) == 1  # the chain breaks where the tokens differ


def test_forced_hash_collision_is_rejected_by_token_guard(monkeypatch):
    monkeypatch.setattr(block_manager_module, "chain_hash", lambda prev, toks: 12345)
    bm = BlockManager(16, BS)
    x, y = blocks(1, 100), blocks(1, 200)
    a = run_prompt(bm, x + [1])
    assert bm.match_prefix(y + [1]) == []  # same hash, other tokens: a miss
    assert bm.match_prefix(x + [1]) == [a.block_table[0]]
    # the same tokens repeated: block 1 "hits" block 0's hash and tokens, but not its place in the chain
    bm2 = BlockManager(16, BS)
    first = run_prompt(bm2, x + x + [1])
    hits = bm2.match_prefix(x + x + x + [1])
    assert hits == [first.block_table[0]]
    assert len(set(hits)) == len(hits)


def test_match_prefix_leaves_last_token_uncomputed():
    bm = BlockManager(16, BS)
    prompt = blocks(2, 100)  # exactly two full blocks
    a = run_prompt(bm, prompt)
    assert len(bm.match_prefix(prompt)) == 1  # the last token must be computed for its logits
    assert bm.match_prefix(prompt[:BS]) == []
    assert bm.match_prefix(prompt + [9]) == a.block_table[:2]
    b = make_seq(prompt)
    bm.allocate_prefix(b, bm.match_prefix(prompt))
    assert b.num_computed_tokens == BS and b.num_uncomputed_tokens == BS
    assert b.num_cached_tokens == BS


def test_prefix_cache_hit_accounting():
    bm = BlockManager(16, BS)
    run_prompt(bm, blocks(2, 100) + [1])
    hits0, queried0 = bm.prefix_cache_hit_tokens, bm.prefix_cache_queried_tokens
    run_prompt(bm, blocks(2, 100) + [2, 3])
    assert bm.prefix_cache_hit_tokens - hits0 == 2 * BS
    assert bm.prefix_cache_queried_tokens - queried0 == 2 * BS + 2


def test_prefix_caching_disabled():
    bm = BlockManager(8, BS, enable_prefix_caching=False)
    a = run_prompt(bm, blocks(2, 100) + [1])
    assert bm.match_prefix(blocks(2, 100) + [1]) == []
    assert all(bm.blocks[i].hash is None for i in a.block_table)
    bm.free(a)
    assert bm.num_free_blocks == 8 and len(bm.free_cached) == 0


def test_lru_uncached_first_then_least_recently_freed_tail_before_prefix():
    bm = BlockManager(8, BS)
    a = run_prompt(bm, blocks(3, 100))  # 3 full blocks (all committed)
    b = run_prompt(bm, blocks(2, 200) + [1])  # 2 full blocks + 1 partial (uncached)
    a_blocks, b_blocks = list(a.block_table), list(b.block_table)
    bm.free(a)
    bm.free(b)
    untouched = [i for i in range(8) if i not in a_blocks + b_blocks]
    order = eviction_order(bm, 8)
    # never-used blocks and b's partial tail (no hash) first; then a (freed before b), tail first; then b
    assert order[:3] == untouched + [b_blocks[2]]
    assert order[3:] == [a_blocks[2], a_blocks[1], a_blocks[0], b_blocks[1], b_blocks[0]]
    assert bm.match_prefix(blocks(3, 100) + [0]) == []  # evicted blocks are no longer findable


def test_prefix_eviction_keeps_prefix_findable_longest():
    bm = BlockManager(4, BS)
    a = run_prompt(bm, blocks(4, 100))
    a_blocks = list(a.block_table)
    bm.free(a)
    assert bm.match_prefix(blocks(4, 100) + [0]) == a_blocks
    assert eviction_order(bm, 2) == [a_blocks[3], a_blocks[2]]
    assert bm.match_prefix(blocks(4, 100) + [0]) == a_blocks[:2]


def test_reused_cached_block_becomes_most_recent():
    bm = BlockManager(6, BS)
    a = run_prompt(bm, blocks(1, 100) + [1])  # block a0 cached, a1 partial
    b = run_prompt(bm, blocks(1, 200) + [1])
    a0, b0 = a.block_table[0], b.block_table[0]
    bm.free(a)
    bm.free(b)
    # a's prefix is reused (taken from the cache) and freed again: now b's block is older
    c = run_prompt(bm, blocks(1, 100) + [2])
    assert c.block_table[0] == a0
    bm.free(c)
    order = eviction_order(bm, 6)
    assert order.index(b0) < order.index(a0)


def test_retention_key_idle_longest_is_evicted_first():
    bm = BlockManager(6, BS)
    a = run_prompt(bm, blocks(3, 100), key="alice")
    b = run_prompt(bm, blocks(3, 200), key="bob")
    a_blocks, b_blocks = list(a.block_table), list(b.block_table)
    bm.free(a)
    bm.free(b)
    # alice's session is active again (a request of hers arrived): bob's blocks are older now
    bm.touch_key("alice")
    order = eviction_order(bm, 6)
    assert order == b_blocks[::-1] + a_blocks[::-1]  # bob first; within a key, tail before prefix


def test_retention_key_tail_before_prefix_after_free():
    bm = BlockManager(3, BS)
    a = run_prompt(bm, blocks(3, 100), key="k")
    a_blocks = list(a.block_table)
    bm.free(a)  # free() touches the key too
    assert eviction_order(bm, 1) == [a_blocks[2]]
    assert bm.match_prefix(blocks(3, 100) + [0]) == a_blocks[:2]


def test_touch_unknown_key_is_harmless():
    bm = BlockManager(2, BS)
    bm.touch_key("nobody")
    assert bm.num_free_blocks == 2


def test_key_blocks_follow_reuse_and_eviction():
    bm = BlockManager(4, BS)
    a = run_prompt(bm, blocks(2, 100), key="k")
    a_blocks = list(a.block_table)
    bm.free(a)
    assert set(bm.key_blocks["k"]) == set(a_blocks)
    b = run_prompt(bm, blocks(2, 100) + [1])  # takes a0, a1 back out of the cache
    assert b.block_table[:2] == a_blocks
    assert "k" not in bm.key_blocks
    bm.free(b)
    eviction_order(bm, 4)
    assert "k" not in bm.key_blocks and not bm.free_cached and not bm.hash_to_block


def test_reset_prefix_cache():
    bm = BlockManager(8, BS)
    a = run_prompt(bm, blocks(2, 100) + [1], key="k")
    b = run_prompt(bm, blocks(2, 300) + [1])
    bm.free(a)
    free_before = bm.num_free_blocks
    bm.reset_prefix_cache()
    assert bm.num_free_blocks == free_before
    assert bm.match_prefix(blocks(2, 100) + [1]) == []
    assert bm.match_prefix(blocks(2, 300) + [1]) == []  # in use, but no longer findable
    assert not bm.free_cached and not bm.key_blocks and not bm.hash_to_block
    bm.free(b)
    assert bm.num_free_blocks == bm.num_blocks == len(bm.free_uncached)
    # the cache works again afterwards
    run_prompt(bm, blocks(2, 100) + [1])
    assert len(bm.match_prefix(blocks(2, 100) + [2])) == 2


def test_rejects_bad_sizes():
    with pytest.raises(ValueError):
        BlockManager(0, BS)
    with pytest.raises(ValueError):
        BlockManager(4, 0)
