"""deploy/: the rendered HAProxy configuration is the template's, valid for Debian's HAProxy, and
agrees with docker-compose.yml's `replicas` profile (no Docker engine runs here)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from tests.deploy.haproxy import ROOT, load_renderer

render = load_renderer().render
COMPOSE_REPLICAS = ["chatloom-1:8000", "chatloom-2:8000"]


def compose_services() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]


def test_the_shipped_config_is_the_template_rendered_for_compose():
    shipped = (ROOT / "deploy" / "haproxy.cfg").read_text()
    assert shipped == render(COMPOSE_REPLICAS, stats="0.0.0.0:8404", docker_dns=True), (
        "deploy/haproxy.cfg differs from its template: python deploy/render_haproxy.py --docker-dns "
        "--stats 0.0.0.0:8404 chatloom-1:8000 chatloom-2:8000 > deploy/haproxy.cfg"
    )


def test_the_replicas_profile():
    services = compose_services()
    profile = {name for name, svc in services.items() if "replicas" in svc.get("profiles", [])}
    assert profile == {"chatloom-1", "chatloom-2", "haproxy"}
    proxy = services["haproxy"]
    assert "./deploy/haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro" in proxy["volumes"]
    assert proxy["image"].startswith("haproxy:")
    shipped = (ROOT / "deploy" / "haproxy.cfg").read_text()
    # HAProxy's servers are the replica services, at the port the image serves on
    servers = set(re.findall(r"^\s+server (\S+) (\S+):8000\b", shipped, re.M))
    assert servers == {("chatloom-1", "chatloom-1"), ("chatloom-2", "chatloom-2")}
    single = services["chatloom"]["environment"]
    for name in ("chatloom-1", "chatloom-2"):
        env = services[name]["environment"]
        assert env["CHATLOOM_DATABASE_URL"] == single["CHATLOOM_DATABASE_URL"]  # one PostgreSQL
        assert "haproxy" in env["CHATLOOM_ALLOWED_HOSTS"].split(",")  # the Host clients call it by
        assert int(env["CHATLOOM_DATABASE_POOL_SIZE"]) >= 1
        assert services[name]["depends_on"]["postgres"]["condition"] == "service_healthy"
    # each replica its own cache volume
    assert services["chatloom-1"]["volumes"] != services["chatloom-2"]["volumes"]


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy is not installed")
def test_haproxy_accepts_the_rendering(tmp_path):
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(
        render(["a=127.0.0.1:18001", "b=127.0.0.1:18002", "127.0.0.1:18003"], bind="127.0.0.1:18000")
    )
    check = subprocess.run(["haproxy", "-c", "-f", str(cfg)], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "Configuration file is valid" in check.stdout + check.stderr


def test_replica_names_and_addresses():
    text = render(["10.0.0.5:8000", "gpu-2.internal:8000", "x=[::1]:8001"])
    assert "server replica1 10.0.0.5:8000\n" in text
    assert "server gpu-2.internal gpu-2.internal:8000\n" in text
    assert "server x [::1]:8001\n" in text
    assert "server x [::1]:8001 track by_session/x\n" in text
    for bad in ("no-port", "host:99999", "a b=h:1", ""):
        with pytest.raises(ValueError, match="replica"):
            render([bad])
    with pytest.raises(ValueError, match="differ"):
        render(["a=h:1", "a=h:2"])
    with pytest.raises(ValueError, match="at least one"):
        render([])


def test_render_cli(tmp_path):
    out = subprocess.run(
        ["python3", str(ROOT / "deploy" / "render_haproxy.py"), "--bind", "127.0.0.1:9", "h:1"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert "bind 127.0.0.1:9\n" in out.stdout and "server h h:1\n" in out.stdout
    bad = subprocess.run(
        ["python3", str(ROOT / "deploy" / "render_haproxy.py"), "nope"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 2 and "[NAME=]HOST:PORT" in bad.stderr
