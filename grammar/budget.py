"""Token budget: calls complete within max_tokens.

The budget's regex (tools.py: the grammar's structure, schemas widened where an exact regex would
be huge or impossible) has a byte-level DFA (outlines_core builds it over a
vocabulary of the 256 single bytes). On that DFA we precompute, per state s:

- D[s]: tokens needed to finish from s, EOS included: a shortest path whose edges are real tokens,
  the 256 byte tokens plus the multi-byte tokens ("helpers") that spell the grammar's literals (keys,
  names, enum values, punctuation). Exact over those edges; an upper bound over the full vocabulary.
- J[c][s]: the largest D reachable from s by any byte string of length 1..LENGTHS[c]. Any token of at
  most that many bytes lands in a state whose D is at most J[c][s], without looking at the token.

A request with r tokens left (the one being chosen included) may take token x only if
D[s·x] <= r - 1 - MARGIN. Invariant D[s] + MARGIN <= r (checked up front: max_tokens >= D[start] +
MARGIN, else ValueError).
Per step: if every token is safe (r - 1 >= the largest D there is) nothing is masked; else allowed =
(tokens of at most LENGTHS[c] bytes, c the longest class with J[c][s] <= r - 1) | (helpers whose exact
next state has D <= r - 1) | EOS. Helpers on a shortest path always qualify, so the mask is never
empty; when r == D[s] only shortest-path tokens remain: the call closes exactly at the limit.
"""

from __future__ import annotations

import numpy as np
import torch
from outlines_core import Index, Vocabulary

from grammar.per_object import PerObjectCache
from grammar.vocab import TokenVocab, bools_to_bitmask

LENGTHS = (1, 2, 3, 4, 6, 8, 12, 16)  # token byte-length classes
END = 1  # the byte standing for EOS in the budget DFA (regex + END): only the END state is final
START = 0  # a byte read before the regex (no grammar contains it): see _byte_dfa
INF = np.int32(1 << 20)
# tokens kept in reserve: llguidance allows only the canonical tokenization of text the grammar
# forces (a forced `{}` is one token, never `{` then `},"`), which D, counted over any tokens, can
# undercount by one token per forced stretch near the end
MARGIN = 2
_HELPER_DIST_STATES = 4096  # cached rows of BudgetAutomaton.helper_dist (H int32 each)
_ALLOWED_ROWS = 1024  # cached rows of BudgetAutomaton.allowed (mask_words uint32 each: ~19 MB at 152k)
_PUNCT = set(b'{}[]",: \n0123456789-.')
_LITERAL_EXTRAS = ['", "', '": "', '": ', '"}', '"}}', "}}", '"]', "]}", "[]", "{}", "true", "false", "null"]


class _VocabTables:
    """Per-vocabulary tables every automaton shares (built once)."""

    def __init__(self, vocab: TokenVocab):
        lens = vocab.byte_lengths
        w = vocab.mask_words
        self.class_masks = np.zeros((len(LENGTHS), w), dtype=np.uint32)  # (classes, words) bitmasks
        for c, k in enumerate(LENGTHS):
            bits = np.zeros(w * 32, dtype=bool)
            bits[: vocab.n_tokens] = (lens >= 1) & (lens <= k)
            bits[vocab.eos_id] = True
            self.class_masks[c] = bools_to_bitmask(bits).numpy().view(np.uint32)
        # the byte-level token of each byte value (marker tokens carry \x02-\x05, EOS is END)
        self.byte_token = np.full(256, -1, dtype=np.int64)
        self.byte_token[END] = vocab.eos_id
        self.by_bytes: dict[bytes, int] = {}
        for tid, b in enumerate(vocab.token_bytes):
            first_of_byte = self.byte_token[b[0]] < 0 if b else False
            if len(b) == 1 and b[0] not in (START, END) and (first_of_byte or tid in vocab.special_ids):
                self.byte_token[b[0]] = tid
            if len(b) >= 2 and b not in self.by_bytes:
                self.by_bytes[b] = tid
        punct = [tid for b, tid in self.by_bytes.items() if len(b) <= 8 and all(x in _PUNCT for x in b)]
        self.punct_ids = np.array(sorted(punct), dtype=np.int64)


