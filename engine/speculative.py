"""Speculative decoding: proposers (prompt lookup, draft model), the accept/reject rule, and each
sequence's speculation length.

A step verifies a sequence's proposals as one more chunk of query tokens: its last token and up to k
proposed ones (Sequence.spec_tokens), scheduled beside other sequences' prefills and decodes. The
target's logits at those k + 1 rows decide: greedy rows accept the longest prefix the argmax agrees
with plus the argmax after it; sampled rows accept proposal d with probability p(d) and, on the first
rejection, draw from p with d taken out (renormalized). Proposals are deterministic (n-gram
continuations, the draft model's argmax), for which that rule leaves the output distribution exactly
the target's. Proposals a grammar forbids are cut before verification; the matcher is stepped over
the proposals only to fill the rows' masks and rolled back: EngineCore advances it over accepted
tokens alone."""

from __future__ import annotations

import dataclasses

import torch

from kernels import dispatch as ops
from runner.sequence import PENDING, Sequence, SequenceStatus

NGRAM_SIZES = (4, 3, 2)  # suffix lengths matched against the context, longest first
OFF_BELOW = 0.3  # acceptance (running mean) under which a sequence stops speculating for a while
COOLDOWN = (8, 256)  # steps off: first time, doubling up to the last
MISS_OFF = 16  # with overlapped steps: most steps off after proposals came back empty (1, 2, 4, ...)


@dataclasses.dataclass
class SpecState:
    """Per-sequence speculation state (Sequence.spec)."""

    k: int  # current speculation length
    rate: float = 1.0  # running mean of the accepted fraction of proposals
    off: int = 0  # steps left without speculating
    cooldown: int = COOLDOWN[0]
    index: dict = dataclasses.field(default_factory=dict)  # n-gram -> position after its last use
    indexed: int = 0  # tokens whose n-grams are in index
    misses: int = 0  # proposals that came back empty in a row


class NgramProposer:
    """Prompt lookup: the continuation of the latest earlier occurrence of the context's suffix."""

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[list[int]]:
        return [self._one(s, k) for s, k in zip(seqs, ks, strict=True)]

    @staticmethod
    def _one(seq: Sequence, k: int) -> list[int]:
        toks, st = seq.token_ids, seq.spec
        n_tok = len(toks)
        index = st.index
        for j in range(max(st.indexed, 1), n_tok):  # n-grams ending before j: continuation at j
            for n in NGRAM_SIZES:
                if j >= n:
                    index[tuple(toks[j - n : j])] = j
        st.indexed = n_tok
        for n in NGRAM_SIZES:
            if n_tok > n:
                j = index.get(tuple(toks[n_tok - n :]))
                if j is not None:
                    return toks[j : j + k]
        return []


class DraftProposer:
    """A smaller checkpoint with the target's tokenizer proposes its greedy continuation. It keeps its
    own paged KV (a second pool and block manager) in a shadow Sequence per target sequence; a shadow's
    K/V past the first token its target rejected are rewritten by the next proposal."""

    def __init__(self, config, device: torch.device, dtype: torch.dtype, num_blocks: int, vocab: int):
        from engine.block_manager import BlockManager
        from models.gguf import resolve_checkpoint
        from models.loader import build_model, load_hf_config
        from runner.model_runner import ModelRunner

        path = resolve_checkpoint(config.draft_model)
        hf = load_hf_config(path, {})
        max_len = int(getattr(hf, "max_position_embeddings", 4096))
        model = build_model(hf, "auto", path, str(device), dtype, max_len, config.seed)
        off = {"speculative_method": "off", "draft_model": None}
        cfg = dataclasses.replace(config, model=path, enforce_eager=True, num_kv_blocks=num_blocks, **off)
        self.runner = ModelRunner(model, cfg, device, dtype)
        self.bm = BlockManager(self.runner.num_blocks, cfg.block_size, enable_prefix_caching=False)
        self.vocab = vocab  # draft rows past the target's vocabulary are never proposed
        self.shadows: dict[int, tuple[Sequence, int]] = {}  # seq_id -> (shadow, tokens known equal)

    def release(self, live: set[int]) -> None:
        """Free the shadows of sequences no longer running (finished, aborted or preempted)."""
        for sid in [s for s in self.shadows if s not in live]:
            self.bm.free(self.shadows.pop(sid)[0])

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in seqs]
        active: list[tuple[int, Sequence]] = []
        for i, (seq, k) in enumerate(zip(seqs, ks, strict=True)):
            sh, same = self.shadows.get(seq.seq_id) or (Sequence(seq.request_id, [], seq.params), 0)
            toks = seq.token_ids
            c = min(sh.num_computed_tokens, len(toks))
            c = next((j for j in range(same, c) if sh.token_ids[j] != toks[j]), c)  # first rejected
            sh.num_computed_tokens, sh.token_ids = c, list(toks)
            sh.status = SequenceStatus.RUNNING
            self.shadows[seq.seq_id] = (sh, len(toks))
            if self.bm.allocate(sh, len(toks) + k):
                active.append((i, sh))
        for step in range(max(ks, default=0)):
            active = [(i, sh) for i, sh in active if len(out[i]) < ks[i] and len(out[i]) == step]
            if not active:
                break
            ordered = sorted(active, key=lambda a: a[1].num_uncomputed_tokens > 1)  # decodes first
            batch = _batch([sh for _, sh in ordered])
            logits, sampling, _ = self.runner.execute(batch)
            assert logits is not None, "every sequence of a draft step samples"
            ids = logits[:, : self.vocab].argmax(dim=-1).tolist()
            for (i, sh), tok in zip([ordered[j] for j in sampling], ids, strict=True):
                sh.num_computed_tokens = sh.num_tokens
                sh.append_token(tok)
                out[i].append(tok)
        return out


