"""Fixed-size KV blocks with reference counts and hash-chained prefix reuse. No torch.

A full block is identified by the chain hash of (previous block's hash, its tokens); a lookup hit
is confirmed by comparing the stored tokens, so a hash collision can never serve wrong K/V.
Free blocks that still hold a cached prefix stay findable until evicted; eviction takes uncached
free blocks first, then cached ones least recently used, where a request's retention key refreshes
all free blocks of that key (so a session idle longest is evicted first).
"""

from __future__ import annotations

from collections import OrderedDict, deque

from runner.sequence import Sequence


class Block:
    __slots__ = ("block_id", "ref_count", "hash", "prev_hash", "token_ids", "key")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.hash: int | None = None
        self.prev_hash: int | None = None  # hash of the block before it in its chain (guard)
        self.token_ids: tuple[int, ...] | None = None
        self.key: str | None = None  # retention key of the last sequence that used it


def chain_hash(prev_hash: int | None, token_ids: tuple[int, ...]) -> int:
    return hash((prev_hash, token_ids))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("BlockManager needs num_blocks > 0 and block_size > 0")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_uncached: deque[int] = deque(range(num_blocks))
        self.free_cached: OrderedDict[int, None] = OrderedDict()  # LRU first
        self.hash_to_block: dict[int, int] = {}
        # retention key -> its free cached blocks, in LRU order (a dict: touch_key keeps tail-first order)
        self.key_blocks: dict[str, dict[int, None]] = {}
        self.prefix_cache_hit_tokens = 0  # cumulative
        self.prefix_cache_queried_tokens = 0

    # ---- accounting -------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence holds (cached prefix blocks included)."""
        return len(self.free_uncached) + len(self.free_cached)

    def blocks_needed(self, seq: Sequence, num_tokens: int) -> int:
        """New blocks seq needs so that num_tokens tokens have slots."""
        return max(0, -(-num_tokens // self.block_size) - len(seq.block_table))

    # ---- prefix cache -----------------------------------------------------------------------
    def match_prefix(self, token_ids: list[int]) -> list[int]:
        """Block ids of the longest cached full-block prefix of token_ids, leaving at least the
        last token uncomputed (its logits are needed)."""
        if not self.enable_prefix_caching:
            return []
        bs = self.block_size
        hits: list[int] = []
        prev: int | None = None
        for i in range((len(token_ids) - 1) // bs):
            toks = tuple(token_ids[i * bs : (i + 1) * bs])
            h = chain_hash(prev, toks)
            bid = self.hash_to_block.get(h)
            # the guard: same tokens at the same place in the chain, not just the same hash
            if bid is None or self.blocks[bid].token_ids != toks or self.blocks[bid].prev_hash != prev:
                break
            hits.append(bid)
            prev = h
        return hits

    def allocate_prefix(self, seq: Sequence, hits: list[int]) -> None:
        """Give a newly admitted sequence the cached blocks found by match_prefix."""
        assert not seq.block_table and seq.num_computed_tokens == 0
        prev: int | None = None
        for bid in hits:
            block = self.blocks[bid]
            if block.ref_count == 0:
                self._take_from_cache(bid)
            block.ref_count += 1
            seq.block_table.append(bid)
            seq.block_hashes.append(block.hash)
            prev = block.hash
        del prev
        seq.num_computed_tokens = len(hits) * self.block_size
        seq.num_cached_tokens = seq.num_computed_tokens
        self.prefix_cache_hit_tokens += seq.num_computed_tokens
        self.prefix_cache_queried_tokens += seq.num_tokens

    def _take_from_cache(self, bid: int) -> None:
        del self.free_cached[bid]
        key = self.blocks[bid].key
        if key is not None:
            blocks = self.key_blocks.get(key)
            if blocks is not None:
                blocks.pop(bid, None)
                if not blocks:
                    del self.key_blocks[key]

    def touch_key(self, key: str) -> None:
        """A request of this retention key is active: its free cached blocks become most recent."""
        for bid in self.key_blocks.get(key, ()):
            self.free_cached.move_to_end(bid)

    # ---- allocation -------------------------------------------------------------------------
    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= self.num_free_blocks

    def allocate(self, seq: Sequence, num_tokens: int) -> bool:
        """Ensure seq has slots for num_tokens tokens; False (nothing changed) if blocks run out."""
        need = self.blocks_needed(seq, num_tokens)
        if need > self.num_free_blocks:
            return False
        for _ in range(need):
            bid = self._pop_free()
            block = self.blocks[bid]
            block.ref_count = 1
            block.key = seq.retention_key
            seq.block_table.append(bid)
        return True

    def _pop_free(self) -> int:
        if self.free_uncached:
            return self.free_uncached.popleft()
        bid, _ = self.free_cached.popitem(last=False)  # least recently used
        block = self.blocks[bid]
        if block.key is not None:
            blocks = self.key_blocks.get(block.key)
            if blocks is not None:
                blocks.pop(bid, None)
                if not blocks:
                    del self.key_blocks[block.key]
        if block.hash is not None and self.hash_to_block.get(block.hash) == bid:
            del self.hash_to_block[block.hash]
        block.hash = None
        block.token_ids = None
        return bid

    def commit_full_blocks(self, seq: Sequence) -> None:
        """Register the blocks seq has completely computed, so later requests can reuse them."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        full = min(seq.num_computed_tokens, seq.num_tokens) // bs
        prev = seq.block_hashes[-1] if seq.block_hashes else None
        for i in range(len(seq.block_hashes), full):
            toks = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            h = chain_hash(prev, toks)
            block = self.blocks[seq.block_table[i]]
            if block.hash is None:
                block.hash = h
                block.prev_hash = prev
                block.token_ids = toks
                self.hash_to_block.setdefault(h, block.block_id)
            seq.block_hashes.append(h)
            prev = h

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Free seq's blocks past its first num_tokens slots (rejected proposals' K/V); those blocks
        were never committed. The table is replaced, as free() does, so no stale copy is used."""
        keep = -(-num_tokens // self.block_size)
        if keep >= len(seq.block_table):
            return
        for bid in seq.block_table[keep:]:
            self.blocks[bid].ref_count -= 1
            if self.blocks[bid].ref_count == 0:
                self.free_uncached.append(bid)
        seq.block_table = seq.block_table[:keep]
        seq.table_row = -1

    def free(self, seq: Sequence) -> None:
        """Release seq's blocks (tail first, so a prefix outlives its continuations in the LRU)."""
        for bid in reversed(seq.block_table):
            block = self.blocks[bid]
            block.ref_count -= 1
            assert block.ref_count >= 0, f"block {bid} freed twice"
            if block.ref_count == 0:
                if block.hash is not None:
                    self.free_cached[bid] = None
                    if seq.retention_key is not None:
                        block.key = seq.retention_key
                    if block.key is not None:
                        self.key_blocks.setdefault(block.key, {})[bid] = None
                else:
                    self.free_uncached.append(bid)
        seq.block_table = []
        seq.table_row = -1  # the runner's copy of the old table is not this one
        seq.block_hashes = []
        seq.num_computed_tokens = 0
        if seq.retention_key is not None:
            self.touch_key(seq.retention_key)

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (blocks in use keep their contents but are no longer findable)."""
        for bid in list(self.free_cached):
            block = self.blocks[bid]
            block.hash = None
            block.token_ids = None
            block.key = None
            self.free_uncached.append(bid)
        self.free_cached.clear()
        self.key_blocks.clear()
        self.hash_to_block.clear()
        for block in self.blocks:
            if block.ref_count > 0:
                block.hash = None
                block.token_ids = None