_tables: PerObjectCache[_VocabTables] = PerObjectCache()


def vocab_tables(vocab: TokenVocab) -> _VocabTables:
    return _tables.get(vocab, (), lambda: _VocabTables(vocab))


def _byte_dfa(regex: str) -> tuple[np.ndarray, np.ndarray, int]:
    """(T (n+1, 256) int32 next state, dead = n; final (n+1,) bool; start) of START + regex + END.

    Two outlines_core quirks, worked around: its Index drops transitions from an accepting state into
    a non-accepting one (text that could end but goes on into a call), so every word ends with END
    and only the state after END accepts; and a regex that starts with a bounded repetition (a
    top-level `"(...){0,32}"`) takes exponential time, which a leading START byte avoids.
    """
    single_bytes = Vocabulary(256, {bytes([b]): [b] for b in range(256)})
    index = Index(f"\\x{START:02x}(?:{regex})\\x{END:02x}", single_bytes)
    trans = index.get_transitions()
    states = np.array(sorted(set(trans) | {index.get_initial_state()} | set(index.get_final_states())))
    ids = {int(s): i for i, s in enumerate(states)}
    n = len(states)
    table = np.full((n + 1, 256), n, dtype=np.int32)
    for s, out in trans.items():
        keys = np.fromiter(out.keys(), dtype=np.int64, count=len(out))
        nxt = np.searchsorted(states, np.fromiter(out.values(), dtype=np.int64, count=len(out)))
        keep = keys < 256  # (outlines' own EOS id is 256)
        table[ids[s], keys[keep]] = nxt[keep]
    final = np.zeros(n + 1, dtype=bool)
    final[[ids[s] for s in index.get_final_states()]] = True
    return table, final, int(table[ids[index.get_initial_state()], START])


