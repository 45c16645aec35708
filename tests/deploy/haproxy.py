"""HAProxy for the deployment tests: deploy/haproxy.cfg.template rendered for replicas on
127.0.0.1, checked with `haproxy -c`, run in the foreground (-db) and stopped by its owner."""

from __future__ import annotations

import contextlib
import importlib.util
import subprocess
import time
from pathlib import Path

import httpx

from soak.server import free_port

ROOT = Path(__file__).resolve().parents[2]


def load_renderer():
    """deploy/render_haproxy.py as a module (deploy/ is not a package)."""
    spec = importlib.util.spec_from_file_location("render_haproxy", ROOT / "deploy" / "render_haproxy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class HAProxy:
    def __init__(self, workdir: Path, replicas: dict[str, str]) -> None:
        self.port, self.stats_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = workdir / "haproxy.cfg"
        self.config.write_text(
            load_renderer().render(
                [f"{name}={address}" for name, address in replicas.items()],
                bind=f"127.0.0.1:{self.port}",
                stats=f"127.0.0.1:{self.stats_port}",
            )
        )
        self.log_path = workdir / "haproxy.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> HAProxy:
        check = subprocess.run(["haproxy", "-c", "-f", str(self.config)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
        with open(self.log_path, "ab") as log:
            # -db: stay in the foreground, so that this test owns the process
            self.proc = subprocess.Popen(
                ["haproxy", "-db", "-f", str(self.config)], stdout=log, stderr=subprocess.STDOUT
            )
        return self

    def stats(self) -> dict[tuple[str, str], dict[str, str]]:
        """(proxy, server or BACKEND) -> its row of HAProxy's stats CSV."""
        text = httpx.get(f"http://127.0.0.1:{self.stats_port}/stats;csv", timeout=5).text
        lines = text.lstrip("# ").splitlines()
        header = lines[0].split(",")
        rows = [dict(zip(header, line.split(","), strict=False)) for line in lines[1:] if line]
        return {(r["pxname"], r["svname"]): r for r in rows}

    def wait_status(self, want: dict[str, str], timeout: float = 60.0) -> None:
        """Until each named replica's state in by_session starts with want[name] (UP, DOWN)."""
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(httpx.HTTPError):
                rows = self.stats()
                if all(rows[("by_session", n)]["status"].startswith(s) for n, s in want.items()):
                    return
            if time.monotonic() > deadline:
                raise AssertionError(f"HAProxy did not see {want} in {timeout:.0f} s")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
