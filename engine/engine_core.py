"""The step loop shared by LLM (offline) and AsyncEngine (online): admit requests, schedule,
run the model, sample, detokenize, stop, free. Knows no sessions: a request may carry an opaque
retention key that the block manager uses to choose what to evict.

Over 400 lines on purpose: the step's order (launch ahead, read the previous tokens late, sample,
verify proposals, fail one sequence alone) is one protocol whose invariants span these methods;
split across files, each half would have to restate the other's."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.detokenizer import IncrementalDetokenizer
from engine.outputs import StepOutput, TokenLogprob
from engine.scheduler import Scheduler
from kernels.onednn import pack_model
from models import heap
from models.gguf import resolve_checkpoint
from models.loader import build_model, load_hf_config
from runner.model_runner import ModelRunner
from runner.sampler import LogprobTensors, Sampler, logprob_rows, logprob_tensors
from runner.sampling_params import SamplingParams
from runner.sequence import PENDING, Sequence

log = logging.getLogger("chatloom.engine")


@dataclass
class _InFlight:
    """A launched step whose sampled tokens may still be on the device."""

    seqs: list[Sequence]
    positions: list[int]  # where each sequence's placeholder sits in its token_ids (-1: row dropped)
    token_ids: torch.Tensor  # (rows,) sampled ids on the device
    host_ids: torch.Tensor  # (rows,) the same ids on the host (pinned; valid once event fired)
    event: object | None
    logprobs: LogprobTensors | None  # on the host, valid once event fired
    top: list[int | None]  # top logprobs asked per row


class EngineCore:
    def __init__(self, config: EngineConfig) -> None:
        from transformers import AutoTokenizer

        t0 = time.perf_counter()
        self.config = config
        if not config.model:
            raise ValueError("EngineConfig.model must name a checkpoint folder")
        config.model = resolve_checkpoint(config.model)  # a .gguf file -> its converted folder (cached)
        if not Path(config.model).is_dir():
            raise ValueError(f"model folder {config.model!r} does not exist")
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.device = torch.device(config.resolve_device())
        self.dtype = config.resolve_dtype(self.device.type)
        config.block_size = config.resolve_block_size(self.device.type)
        config.max_num_batched_tokens = config.resolve_max_num_batched_tokens(self.device.type)
        self.hf_config = load_hf_config(config.model, config.hf_overrides)
        self.tokenizer = AutoTokenizer.from_pretrained(config.tokenizer or config.model)
        native = int(getattr(self.hf_config, "max_position_embeddings", 4096))
        self.max_model_len = config.max_model_len or native
        if config.max_model_len and config.max_model_len > native:
            raise ValueError(f"max_model_len {config.max_model_len} exceeds the model's {native} positions")
        torch.manual_seed(config.seed)
        model = build_model(
            self.hf_config,
            config.load_format,
            config.model,
            str(self.device),
            self.dtype,
            self.max_model_len,
            config.seed,
        )
        if config.quantization != "none":
            _quantize(model, config.quantization, self.device)
        elif self.device.type == "cpu":
            # float32 projections kept only in oneDNN's packed form, not beside it (kernels.onednn)
            pack_model(model)
            heap.give_back()  # the dense weights' pages
        self.vocab_size = int(self.hf_config.vocab_size)
        self.runner = ModelRunner(model, config, self.device, self.dtype)
        self.block_manager = BlockManager(
            self.runner.num_blocks, config.block_size, config.enable_prefix_caching
        )
        self.scheduler = Scheduler(
            self.block_manager,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            config.enable_chunked_prefill,
        )
        self.eos_token_ids = _eos_ids(self.hf_config, self.tokenizer, config.model)
        self.sampler = Sampler(
            self.vocab_size,
            self.eos_token_ids,
            self.device,
            config.seed,
            max_rows=config.max_num_seqs,
            mask_cache_rows=config.device_mask_rows,
            graphs=not config.enforce_eager and config.sampler_graphs,
        )
        self.requests: dict[str, list[Sequence]] = {}
        self.num_steps = 0
        overlap = config.async_scheduling
        self.overlap = self.device.type == "cuda" if overlap is None else overlap
        # speculative.Speculator: proposals need the host's tokens, so a step in flight is finished
        # before a step that proposes (steps without proposals overlap as usual)
        self.spec = None
        if config.speculative_method != "off":
            from engine.speculative import Speculator

            num_blocks = self.runner.num_blocks
            self.spec = Speculator(
                config, self.vocab_size, self.eos_token_ids, self.device, self.dtype, num_blocks, self.overlap
            )
        self._inflight: _InFlight | None = None
        # (batch, logits, sampling) of a step whose forward the previous step launched (launch_ahead)
        self._ahead: tuple | None = None
        # the sequence lists the current step touches, kept by reference and turned into request ids
        # only when a step fails (None: while scheduling, when any request may be half-updated)
        self._touched: list[list[Sequence]] | None = []
        self._failed: list[StepOutput] = []  # sequences that failed alone this step, to report
        self.startup_seconds = time.perf_counter() - t0
        log.info(
            "engine ready in %.1fs: %s on %s (%s)",
            self.startup_seconds,
            config.model,
            self.device,
            self.dtype,
        )

    # ---- requests ---------------------------------------------------------------------------
    def encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_special_tokens=False)
        return list(prompt)

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        retention_key: str | None = None,
    ) -> list[Sequence]:
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already running")
        ids = self.encode(prompt)
        if not ids:
            raise ValueError("the prompt is empty")
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise ValueError(f"prompt token id {bad} is outside the vocabulary (0..{self.vocab_size - 1})")
        params.check_vocab(self.vocab_size)
        method = params.speculative_method
        if method not in (None, "off") and getattr(self.spec, method, None) is None:
            raise ValueError(f"speculative_method {method!r}: the engine was not started with it")
        need = len(ids) + (params.max_tokens or 1)
        if need > self.max_model_len:
            raise ValueError(
                f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the context length "
                f"{self.max_model_len}"
            )
        if -(-need // self.config.block_size) > self.block_manager.num_blocks:
            raise ValueError("the request needs more KV blocks than the whole cache holds")
        if retention_key is not None:
            self.block_manager.touch_key(retention_key)
        seqs = []
        for i in range(params.n):
            seq = Sequence(request_id, ids, params, index=i, retention_key=retention_key)
            seq.detok = IncrementalDetokenizer(
                self.tokenizer,
                ids,
                params.stop,
                params.skip_special_tokens,
                params.include_stop_str_in_output,
            )
            if params.seed is not None:
                seq.generator = torch.Generator(device=self.device).manual_seed(params.seed + i)
            seqs.append(seq)
            self.scheduler.add(seq)
        self.requests[request_id] = seqs
        return seqs

    def abort(self, request_id: str) -> list[StepOutput]:
        outs = []
        for seq in self.requests.pop(request_id, []):
            if not seq.is_finished:
                self.scheduler.finish(seq)
                seq.finish_reason = "abort"
                while seq.token_ids[-1] == PENDING:  # tokens still in flight are dropped
                    seq.token_ids.pop()
                outs.append(self._output(seq, [], None, ""))
        return outs

    def abort_all(self) -> list[str]:
        """After a failed step: end every request (their state may be half-updated) and return
        their ids; the engine is consistent and empty afterwards."""
        ids = list(self.requests)
        for rid in ids:
            self.abort(rid)
        self._inflight = None
        self._ahead = None
        return ids

    def abort_step(self) -> list[str]:
        """After a step failed for a reason no single sequence was blamed for: end the requests the
        step had touched (their state may be half-updated) and return their ids; requests that were
        only waiting, or running but not in the step, go on. While the scheduler itself was running
        any request may be half-updated, so all are ended then."""
        if self._touched is None:
            return self.abort_all()
        touched = {s.request_id for seqs in self._touched for s in seqs}
        # a token placeholder left by the dropped in-flight step marks a touched request too
        touched |= {rid for rid, seqs in self.requests.items() if any(PENDING in s.token_ids for s in seqs)}
        ids = [rid for rid in touched if rid in self.requests]
        for rid in ids:
            self.abort(rid)
        self._inflight = None
        self._ahead = None
        self._touched = []
        return ids

    def fail_sequence(self, seq: Sequence, message: str | None = None) -> None:
        """End one sequence alone with finish_reason "error" (its request's other samples go on);
        its output, carrying the message, is returned by this step."""
        if seq.is_finished:
            return
        seq.error = seq.error or message or "failed"
        self.scheduler.finish(seq)
        seq.finish_reason = "error"
        while seq.token_ids and seq.token_ids[-1] == PENDING:  # its token in flight is dropped
            seq.token_ids.pop()
        self._failed.append(self._output(seq, [], None, ""))
        if all(s.is_finished for s in self.requests.get(seq.request_id, [])):
            self.requests.pop(seq.request_id, None)

    def _end_failed(self) -> None:
        """End the sequences the sampler marked failed (none in a step where nothing failed)."""
        failed, self.sampler.failed = self.sampler.failed, []
        for seq in failed:
            if not seq.is_finished:
                self.fail_sequence(seq)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or self._inflight is not None or self._ahead is not None

    def reset_prefix_cache(self) -> None:
        self.block_manager.reset_prefix_cache()

    def stats(self) -> dict:
        bm = self.block_manager
        return {
            "free_blocks": bm.num_free_blocks,
            "total_blocks": bm.num_blocks,
            "blocks_in_use": bm.num_blocks - bm.num_free_blocks,
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting),
            "prefix_cache_hit_tokens": bm.prefix_cache_hit_tokens,
            "prefix_cache_queried_tokens": bm.prefix_cache_queried_tokens,
            "num_preemptions": self.scheduler.num_preemptions,
            **(self.spec.stats() if self.spec is not None else {}),
        }

    # ---- the step ---------------------------------------------------------------------------
    def step(self) -> list[StepOutput]:
        """One engine step (see _step); sequences that failed alone in it (their sampling, grammar
        mask or detokenization raised) end with finish_reason "error" while the others go on."""
        self._touched = []
        outputs = self._step()
        return outputs + self.take_failed()

    def take_failed(self) -> list[StepOutput]:
        """The outputs of sequences that failed alone and were not yet returned (a step that raised
        may leave some)."""
        failed, self._failed = self._failed, []
        return failed

    @torch.inference_mode()  # the runner's logits are inference tensors: the sampler edits them in place
    def _step(self) -> list[StepOutput]:
        """One engine step. With overlap (the CUDA default) the step's sampled tokens stay on the
        device and are read back during the next step: the GPU runs the forward of step N while the
        host finishes step N-1. Rows that need the previous token on the host before they sample
        (grammars, penalties, logits processors) get it while this step's forward runs; then the
        host fills their masks and launches the sampling, and with launch_ahead it has already
        scheduled and prepared the next step, whose forward it launches right after (the next call
        starts from that launched step)."""
        outputs: list[StepOutput] = []
        prev, self._inflight = self._inflight, None
        ahead, self._ahead = self._ahead, None
        tokens = None  # sampled by the step's graph
        if prev is not None:
            self._touch(prev.seqs)
        if ahead is not None:  # launched by the previous step (see _sample's ahead_of)
            batch, logits, sampling = ahead
            self._touch(batch.seqs)
        else:
            if prev is not None and self._proposes_next():
                outputs += self._finish(prev)  # proposals start from the tokens in flight
                prev = None
            self._touched = None  # a failing schedule() may leave any request half-updated
            if self.spec is not None:
                self.spec.propose(self.scheduler.running, self.max_model_len)
            batch = self.scheduler.schedule()
            self._touched = []
            if prev is not None:
                self._touch(prev.seqs)
            self._touch(batch.seqs)
            if not batch:
                if prev is not None:
                    outputs += self._finish(prev)
                return outputs
            self._begin(batch)
            # a decode-only step of plain rows is sampled by the graph that runs its forward
            temps = self.sampler.graph_temps(batch.seqs) if self.runner.samples_in_graph(batch) else None
            pending = prev.token_ids if prev is not None else None
            logits, sampling, tokens = self.runner.execute(batch, pending, temps)
            if self.spec is not None and logits is not None and logits.shape[0] > len(sampling):
                # the rows of chunks that end in proposals follow the sampling ones
                logits, spec_logits = (logits[: len(sampling)] if sampling else None), logits[len(sampling) :]
                outputs += self._verify(batch, spec_logits)
        seqs = [batch.seqs[i] for i in sampling]
        # sampling waits for the previous tokens only when a row reads them on the host
        late = prev is not None and any(s.needs_host_tokens for s in seqs)
        launched = self._sample(logits, seqs) if logits is not None and not late else None
        if tokens is not None:  # (ids on the device, their pinned host row or None)
            ids, host = tokens
            launched = self._launched(seqs, self._reserve(seqs), ids, None, [None] * len(seqs), host)
        if prev is not None:
            outputs += self._finish(prev)  # waits only for the previous step's tokens
        if logits is not None and late:
            # not ahead of a step that proposes: its proposals need this step's tokens on the host
            if self.overlap and self.config.launch_ahead and not self._proposes_next():
                self._inflight = self._sample(logits, seqs, ahead_of=batch)  # ran after_step(batch)
                return outputs
            launched = self._sample(logits, seqs)
        self.scheduler.after_step(batch)
        if launched is not None:
            if self.overlap:
                self._inflight = launched
            else:
                outputs += self._finish(launched)
        return outputs

    def _proposes_next(self) -> bool:
        """Whether a running sequence is to speculate in the next step (it needs its tokens first)."""
        return self.spec is not None and self.spec.wants_tokens(self.scheduler.running)

    def _touch(self, seqs: list[Sequence]) -> None:
        if self._touched is not None:
            self._touched.append(seqs)

    def _begin(self, batch) -> None:
        self.num_steps += 1
        for seq in batch.seqs[batch.num_decodes :]:  # a sequence's first step is always a prefill
            if seq.constraint is None and seq.params.constraint is not None:
                seq.constraint = seq.params.constraint.new()

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence], ahead_of=None) -> _InFlight:
        """Launch sampling for the rows of logits (one per sequence). A sequence that stopped since
        it was scheduled keeps its row, but nothing of it is read and its token is dropped.

        ahead_of: the batch just run, for a step whose rows read the previous tokens on the host
        (launch_ahead). Its after_step runs here, and the next step is scheduled and prepared before
        the sampling launch and its forward launched right after: the device goes from this
        sampling straight into the next forward (the next step() starts from it)."""
        top = [None if s.is_finished else s.params.logprobs for s in seqs]
        raw = logits.clone() if any(t is not None for t in top) else None
        logits = self.sampler.process(logits, seqs)  # masks from the counts before this step's token
        self._end_failed()  # rows whose own edits or grammar mask failed: no token is kept
        positions = self._reserve(seqs)
        nxt = step = None
        if ahead_of is not None:
            self.scheduler.after_step(ahead_of)
            touched, self._touched = self._touched, None
            if self.spec is not None:  # counts down sequences sitting out (tokens in flight propose nothing)
                self.spec.propose(self.scheduler.running, self.max_model_len)
            nxt = self.scheduler.schedule()
            self._touched = touched
            self._touch(nxt.seqs)
            if nxt:
                self._begin(nxt)
                step = self.runner.prepare(nxt, defer_pending=True)
        token_ids = self.sampler.sample(logits, seqs, self.runner.static_logits(logits))
        self._end_failed()  # rows that could not be sampled alone: their placeholder is dropped
        launched = self._launched(seqs, positions, token_ids, raw, top)
        if step is not None:
            self._ahead = (nxt, *self.runner.run(nxt, step, pending=token_ids))
        return launched

    def _verify(self, batch, logits: torch.Tensor) -> list[StepOutput]:
        """The step's speculating sequences (their chunk ends in proposals, rows in logits in batch
        order): keep the accepted tokens and one more, count the K/V of the accepted ones only (here,
        not in after_step: full blocks are registered before an end frees them), free the blocks of
        the rejected ones."""
        outputs, row = [], 0
        # one argmax and one read for every greedy row without masks, rather than one per sequence
        plain = {
            id(s) for s in batch.seqs[batch.num_decodes :] if s.spec_tokens and self.spec.plain_greedy(s)
        }
        best = logits.argmax(dim=-1).tolist() if plain else None
        for i in range(batch.num_decodes, len(batch.seqs)):
            seq, spec = batch.seqs[i], batch.seqs[i].spec_tokens
            if not spec:
                continue
            at, row = row, row + len(spec) + 1
            seq.spec_tokens = []
            try:
                mine = best[at:row] if id(seq) in plain else None
                tokens = self.spec.verify(seq, spec, logits[at:row], mine)
                base = seq.num_tokens
                seq.token_ids.extend(tokens)
                seq.num_computed_tokens += batch.num_new_tokens[i] - (len(spec) + 1 - len(tokens))
                batch.num_new_tokens[i] = 0
                self.block_manager.commit_full_blocks(seq)
                for j, tok in enumerate(tokens):
                    outputs.append(self._accept(seq, base + j, tok, None))
                    if seq.is_finished:
                        break
            except Exception as exc:  # its grammar or detokenizer: this sequence fails alone
                log.warning("request %s (sample %d) failed verifying: %r", seq.request_id, seq.index, exc)
                seq.error = f"failed while verifying proposals: {type(exc).__name__}: {exc}"
                self.fail_sequence(seq)
            if not seq.is_finished:
                self.block_manager.truncate(seq, seq.num_tokens)
        return outputs

    def _reserve(self, seqs: list[Sequence]) -> list[int]:
        """A placeholder for each row's token in flight; returns where each sits (-1: row dropped)."""
        positions = []
        for row, seq in enumerate(seqs):
            if seq.is_finished:
                positions.append(-1)
                continue
            positions.append(seq.num_tokens)
            seq.append_token(PENDING)
            seq.pending_row = row
            p = seq.params
            if (p.max_tokens is not None and seq.num_output_tokens >= p.max_tokens) or (
                seq.num_tokens >= self.max_model_len
            ):
                seq.done_scheduling = True  # its last token is in flight
        return positions

    def _launched(self, seqs, positions, token_ids, raw, top, host=None) -> _InFlight:
        """host: a pinned row the device fills itself (a step graph's published tokens), else a copy
        to the host is queued."""
        lps = logprob_tensors(raw, token_ids, top) if raw is not None else None
        on_gpu, event = token_ids.device.type == "cuda", None
        if host is None:
            host = _to_host(token_ids) if on_gpu else token_ids
        if on_gpu:
            if lps is not None:
                lps = LogprobTensors(*(_to_host(t) for t in lps))
            event = torch.cuda.Event()
            event.record()
        return _InFlight(seqs, positions, token_ids, host, event, lps, top)

    def _finish(self, inflight: _InFlight) -> list[StepOutput]:
        if inflight.event is not None:
            inflight.event.synchronize()
        lps = logprob_rows(inflight.logprobs, inflight.top) if inflight.logprobs is not None else None
        outputs = []
        for i, (seq, pos, tok) in enumerate(
            zip(inflight.seqs, inflight.positions, inflight.host_ids.tolist(), strict=True)
        ):
            if seq.is_finished:  # aborted, or stopped one step earlier: this token is not kept
                continue
            seq.token_ids[pos] = tok
            lp = None
            if lps is not None and lps[i] is not None:
                lp = TokenLogprob(tok, lps[i][0], lps[i][1])
                seq.logprobs.append(lp)
            try:
                outputs.append(self._accept(seq, pos, tok, lp))
            except Exception as exc:  # its grammar or detokenizer: this sequence fails alone
                log.warning(
                    "request %s (sample %d) failed on token %d: %r", seq.request_id, seq.index, tok, exc
                )
                if not seq.is_finished:
                    del seq.token_ids[pos + 1 :]
                    seq.error = f"failed while accepting token {tok}: {type(exc).__name__}: {exc}"
                    self.fail_sequence(seq)
        return outputs

    def _accept(self, seq: Sequence, pos: int, tok: int, lp: TokenLogprob | None) -> StepOutput:
        p = seq.params
        if seq.constraint is not None:
            seq.constraint.accept_token(tok)
        n_out = pos + 1 - seq.num_prompt_tokens  # output tokens up to this one
        before = len(seq.detok.text)
        reason = None
        if not p.ignore_eos and tok in self.eos_token_ids and n_out >= p.min_tokens:
            reason = "stop"
        elif tok in p.stop_token_ids:
            reason, seq.stop_reason = "stop", tok
        else:
            seq.detok.add(tok)
            hit = seq.detok.find_stop(len(seq.detok.text) - before)
            if hit is not None:
                reason, seq.stop_reason = "stop", hit
        if reason is None:
            if seq.constraint is not None and seq.constraint.is_terminated():
                reason = "stop"
            elif (p.max_tokens is not None and n_out >= p.max_tokens) or pos + 1 >= self.max_model_len:
                reason = "length"
        if reason is not None:
            if not isinstance(seq.stop_reason, str):  # text held back (a byte run) ends with the output
                seq.detok.flush()
            del seq.token_ids[pos + 1 :]  # a token sampled after the stop is dropped
            seq.finish_reason = reason
            self.scheduler.finish(seq)
            if all(s.is_finished for s in self.requests.get(seq.request_id, [])):
                self.requests.pop(seq.request_id, None)
        return self._output(seq, [tok], lp, seq.detok.delta(reason is not None))

    def _output(self, seq: Sequence, new_ids: list[int], lp: TokenLogprob | None, delta: str) -> StepOutput:
        return StepOutput(
            request_id=seq.request_id,
            index=seq.index,
            new_token_ids=new_ids,
            text_delta=delta,
            finish_reason=seq.finish_reason,
            logprobs=[lp] if lp is not None else None,
            prompt_tokens=seq.num_prompt_tokens,
            cached_tokens=seq.num_cached_tokens,
            stop_reason=seq.stop_reason,
            error=seq.error,
        )