class BudgetAutomaton:
    """Compiled budget tables of one grammar (immutable, cached with it)."""

    def __init__(self, regex: str, vocab: TokenVocab):
        tables = vocab_tables(vocab)
        self.vocab = vocab
        self.tables = tables
        table, final, self.start = _byte_dfa(regex)
        n = table.shape[0] - 1
        self.n_states = n
        small = np.int16 if n + 1 < np.iinfo(np.int16).max else np.int32
        self.trans = table.astype(small)  # (n+1, 256): what the cursor walks (kept; ~2 MB per 4k states)
        # helpers: multi-byte tokens that spell pieces of the grammar's literals
        corpus = regex.replace("\\", "").encode() + "|".join(_LITERAL_EXTRAS).encode()
        subs = {corpus[i : i + k] for k in range(2, 17) for i in range(len(corpus) - k + 1)}
        helper = {tables.by_bytes[s] for s in subs if s in tables.by_bytes}
        helper.update(tables.punct_ids.tolist())
        bytes_ids = tables.byte_token[tables.byte_token >= 0]
        self.helper_ids = np.array(sorted(set(bytes_ids.tolist()) | helper), dtype=np.int64)  # (H,)
        # (n+1, H) next state per helper token, walked over all states at once
        by_byte = np.ascontiguousarray(table.T)  # (256, n+1)
        edges = np.empty((len(self.helper_ids), n + 1), dtype=np.int32)
        all_states = np.arange(n + 1, dtype=np.int32)
        for j, tid in enumerate(self.helper_ids.tolist()):
            cur = all_states
            for b in self.token_bytes(tid):
                cur = by_byte[b][cur]
            edges[j] = cur
        # the (H, n+1) edge table is big (tens of MB): dropped after D; restrict() walks the helpers
        # from one state on demand, over their bytes padded to (H, L) with per-token lengths
        lens = np.array([len(self.token_bytes(t)) for t in self.helper_ids.tolist()], dtype=np.int32)
        self.helper_len = lens
        pad = np.zeros((len(lens), int(lens.max())), dtype=np.uint8)
        for j, tid in enumerate(self.helper_ids.tolist()):
            b = self.token_bytes(tid)
            pad[j, : len(b)] = np.frombuffer(b, dtype=np.uint8)
        self.helper_bytes = pad
        # D by value iteration over unit-cost edges: D[final] = 0 (EOS taken), dead = INF. Only live
        # edges, grouped by source state (most helpers are dead in most states)
        src, hid = np.nonzero(n != edges.T)  # sorted by source
        dst = edges[hid, src]
        del edges
        sources, starts = np.unique(src, return_index=True)
        dist = np.full(n + 1, INF, dtype=np.int32)
        dist[final] = 0
        while True:
            cand = dist.copy()
            best = np.minimum.reduceat(dist[dst], starts) + 1 if len(dst) else np.zeros(0, dtype=np.int32)
            cand[sources] = np.minimum(cand[sources], best)
            cand[n] = INF
            cand[final] = 0
            if np.array_equal(cand, dist):
                break
            dist = cand
        self.dist = dist
        if dist[self.start] >= INF:
            raise ValueError("the grammar accepts no output")
        # J: worst D after 1..k bytes; states that cannot finish count as dead (the backends,
        # exact on their grammar, never enter them)
        live = dist < INF
        worst_next = np.where(live, dist, -1).astype(np.int32)  # (n+1,)
        jk = np.full(n + 1, -1, dtype=np.int32)
        js = []
        k = 0
        for target in LENGTHS:
            while k < target:
                # J_k[s] = max over bytes b of max(D[s·b], J_{k-1}[s·b])
                jk = np.maximum(worst_next[table], jk[table]).max(axis=1)
                k += 1
            js.append(jk.copy())
        self.worst = np.stack(js)  # (classes, n+1)
        self.max_dist = int(dist[live].max())  # bounds D after any token, however long
        self.min_tokens = int(dist[self.start]) + MARGIN
        self._helper_dist: dict[int, np.ndarray] = {}
        self._allowed: dict[tuple[int, int], np.ndarray] = {}
        # (H,) word and bit of each helper token in a bitmask row
        self.helper_word = self.helper_ids // 32
        self.helper_bit = np.uint32(1) << (self.helper_ids % 32).astype(np.uint32)

    def allowed(self, state: int, slack: int) -> np.ndarray:
        """(mask_words,) uint32 budget row of a live state with `slack` (D allowed after the next
        token; below max_dist): the longest length class that fits, the helpers that fit, EOS.
        Cached per (state, slack): requests near their limit share the few states they are in.
        Read-only (shared)."""
        key = (state, slack)
        hit = self._allowed.get(key)
        if hit is not None:
            return hit
        tables = self.tables
        fits = np.nonzero(self.worst[:, state] <= slack)[0]
        if len(fits):
            row = tables.class_masks[int(fits[-1])].copy()
        else:
            row = np.zeros(tables.class_masks.shape[1], dtype=np.uint32)
            eos = self.vocab.eos_id
            row[eos // 32] = np.uint32(1) << np.uint32(eos % 32)
        ok = self.helper_dist(state) <= slack
        if ok.any():
            np.bitwise_or.at(row, self.helper_word[ok], self.helper_bit[ok])
        row.flags.writeable = False
        if len(self._allowed) < _ALLOWED_ROWS:
            self._allowed[key] = row
        return row

    def helper_dist(self, state: int) -> np.ndarray:
        """(H,) D after each helper token from one state; cached per state (a request near its
        limit asks for the same few states every step; all requests share the cache)."""
        hit = self._helper_dist.get(state)
        if hit is None:
            hit = self.dist[self.helper_next(state)]
            if len(self._helper_dist) < _HELPER_DIST_STATES:
                self._helper_dist[state] = hit
        return hit

    def helper_next(self, state: int) -> np.ndarray:
        """(H,) next state of every helper token from one state (dead = n_states)."""
        cur = np.full(len(self.helper_ids), state, dtype=np.int64)
        for j in range(self.helper_bytes.shape[1]):
            live = self.helper_len > j
            cur = np.where(live, self.trans[cur, self.helper_bytes[:, j]], cur)
        return cur

    def token_bytes(self, token_id: int) -> bytes:
        if token_id == self.vocab.eos_id:
            return bytes([END])
        if token_id < self.vocab.n_tokens:
            return self.vocab.token_bytes[token_id]
        return b"\x00"  # never allowed: dead

    def cursor(self) -> BudgetCursor:
        return BudgetCursor(self)


class BudgetCursor:
    """Per-request position in the byte DFA, kept in step with the backend's matcher."""

    __slots__ = ("auto", "state", "history")

    def __init__(self, auto: BudgetAutomaton):
        self.auto = auto
        self.state = auto.start
        self.history: list[int] = []

    def next_state(self, token_id: int) -> int:
        """The state after a token (n_states: dead, the token is outside the grammar)."""
        table = self.auto.trans
        s = self.state
        for b in self.auto.token_bytes(token_id):
            s = int(table[s, b])
        return s

    def advance(self, token_id: int) -> None:
        self.advance_to(self.next_state(token_id))

    def advance_to(self, state: int) -> None:
        """Move to a state the caller already computed with next_state (one walk per token)."""
        self.history.append(self.state)
        self.state = state

    def rollback(self, n: int) -> None:
        for _ in range(n):
            self.state = self.history.pop()

    @property
    def lost(self) -> bool:
        """The output left the budget's language (its regex widens or approximates the grammar's,
        e.g. object keys in another order): from here on the budget guarantees nothing."""
        return self.state == self.auto.n_states

    @property
    def dist(self) -> int:
        return 1 if self.lost else int(self.auto.dist[self.state])

    def slack(self, remaining: int) -> int | None:
        """D allowed after the next token when the budget restricts it (allowed(state, slack)), else
        None (no token can break the budget, or the budget is lost)."""
        slack = remaining - 1 - MARGIN
        if slack >= self.auto.max_dist or self.state == self.auto.n_states:
            return None
        return slack

    def unrestricted(self, remaining: int) -> bool:
        """True when no token can break the budget (or the budget is lost): the mask is left alone."""
        return self.lost or remaining - 1 - MARGIN >= self.auto.max_dist

    def restrict(self, bitmask_row: torch.Tensor, remaining: int, nearest: bool = False) -> bool:
        """AND the budget mask into one bitmask row (mask_words,) int32 (CPU); False if unrestricted.

        nearest: instead, keep only the helper tokens (and EOS) whose next state has the smallest D
        among those the row allows (the fallback when the budget and the grammar disagree)."""
        auto = self.auto
        row = bitmask_row.numpy().view(np.uint32)  # the tensor's memory, edited in place
        if nearest:
            return self._nearest(row)
        slack = remaining - 1 - MARGIN  # D allowed after this token
        if slack >= auto.max_dist or self.lost:
            return False
        allowed = auto.allowed(self.state, slack)
        row &= allowed[: row.shape[0]]
        return True

    def _nearest(self, row: np.ndarray) -> bool:
        # row: (words,) uint32 view of the bitmask row
        auto = self.auto
        if self.lost:
            return False
        ids = auto.helper_ids
        in_row = (row[ids // 32] >> (ids % 32).astype(np.uint32)) & 1
        cand = ids[in_row.astype(bool)]
        if not len(cand):
            return False  # keep the grammar's row as it is
        d = auto.helper_dist(self.state)[np.searchsorted(ids, cand)]
        best = cand[d == d.min()]
        keep = np.zeros_like(row)
        np.bitwise_or.at(keep, best // 32, np.uint32(1) << (best % 32).astype(np.uint32))
        row &= keep
        return True


def _bit(j: int) -> int:
    # bit j of an int32 word, as a signed value (bit 31 is the sign)
    v = 1 << j
    return v - (1 << 32) if v >= 1 << 31 else v
