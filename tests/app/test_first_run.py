"""A new user's first runs (issue 48): the per-user data directory, `--version`, a start that
cannot succeed ending at once with one line and a non-zero exit, progress while the model loads,
and no access-log line per /health poll."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from app.serve import QuietPathsFilter, StartupError, bind
from app.settings import Settings


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A fresh HOME without XDG_DATA_HOME, CHATLOOM_DATA_DIR or CHATLOOM_DATABASE_URL."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name in ("XDG_DATA_HOME", "CHATLOOM_DATA_DIR", "CHATLOOM_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "home"


@pytest.mark.skipif(sys.platform != "linux", reason="the XDG folders are Linux's")
def test_the_store_is_in_the_per_user_data_folder(home, monkeypatch, tmp_path):
    assert Settings().database_url == f"sqlite:///{home}/.local/share/chatloom/chatloom.db"
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert Settings().database_url == f"sqlite:///{tmp_path}/xdg/chatloom/chatloom.db"
    monkeypatch.setenv("XDG_DATA_HOME", "relative/ignored")  # the XDG spec: only absolute paths count
    assert Settings().database_url == f"sqlite:///{home}/.local/share/chatloom/chatloom.db"


def test_the_data_folder_and_the_url_can_be_named(home, monkeypatch, tmp_path):
    monkeypatch.setenv("CHATLOOM_DATA_DIR", str(tmp_path / "d"))
    assert Settings().database_url == f"sqlite:///{tmp_path}/d/chatloom.db"
    monkeypatch.chdir(tmp_path)
    # a relative folder is made absolute where the server starts: another working directory later
    # must not find another store
    assert Settings(data_dir="rel").database_url == f"sqlite:///{tmp_path}/rel/chatloom.db"
    monkeypatch.setenv("CHATLOOM_DATABASE_URL", "postgresql://u:p@db/chat")
    assert Settings().database_url == "postgresql://u:p@db/chat"


def test_the_migrations_default_is_the_servers(home, monkeypatch, tmp_path):
    from app.paths import default_database_url

    assert default_database_url() == Settings().database_url
    monkeypatch.setenv("CHATLOOM_DATA_DIR", str(tmp_path / "d"))
    assert default_database_url() == Settings().database_url


def _access_record(path: str) -> logging.LogRecord:
    # uvicorn.access's own message and arguments
    args = ("127.0.0.1:5000", "GET", path, "1.1", 200)
    return logging.LogRecord("uvicorn.access", logging.INFO, "", 0, '%s - "%s %s HTTP/%s" %d', args, None)


def test_health_polls_are_not_logged():
    quiet = QuietPathsFilter()
    assert not quiet.filter(_access_record("/health"))
    assert not quiet.filter(_access_record("/health?probe=1"))
    assert quiet.filter(_access_record("/v1/chat/completions"))
    assert quiet.filter(_access_record("/healthz"))


def test_a_busy_port_is_refused_at_once():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(StartupError) as info:
            bind("127.0.0.1", port)
    assert info.value.code == 1 and info.value.message.startswith(f"cannot listen on 127.0.0.1:{port}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHATLOOM_")}
    env.update(HOME=str(tmp_path / "home"), XDG_DATA_HOME=str(tmp_path / "xdg"), **extra)
    return env


def _chatloom(tmp_path: Path, *argv: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *argv],
        capture_output=True,
        text=True,
        env=_env(tmp_path, **env),
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def _one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def test_version(tmp_path):
    from importlib.metadata import version

    out = _chatloom(tmp_path, "--version")
    assert out.returncode == 0 and out.stdout.strip() == f"chatloom {version('chatloom')}"


def test_production_without_a_key_is_one_line(tmp_path):
    out = _chatloom(tmp_path, "serve", CHATLOOM_ENVIRONMENT="production")
    assert out.returncode == 2
    assert _one_line(out.stderr) == (
        "chatloom serve: CHATLOOM_API_KEY must be set when CHATLOOM_ENVIRONMENT=production"
    )


def test_a_busy_port_exits_before_anything_loads(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        out = _chatloom(tmp_path, "serve", "--port", str(port), "--model", str(tmp_path / "never-read"))
        took = time.monotonic() - started
    assert out.returncode == 1
    line = _one_line(out.stderr)
    assert line.startswith(f"chatloom serve: cannot listen on 127.0.0.1:{port}: already in use")
    assert took < 30  # the interpreter's start and imports; no model, no store, no server


def test_a_model_that_does_not_load_ends_the_server(tmp_path):
    port = _free_port()
    out = _chatloom(tmp_path, "serve", "--port", str(port), "--model", str(tmp_path / "missing"), timeout=180)
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr
    last = out.stderr.strip().splitlines()[-1]
    missing = tmp_path / "missing"
    assert (
        last
        == f"chatloom serve: the model failed to load: ValueError: model folder '{missing}' does not exist"
    )
    assert out.stderr.count("failed to load") == 1
    # the store was the per-user one, and the start said so
    assert f"chatloom: conversations in sqlite:///{tmp_path}/xdg/chatloom/chatloom.db" in out.stderr
    assert (tmp_path / "xdg" / "chatloom" / "chatloom.db").is_file()


def test_cuda_on_a_cpu_only_torch_ends_the_server(tmp_path, tiny_qwen3):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this torch can use CUDA")
    port = _free_port()
    out = _chatloom(
        tmp_path, "serve", "--port", str(port), "--model", str(tiny_qwen3), "--device", "cuda", timeout=180
    )
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("chatloom serve: the model failed to load: ") and "CUDA" in last


def test_chat_with_a_missing_model_is_one_line(tmp_path):
    out = _chatloom(tmp_path, "chat", "--model", "/nonexistent")
    assert out.returncode == 1
    assert _one_line(out.stderr) == (
        "chatloom chat: the model failed to load: ValueError: model folder '/nonexistent' does not exist"
    )


def test_serve_shows_progress_and_keeps_health_polls_out_of_the_log(tmp_path, tiny_qwen3):
    port = _free_port()
    log_path = tmp_path / "serve.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--model", str(tiny_qwen3)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=_env(tmp_path, CHATLOOM_DEVICE="cpu"),
            stdin=subprocess.DEVNULL,
        )
    try:
        deadline = time.monotonic() + 180
        polls = 0
        status = None
        while time.monotonic() < deadline and status != 200:
            try:
                status = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code
                polls += 1
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        assert status == 200, log_path.read_text()
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
    text = log_path.read_text()
    assert code == 0, text
    assert polls >= 1 and "GET /health" not in text
    assert '"GET /v1/models HTTP/1.1" 200' in text  # other requests are still logged
    assert f"loading the model {tiny_qwen3}" in text and "ready after" in text
    assert f"chatloom: http://127.0.0.1:{port}" in text
