"""A chatloom server in a subprocess on 127.0.0.1 for the hostile suite and the soak: started with
its own database and the tiny random checkpoint (or a given model), watched by a thread that
kills it (SIGKILL) if its resident memory passes a limit, and always stopped on exit."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
API_KEY = "hostile-suite-key"
RSS_LIMIT = 2 << 30  # 2 GiB


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_checkpoint(folder: Path) -> Path:
    """The tiny random Qwen3 checkpoint with the real tokenizer, built once into folder."""
    from models.tiny import build_checkpoint

    if (folder / "config.json").exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    return Path(build_checkpoint(folder, "qwen3"))


def _rss(pid: int) -> int:
    """Memory of pid and its children (a grammar worker process counts too): their proportional set
    sizes, so pages a forked child shares with the server are counted once."""
    import psutil

    def own(p) -> int:
        try:
            return p.memory_full_info().pss
        except (psutil.AccessDenied, AttributeError):
            return p.memory_info().rss

    try:
        proc = psutil.Process(pid)
        total = own(proc)
        for child in proc.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                total += own(child)
        return total
    except psutil.Error:
        return 0


class Server:
    def __init__(
        self,
        model: Path | None,
        workdir: Path,
        database_url: str | None = None,
        env: dict[str, str] | None = None,
        rss_limit: int = RSS_LIMIT,
        log_name: str = "server.log",
    ) -> None:
        self.model = model
        self.workdir = workdir
        self.database_url = database_url or f"sqlite:///{workdir / 'chatloom.db'}"
        self.extra_env = env or {}
        self.rss_limit = rss_limit
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / log_name
        self.proc: subprocess.Popen | None = None
        self.peak_rss = 0
        self.start_rss = 0  # once healthy: the loaded model, before any request
        self.killed_for_memory = False
        self._watch: threading.Thread | None = None
        self._stop_watch = threading.Event()

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {API_KEY}"}

    def start(self, ready_timeout: float = 300.0) -> Server:
        env = dict(os.environ)
        env.update(
            CHATLOOM_API_KEY=API_KEY,
            CHATLOOM_PORT=str(self.port),
            CHATLOOM_HOST="127.0.0.1",
            CHATLOOM_DEVICE="cpu",
            CHATLOOM_DATABASE_URL=self.database_url,
            CHATLOOM_LOG_LEVEL="warning",
            TOKENIZERS_PARALLELISM="false",
            PYTHONUNBUFFERED="1",
        )
        if self.model is not None:
            env["CHATLOOM_MODEL"] = str(self.model)
        env.update(self.extra_env)
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child writes to it until it exits
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self._stop_watch.clear()
        self._watch = threading.Thread(target=self._watch_memory, daemon=True)
        self._watch.start()
        deadline = time.monotonic() + ready_timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}; see {self.log_path}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    self.start_rss = _rss(self.proc.pid)
                    return self
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server did not become healthy; see {self.log_path}")
            time.sleep(0.1)

    def _watch_memory(self) -> None:
        proc = self.proc
        while proc is not None and proc.poll() is None and not self._stop_watch.is_set():
            rss = _rss(proc.pid)
            self.peak_rss = max(self.peak_rss, rss)
            if rss > self.rss_limit:
                self.killed_for_memory = True
                self.kill()
                return
            time.sleep(0.2)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """kill -9 (the server and anything it started)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        self._stop_watch.set()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