def _to_host(t: torch.Tensor) -> torch.Tensor:
    """A pinned host copy of a device tensor, queued on the stream (valid once an event after it fires)."""
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host


def _eos_ids(hf_config, tokenizer, model_path: str) -> set[int]:
    ids: set[int] = set()

    def add(v) -> None:
        if isinstance(v, int):
            ids.add(v)
        elif isinstance(v, list | tuple):
            ids.update(x for x in v if isinstance(x, int))

    add(getattr(hf_config, "eos_token_id", None))
    add(tokenizer.eos_token_id)
    gen = Path(model_path) / "generation_config.json"
    if gen.exists():
        import json

        add(json.loads(gen.read_text()).get("eos_token_id"))
    return ids


def _quantize(model, mode: str, device: torch.device) -> None:
    """EngineConfig.quantization: the projections' weights quantized in place (kernels.quant_linear)."""
    if device.type != "cpu":
        raise ValueError("EngineConfig.quantization runs on the CPU only (device='cpu')")
    from kernels.quant_linear import quantize_model

    stats = quantize_model(model, mode)
    log.info("%s weights: %d matrices, %.0f MiB of float weights -> %.0f MiB", mode, stats["weights"],
             stats["float_bytes"] / 2**20, stats["quant_bytes"] / 2**20)  # fmt: skip