def _batch(shadows: list[Sequence]):
    from runner.batch import ScheduledBatch

    n = [sh.num_uncomputed_tokens for sh in shadows]
    return ScheduledBatch(seqs=shadows, num_new_tokens=n, num_decodes=sum(1 for x in n if x == 1))


class Speculator:
    """What EngineCore asks: proposals before scheduling, verification after the forward."""

    def __init__(
        self,
        config,
        vocab_size: int,
        eos_ids: set[int],
        device,
        dtype,
        num_blocks: int,
        overlap: bool = False,
    ):
        self.method = config.speculative_method
        # steps overlap unless a sequence is to speculate (its proposals need its last token on the
        # host): empty proposals then back off for a few steps, so that a context without repeats runs
        # overlapped steps, as without speculation
        self.overlap = overlap
        self.k_max = config.num_speculative_tokens
        self.budget = config.max_num_batched_tokens
        self.vocab_size = vocab_size
        self.eos_ids = sorted(eos_ids)
        self.ngram = NgramProposer()
        self.draft = None
        if self.method == "draft":
            extra = config.max_num_seqs * (-(-self.k_max // config.block_size) + 1)
            self.draft = DraftProposer(config, device, dtype, num_blocks + extra, vocab_size)
        self.generator = torch.Generator(device=device).manual_seed(config.seed + 2)
        self.proposed = self.accepted = self.verified = 0  # cumulative, for /metrics

    def method_of(self, seq: Sequence) -> str:
        m = seq.params.speculative_method
        return self.method if m is None else m

    def wants_tokens(self, running: list[Sequence]) -> bool:
        """Whether a running sequence is to speculate at the next step: if so, the step in flight is
        finished first (its proposals start from its last token)."""
        return any(self._eligible(s) and (s.spec is None or not s.spec.off) for s in running)

    def _eligible(self, seq: Sequence) -> bool:
        p = seq.params
        return not (
            seq.done_scheduling
            or seq.status is not SequenceStatus.RUNNING
            or self.method_of(seq) == "off"
            or p.logprobs is not None
            or p.needs_penalties
            or p.logits_processors
        )

    def propose(self, running: list[Sequence], max_model_len: int) -> None:
        """Set spec_tokens of every running sequence: proposals where it speculates, else none."""
        picked: dict[str, tuple[list[Sequence], list[int]]] = {"ngram": ([], []), "draft": ([], [])}
        for seq in running:
            seq.spec_tokens = []
            k = self._length(seq, max_model_len)
            if k:
                group = picked[self.method_of(seq)]
                group[0].append(seq)
                group[1].append(k)
        if self.draft is not None:
            self.draft.release({s.seq_id for s in running})
        for name, (seqs, ks) in picked.items():
            if seqs:
                proposer = self.draft if name == "draft" else self.ngram
                for seq, k, drafts in zip(seqs, ks, proposer.propose(seqs, ks), strict=True):
                    constrained = seq.constraint is not None
                    seq.spec_tokens = _grammar_prefix(seq, drafts, k) if constrained else drafts
                    if self.overlap:
                        self._backoff(seq)

    @staticmethod
    def _backoff(seq: Sequence) -> None:
        """Overlapped steps: a sequence whose proposal came back empty sits out 1, 2, 4, ... steps
        (at most MISS_OFF) rather than hold every step on the host; a proposal resets the count."""
        st = seq.spec
        if seq.spec_tokens:
            st.misses = 0
        else:
            st.off = min(1 << st.misses, MISS_OFF)
            st.misses += 1

    def _length(self, seq: Sequence, max_model_len: int) -> int:
        """How many tokens to propose for seq now (0: it does not speculate this step)."""
        p = seq.params
        if not self._eligible(seq):
            return 0
        if seq.spec is None:
            seq.spec = SpecState(min(self.k_max, p.num_speculative_tokens or self.k_max))
        st = seq.spec
        if st.off:  # counted down whether or not its last token is known
            st.off -= 1
            return 0
        if seq.token_ids[-1] == PENDING:
            return 0
        left = max_model_len - seq.num_tokens
        if p.max_tokens is not None:
            left = min(left, p.max_tokens - seq.num_output_tokens)
        k = min(st.k, left - 1, self.budget - seq.num_uncomputed_tokens)
        return max(k, 0)

    def plain_greedy(self, seq: Sequence) -> bool:
        """Whether seq's rows are verified by their argmax alone (no bias, floor, grammar or sampling),
        so that one argmax over the step's rows serves it (EngineCore._verify)."""
        p = seq.params
        floor = p.min_tokens and seq.num_output_tokens < p.min_tokens
        return p.greedy and not p.logit_bias and not floor and seq.constraint is None

    def verify(
        self, seq: Sequence, drafts: list[int], logits: torch.Tensor, best: list[int] | None = None
    ) -> list[int]:
        """logits: (len(drafts) + 1, vocab) the target's rows at the seq's last token and its drafts;
        best: their argmax, read already (plain_greedy sequences). Returns the accepted drafts and one
        token after them."""
        if best is not None:
            n = next((i for i, d in enumerate(drafts) if best[i] != d), len(drafts))
            self._adapt(seq, len(drafts), n)
            return drafts[:n] + [best[n]]
        rows = logits.float()
        p = seq.params
        if p.logit_bias:
            ids = torch.tensor(list(p.logit_bias), device=rows.device)
            rows[:, ids] += torch.tensor(list(p.logit_bias.values()), device=rows.device)
        out = seq.num_output_tokens
        if p.min_tokens and out < p.min_tokens:
            banned = self.eos_ids + list(p.stop_token_ids)
            rows[: p.min_tokens - out, banned] = float("-inf")  # row i adds output token out + i
        if seq.constraint is not None:
            drafts = _grammar_masks(seq, drafts, rows, self.vocab_size)
        if p.greedy:
            best = rows.argmax(dim=-1).tolist()
            n = next((i for i, d in enumerate(drafts) if best[i] != d), len(drafts))
            tokens = drafts[:n] + [best[n]]
        else:
            tokens = self._sample(seq, drafts, rows)
        self._adapt(seq, len(drafts), len(tokens) - 1)
        return tokens

    def _sample(self, seq: Sequence, drafts: list[int], rows: torch.Tensor) -> list[int]:
        from runner.sampler import _filter

        k = len(drafts)
        probs = _filter(torch.softmax(rows / seq.params.temperature, dim=-1), [seq] * (k + 1))
        probs = probs / probs.sum(dim=-1, keepdim=True)
        gen = seq.generator or self.generator
        u = torch.rand(k, generator=gen, device=rows.device)
        at = torch.tensor(drafts, device=rows.device)
        p_draft = probs[torch.arange(k, device=rows.device), at] if k else u
        n = next((i for i, ok in enumerate((u < p_draft).tolist()) if not ok), k)
        last = probs[n]
        if n < k:  # rejected: the residual max(0, p - onehot(d)) renormalized
            last = last.clone()
            last[drafts[n]] = 0.0
            if float(last.sum()) <= 0.0:  # p was all on d (cannot happen with u < p(d) = 1)
                last = probs[n]
        tok = int(torch.multinomial(last, 1, generator=gen))
        return drafts[:n] + [tok]

    def _adapt(self, seq: Sequence, proposed: int, accepted: int) -> None:
        self.proposed += proposed
        self.accepted += accepted
        self.verified += 1
        st = seq.spec
        if st is None or not proposed:
            return
        st.rate = 0.7 * st.rate + 0.3 * accepted / proposed
        k_cap = min(self.k_max, seq.params.num_speculative_tokens or self.k_max)
        st.k = min(k_cap, st.k + 1) if accepted == proposed else max(1, accepted + 1)
        if st.rate < OFF_BELOW:  # does not pay: off for a while, longer each time
            st.off, st.cooldown = st.cooldown, min(2 * st.cooldown, COOLDOWN[1])
            st.rate, st.k = 0.6, 1

    def stats(self) -> dict:
        return {
            "spec_proposed_tokens": self.proposed,
            "spec_accepted_tokens": self.accepted,
            "spec_verify_steps": self.verified,
        }


def _grammar_prefix(seq: Sequence, drafts: list[int], k: int) -> list[int]:
    """What the grammar forces next if anything (up to k tokens), else the longest prefix of drafts it
    allows (the matcher is left as it was)."""
    c, n = seq.constraint, 0
    forced = c.forced_tokens() if hasattr(c, "forced_tokens") else None
    if forced:
        return forced[:k]
    for tok in drafts:
        if c.is_terminated() or not c.accept_token(tok):
            break
        n += 1
    c.rollback(n)
    return drafts[:n]


def _grammar_masks(seq: Sequence, drafts: list[int], rows: torch.Tensor, vocab: int) -> list[int]:
    """Mask each row with the grammar after the drafts before it (the matcher is left as it was);
    returns the drafts the matcher took (all of them, as proposals were checked)."""
    c = seq.constraint
    words = (vocab + 31) // 32
    bitmask = torch.full((len(drafts) + 1, words), -1, dtype=torch.int32)
    left = seq.params.max_tokens
    left = 1 << 30 if left is None else left - seq.num_output_tokens
    n = 0
    for i in range(len(drafts) + 1):
        c.fill_bitmask(bitmask, i, max(left - i, 0))
        if i == len(drafts) or not c.accept_token(drafts[i]):
            break
        n += 1
    c.rollback(n)
    ops.apply_token_bitmask_(rows[: n + 1], bitmask[: n + 1].to(rows.device))
    return drafts[:n]
