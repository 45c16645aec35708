"""Settings from the environment and flags, the CLI, and /health before a model is loaded."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from app.cli import build_parser, main, settings_from_args
from app.main import create_app
from app.settings import Settings


def test_settings_from_environment(monkeypatch):
    monkeypatch.setenv("CHATLOOM_API_KEY", "k1")
    monkeypatch.setenv("CHATLOOM_PORT", "9001")
    monkeypatch.setenv("CHATLOOM_CORS_ORIGINS", "http://a.test, http://b.test")
    s = Settings()
    assert s.api_key.get_secret_value() == "k1" and s.port == 9001
    assert s.cors_origins == ["http://a.test", "http://b.test"]
    assert "k1" not in repr(s)
    # the data folder's store (tests/app/test_first_run.py)
    assert s.database_url.endswith("/chatloom.db") and s.n8n_history_table == "n8n_chat_histories"


def test_flags_override_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("CHATLOOM_PORT", "9001")
    (tmp_path / "key").write_text("k\n")
    argv = ["serve", "--port", "9002", "--api-key-file", str(tmp_path / "key"), "--model", "/m/qwen"]
    s = settings_from_args(build_parser().parse_args(argv))
    assert s.port == 9002 and s.api_key.get_secret_value() == "k" and s.model_name() == "qwen"


def test_production_refuses_unsafe_defaults():
    with pytest.raises(ValidationError, match="CHATLOOM_API_KEY"):
        Settings(environment="production")
    with pytest.raises(ValidationError, match="CORS"):
        Settings(environment="production", api_key="k", cors_origins=["*"])
    Settings(environment="production", api_key="k")


@pytest.mark.parametrize("argv", [["--help"], ["serve", "--help"], ["chat", "--help"]])
def test_help(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 0
    assert "usage: chatloom" in capsys.readouterr().out


def test_console_script_help():
    out = subprocess.run([sys.executable, "-m", "app.cli", "serve", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--api-key" in out.stdout and "--model" in out.stdout


def test_bench_delegates_to_the_bench_package(monkeypatch):
    import bench.workloads

    seen = []
    monkeypatch.setattr(bench.workloads, "main", lambda argv: seen.append(argv) or {"tok_s": 1.0})
    assert main(["bench", "c1", "--quick"]) == 0
    assert seen == [["c1", "--quick"]]


def test_health_is_503_until_loaded_and_reports_a_failed_load(tmp_path):
    settings = Settings(model=str(tmp_path / "missing"), database_url=f"sqlite:///{tmp_path}/c.db")
    with TestClient(create_app(settings)) as client:
        deadline = time.monotonic() + 30
        body = client.get("/health").json()
        while body.get("status") == "loading" and time.monotonic() < deadline:
            time.sleep(0.05)
            body = client.get("/health").json()
        r = client.get("/health")
        assert r.status_code == 503 and r.json()["status"] == "error"
        err = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
        assert err.status_code == 503 and err.json()["error"]["code"] == "model_not_ready"


def test_cors_for_configured_origins(fake_engine, tmp_path):
    settings = Settings(cors_origins=["http://n8n.test"], database_url=f"sqlite:///{tmp_path}/c.db")
    with TestClient(create_app(settings, engine=fake_engine)) as client:
        r = client.options(
            "/v1/chat/completions",
            headers={"Origin": "http://n8n.test", "Access-Control-Request-Method": "POST"},
        )
        assert r.headers["access-control-allow-origin"] == "http://n8n.test"


def test_chat_command_talks_to_the_engine(tiny_qwen3):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "app.cli",
            "chat",
            "--model",
            str(tiny_qwen3),
            "--device",
            "cpu",
            "--max-tokens",
            "3",
        ],
        input="hello\n/reset\nagain\n\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("assistant> ") == 2
