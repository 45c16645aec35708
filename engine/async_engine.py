"""Online engine: requests from the event loop, the step loop in a thread.

engine = AsyncEngine(EngineConfig(model=...)); await engine.start()
async for out in engine.generate(prompt, params, request_id="r1"): ...   # StepOutput deltas
await engine.abort("r1")
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
from collections.abc import AsyncIterator
from concurrent.futures import Future

from engine.config import EngineConfig
from engine.engine_core import EngineCore
from engine.outputs import StepOutput
from engine.step_thread import StepThread
from models import heap
from runner.sampling_params import SamplingParams

log = logging.getLogger("chatloom.engine")

_DONE = object()


class _Failed:
    """Delivered to a stream whose request was ended by a failed engine step."""

    def __init__(self, error: Exception) -> None:
        self.error = error


class GenerationError(RuntimeError):
    """A request ended by the engine before it finished: one of its sequences failed alone
    (finish_reason "error": its sampling, grammar mask or detokenization raised), or the step it was
    in failed. Other requests are not affected."""


class AsyncEngine:
    def __init__(self, config: EngineConfig | None = None, **kwargs) -> None:
        self.config = config or EngineConfig(**kwargs)
        if self.config.resolve_device() == "cpu":
            heap.limit_arenas()  # before the model loads and the server's threads start allocating
        # built on the thread that will step it (engine.step_thread says why)
        self._worker = StepThread("chatloom-engine", owner=self)
        self.core: EngineCore = self._worker.call(EngineCore, self.config)
        self.tokenizer = self.core.tokenizer
        self.max_model_len = self.core.max_model_len
        self.model_config = self.core.hf_config
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._wakeup = threading.Event()
        self._loop_done: Future | None = None  # the step loop, running on self._worker
        self._stopping = False
        self._stats: dict = self.core.stats()
        self._ids = itertools.count()
        self.error: BaseException | None = None
        # CPU: freed step buffers given back to the system once a second (models.heap)
        self._trim = heap.Trimmer() if self.core.device.type == "cpu" else None

    # ---- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        if self._loop_done is None:
            self._loop_done = self._worker.submit(self._loop)

    async def shutdown(self) -> None:
        self._stopping = True
        self._wakeup.set()
        if self._loop_done is not None:
            await asyncio.wrap_future(self._loop_done)
            self._loop_done = None
        self._worker.stop()
        # ended before shutdown returns, as the loop's thread was joined before: a thread still tearing
        # down its torch state while the interpreter exits aborted the process (`chatloom chat`)
        await asyncio.to_thread(self._worker.join)

    @property
    def running(self) -> bool:
        return self._loop_done is not None and not self._loop_done.done()

    # ---- requests ---------------------------------------------------------------------------
    async def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        request_id: str | None = None,
        retention_key: str | None = None,
    ) -> AsyncIterator[StepOutput]:
        """Yields StepOutputs (new tokens and text of one sample) until all n samples finish.
        Leaving the loop early (or cancelling the task) aborts the request."""
        if not self.running:
            raise RuntimeError("AsyncEngine is not running: await engine.start() first")
        rid = request_id or f"req-{next(self._ids)}"
        if rid in self._streams:  # checked here: a failed add must not abort or unhook the running one
            raise ValueError(f"request id {rid!r} is already running")
        # a long text takes seconds to tokenize: off the event loop, which serves other requests
        ids = await asyncio.to_thread(self.core.encode, prompt) if isinstance(prompt, str) else list(prompt)
        if rid in self._streams:  # again: another request may have taken the id meanwhile
            raise ValueError(f"request id {rid!r} is already running")
        out_q: asyncio.Queue = asyncio.Queue()
        self._streams[rid] = (asyncio.get_running_loop(), out_q)
        done: asyncio.Future = asyncio.get_running_loop().create_future()
        self._commands.put(("add", rid, ids, params, retention_key, done))
        self._wakeup.set()
        remaining = params.n
        try:
            await done  # raises the engine's ValueError for an invalid request
            while remaining:
                item = await out_q.get()
                if item is _DONE:
                    raise RuntimeError(f"engine stopped: {self.error!r}")
                if isinstance(item, _Failed):
                    remaining = 0  # already ended in the engine
                    raise GenerationError(f"generation failed: {item.error!r}") from item.error
                if item.finish_reason is not None:
                    remaining -= 1
                if item.finish_reason == "error":  # this sample failed alone; its siblings are aborted
                    raise GenerationError(f"generation failed (sample {item.index}): {item.error}")
                yield item
        finally:
            self._streams.pop(rid, None)
            if remaining:
                self._commands.put(("abort", rid))
                self._wakeup.set()

    async def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))
        self._wakeup.set()

    def stats(self) -> dict:
        return dict(self._stats)

    # ---- the engine thread ------------------------------------------------------------------
    def _deliver(self, outputs: list[StepOutput]) -> None:
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is not None:
                loop, q = stream
                loop.call_soon_threadsafe(q.put_nowait, out)

    def _fail(self, request_id: str, error: Exception) -> None:
        stream = self._streams.get(request_id)
        if stream is not None:
            loop, q = stream
            loop.call_soon_threadsafe(q.put_nowait, _Failed(error))

    def _run_commands(self) -> None:
        while True:
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return
            if cmd[0] == "add":
                _, rid, ids, params, key, done = cmd
                loop = self._streams[rid][0] if rid in self._streams else None
                try:
                    self.core.add_request(rid, ids, params, key)
                    err = None
                except ValueError as e:
                    err = e
                if loop is not None:
                    loop.call_soon_threadsafe(_settle, done, err)
            elif cmd[0] == "abort":
                outputs = self.core.abort(cmd[1])
                self._stats = self.core.stats()
                self._deliver(outputs)

    def _loop(self) -> None:
        try:
            while not self._stopping:
                self._run_commands()
                if self.core.has_unfinished():
                    try:
                        outputs = self.core.step()
                    except Exception as e:  # a step failed as a whole: its requests end, not the server
                        log.exception("engine step failed; the requests in it are ended")
                        self._deliver(self.core.take_failed())
                        for rid in self.core.abort_step():
                            self._fail(rid, e)
                        self._stats = self.core.stats()
                        continue
                    self._stats = self.core.stats()  # before delivering: a finished stream sees freed blocks
                    self._deliver(outputs)
                    if self._trim is not None:
                        self._trim.maybe()
                    if not outputs and not self.core.scheduler.running:
                        self._wakeup.wait(timeout=0.002)  # only requests whose grammar still compiles
                        self._wakeup.clear()
                else:
                    self._stats = self.core.stats()
                    self._wakeup.wait(timeout=0.5)
                    self._wakeup.clear()
        except BaseException as e:  # the engine is dead: tell every waiting stream
            log.exception("engine step loop failed")
            self.error = e
            for loop, q in list(self._streams.values()):
                loop.call_soon_threadsafe(q.put_nowait, _DONE)


def _settle(fut: asyncio.Future, err: BaseException | None) -> None:
    if fut.done():
        return
    if err is None:
        fut.set_result(None)
    else:
        fut.set_exception(err)
