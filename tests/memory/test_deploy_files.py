"""docker-compose.yml, the Dockerfile and the example n8n workflows are well formed and agree with
each other (no Docker engine runs here: `docker compose config` is replaced by these checks)."""

from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess

import pytest
import yaml

from app.agent.config import AssistantIn
from app.agent.targets import TargetPolicy
from app.settings import Settings
from tests.memory.conftest import ROOT


def test_compose_file():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    # the services `docker compose up` starts; profiles (deploy/: `replicas`) add more on request
    assert {name for name, svc in services.items() if "profiles" not in svc} == {
        "chatloom",
        "postgres",
        "n8n",
    }
    env = services["chatloom"]["environment"]
    assert env["CHATLOOM_DATABASE_URL"].startswith("postgresql://")
    # n8n reaches chatloom by its service name, and the seeded tools reach n8n on a private address
    assert "chatloom" in env["CHATLOOM_ALLOWED_HOSTS"].split(",")
    policy = TargetPolicy.from_settings(
        Settings(
            webhook_allowed_hosts=env["CHATLOOM_WEBHOOK_ALLOWED_HOSTS"],
            webhook_allowed_networks=env["CHATLOOM_WEBHOOK_ALLOWED_NETWORKS"],
        )
    )
    seeded = yaml.safe_load((ROOT / "examples" / "assistants.yaml").read_text())["assistants"]
    for item in seeded:
        for tool in item.get("tools", []):
            assert policy.refusal_for_url(tool["webhook"]["url"]) is None, tool["webhook"]["url"]
    assert policy.address_allowed(ipaddress.ip_address("172.18.0.5"))  # a compose network's address
    assert not policy.address_allowed(ipaddress.ip_address("169.254.169.254"))
    assert services["chatloom"]["build"] == "."
    for name, svc in services.items():
        for dep in svc.get("depends_on", {}):
            assert dep in services, f"{name} depends on unknown {dep}"
        for vol in svc.get("volumes", []):
            source = vol.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), source
            else:
                assert source in compose["volumes"], source
    assert "8000:8000" in services["chatloom"]["ports"] and "5678:5678" in services["n8n"]["ports"]


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker client")
def test_docker_compose_config_when_available():
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip("the docker compose plugin is not installed")
    subprocess.run(["docker", "compose", "config", "-q"], cwd=ROOT, check=True, timeout=60)


def test_dockerfile_copies_what_the_package_needs():
    text = (ROOT / "Dockerfile").read_text()
    for folder in ("app", "engine", "runner", "models", "kernels", "grammar", "migrations", "examples"):
        assert f"COPY {folder} ./{folder}" in text


def test_example_workflows():
    flows = {p.name: json.loads(p.read_text()) for p in (ROOT / "examples" / "n8n").glob("*.json")}
    assert set(flows) == {
        "chat-trigger-to-chatloom.json",
        "ai-agent-chatloom-model.json",
        "webhook-tool.json",
    }
    for name, flow in flows.items():
        names = {n["name"] for n in flow["nodes"]}
        for source, outputs in flow["connections"].items():
            assert source in names, (name, source)
            for branch in outputs.values():
                assert all(link["node"] in names for links in branch for link in links), name
    types = {n["type"] for n in flows["ai-agent-chatloom-model.json"]["nodes"]}
    assert {"@n8n/n8n-nodes-langchain.lmChatOpenAi", "@n8n/n8n-nodes-langchain.memoryPostgresChat"} <= types
    hook = flows["webhook-tool.json"]["nodes"][0]["parameters"]["path"]
    seeded = yaml.safe_load((ROOT / "examples" / "assistants.yaml").read_text())["assistants"]
    for item in seeded:
        spec = AssistantIn.model_validate(item)
        assert any(str(t.webhook.url).endswith(f"/webhook/{hook}") for t in spec.tools)
