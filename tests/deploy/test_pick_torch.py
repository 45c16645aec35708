"""deploy/pick_torch.py (issue 48): set-up installs the CPU torch without an NVIDIA GPU, the CUDA
torch with one, and a wheel pip already has on disk when it fits; it says which.

The decision is tested on faked machines; the detection on faked `nvidia-smi` and pip sources; and
pip's own resolver (a --dry-run report) shows what each command would install on this machine."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "pick_torch.py"
V = "2.13.0"

_spec = importlib.util.spec_from_file_location("pick_torch", SCRIPT)
assert _spec is not None and _spec.loader is not None
pick = importlib.util.module_from_spec(_spec)
sys.modules["pick_torch"] = pick  # dataclasses look their module up by name
_spec.loader.exec_module(pick)

CPU_WHEEL = pick.LocalWheel(f"{V}+cpu", "/wheels")
CUDA_WHEEL = pick.LocalWheel(f"{V}+cu130", "/wheels")


def never_asked() -> bool:
    raise AssertionError("the CPU index must not be probed when the answer is already known")


def test_no_gpu_with_a_local_cpu_wheel_installs_it_without_any_index():
    choice = pick.choose(V, pick.Machine("Linux", None, (CPU_WHEEL,)), "", never_asked)
    assert (choice.build, choice.requirement, choice.pip_args) == ("cpu", f"torch=={V}+cpu", [])
    assert "local CPU wheel in /wheels" in choice.reason


def test_no_gpu_and_no_local_wheel_takes_the_cpu_index():
    choice = pick.choose(V, pick.Machine("Linux", None, (CUDA_WHEEL,)), "", lambda: True)
    assert choice.build == "cpu" and choice.requirement == f"torch=={V}+cpu"
    assert choice.pip_args == ["--extra-index-url", "https://download.pytorch.org/whl/cpu"]
    command = choice.command("py")
    assert command == ["py", "-m", "pip", "install", f"torch=={V}+cpu", *choice.pip_args]


def test_no_gpu_no_local_wheel_and_no_cpu_index_stops_with_one_line():
    with pytest.raises(pick.PickError) as info:
        pick.choose(V, pick.Machine("Linux", None, ()), "", lambda: False)
    text = str(info.value)
    assert "\n" not in text and "cannot be reached" in text and "CHATLOOM_TORCH=cuda" in text


@pytest.mark.parametrize("system", ["Darwin", "Windows"])
def test_pypi_is_the_cpu_build_off_linux(system):
    choice = pick.choose(V, pick.Machine(system, None, ()), "", never_asked)
    assert (choice.build, choice.requirement, choice.pip_args) == ("cpu", f"torch=={V}", [])


def test_a_gpu_takes_pypis_cuda_build_even_beside_a_local_cpu_wheel():
    gpu = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)"
    choice = pick.choose(V, pick.Machine("Linux", gpu, (CPU_WHEEL,)), "", never_asked)
    # ===: the exact version without a local label, so pip cannot settle for 2.13.0+cpu
    assert (choice.build, choice.requirement, choice.pip_args) == ("cuda", f"torch==={V}", [])
    assert "NVIDIA H100" in choice.reason


def test_a_gpu_with_a_local_cuda_wheel_installs_it():
    choice = pick.choose(V, pick.Machine("Linux", "GPU 0: X", (CPU_WHEEL, CUDA_WHEEL)), "", never_asked)
    assert (choice.build, choice.requirement) == ("cuda", f"torch=={V}+cu130")


def test_a_local_wheel_of_another_version_is_not_taken():
    other = pick.LocalWheel("2.14.1+cpu", "/wheels")
    choice = pick.choose(V, pick.Machine("Linux", None, (other,)), "", lambda: True)
    assert choice.pip_args == ["--extra-index-url", "https://download.pytorch.org/whl/cpu"]


def test_an_installed_build_of_the_version_is_kept_without_any_index():
    # a GPU machine whose torch is PyPI's CUDA build (no label): nothing to fetch, even offline
    gpu = pick.Machine("Linux", "GPU 0: X", (CPU_WHEEL,), installed=V)
    assert pick.choose(V, gpu, "", never_asked).requirement == f"torch=={V}"
    cpu = pick.Machine("Linux", None, (), installed=f"{V}+cpu")
    choice = pick.choose(V, cpu, "", never_asked)
    assert (choice.requirement, choice.pip_args) == (
        f"torch=={V}+cpu",
        [],
    ) and "is installed" in choice.reason
    # the wrong build, or another version, is replaced
    wrong = pick.Machine("Linux", "GPU 0: X", (), installed=f"{V}+cpu")
    assert pick.choose(V, wrong, "", never_asked).requirement == f"torch==={V}"
    older = pick.Machine("Linux", None, (CPU_WHEEL,), installed="2.11.0+cpu")
    assert pick.choose(V, older, "", never_asked).reason.endswith("the local CPU wheel in /wheels")


def test_the_override():
    machine = pick.Machine("Linux", "GPU 0: X", (CPU_WHEEL,))
    assert pick.choose(V, machine, "cpu", never_asked).requirement == f"torch=={V}+cpu"
    keep = pick.choose(V, machine, "keep", never_asked)
    assert keep.build == "keep" and keep.command("py") == []
    with pytest.raises(pick.PickError, match="cpu, cuda or keep"):
        pick.choose(V, machine, "rocm", never_asked)


def _tags() -> tuple[str, str]:
    python = f"cp{sys.version_info.major}{sys.version_info.minor}"
    plat = {"Linux": "manylinux_2_28", "Darwin": "macosx_11_0", "Windows": "win"}[platform.system()]
    return python, f"{plat}_{platform.machine().lower()}"


def test_local_wheels_in_find_links_folders_and_file_indexes(tmp_path):
    python, plat = _tags()
    links = tmp_path / "links"
    links.mkdir()
    (links / f"torch-{V}+cpu-{python}-{python}-{plat}.whl").write_bytes(b"")
    (links / f"torch-{V}+cpu-cp27-cp27m-{plat}.whl").write_bytes(b"")  # another interpreter's
    (links / "numpy-2.0.0-py3-none-any.whl").write_bytes(b"")
    index = tmp_path / "simple" / "torch"
    index.mkdir(parents=True)
    name = f"torch-{V}+cu130-{python}-{python}-{plat}.whl"
    (index / "index.html").write_text(
        f'<html><body><a href="../../files/{name}#sha256=0">{name}</a></body></html>'
    )
    found = pick.local_wheels([str(links), (tmp_path / "simple").as_uri(), "https://pypi.org/simple"])
    assert sorted(w.version for w in found) == [f"{V}+cpu", f"{V}+cu130"]


def _script(
    tmp_path: Path, gpu: bool, pip_config: str | None = None, *args: str
) -> subprocess.CompletedProcess:
    """pick_torch.py --dry-run with a faked `nvidia-smi` (or none) first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    if gpu:
        smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n")
        smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "CHATLOOM_TORCH"}
    # without nvidia-smi: a PATH holding only this interpreter's folder and the fake bin
    env["PATH"] = f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}"
    if pip_config is not None:
        env["PIP_CONFIG_FILE"] = pip_config
    return subprocess.run(
        # -S: without site-packages the script sees no installed torch (it needs only the stdlib)
        [sys.executable, "-S", str(SCRIPT), "--version", V, "--dry-run", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_script_with_a_gpu_says_cuda(tmp_path):
    out = _script(tmp_path, gpu=True)
    assert out.returncode == 0, out.stderr
    assert "torch: cuda build (NVIDIA GPU: GPU 0: NVIDIA H100" in out.stdout
    assert f"pip install torch==={V}" in out.stdout or f"pip install torch=={V}+cu" in out.stdout


def test_script_without_a_gpu_and_a_local_wheel_says_cpu(tmp_path):
    python, plat = _tags()
    links = tmp_path / "links"
    links.mkdir()
    (links / f"torch-{V}+cpu-{python}-{python}-{plat}.whl").write_bytes(b"")
    config = tmp_path / "pip.conf"
    config.write_text(f"[global]\nfind-links = {links}\n")
    out = _script(tmp_path, gpu=False, pip_config=str(config))
    assert out.returncode == 0, out.stderr
    assert f"torch: cpu build (no NVIDIA GPU; the local CPU wheel in {links})" in out.stdout
    assert out.stdout.strip().endswith(f"pip install torch=={V}+cpu")


def test_script_without_a_gpu_or_a_local_wheel(tmp_path):
    # no pip configuration at all: the CPU index where it answers, one line where it does not
    out = _script(tmp_path, gpu=False, pip_config=os.devnull)
    if out.returncode == 0:
        assert f"torch=={V}+cpu --extra-index-url https://download.pytorch.org/whl/cpu" in out.stdout
    else:
        assert out.returncode == 1 and out.stdout == ""
        assert out.stderr.count("\n") == 1 and "cannot be reached" in out.stderr


def _dry_run_report(tmp_path: Path, command: list[str]) -> list[str]:
    report = tmp_path / "report.json"
    out = subprocess.run(
        [*command, "--dry-run", "--ignore-installed", "--quiet", "--report", str(report)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if out.returncode != 0:
        pytest.skip(f"pip cannot resolve here: {out.stderr.strip().splitlines()[-1:]}")
    return [item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]]


def _this_machine(gpu: str | None) -> object:
    wheels = pick.local_wheels(pick.pip_sources(sys.executable))
    try:
        return pick.choose(
            V,
            pick.Machine(platform.system(), gpu, tuple(wheels)),
            "",
            lambda: pick.reachable(pick.CPU_INDEX + "/torch/"),
        )
    except pick.PickError as exc:
        pytest.skip(str(exc))


def test_pip_resolves_the_cpu_choice_without_nvidia_wheels(tmp_path):
    choice = _this_machine(gpu=None)
    names = _dry_run_report(tmp_path, choice.command(sys.executable))
    assert "torch" in names
    assert [n for n in names if n.startswith(("nvidia", "cuda"))] == []


@pytest.mark.slow
@pytest.mark.heavy  # resolves the CUDA build's ~20 wheels against PyPI
def test_pip_resolves_the_cuda_choice_with_nvidia_wheels(tmp_path):
    # the contrast: what the old `pip install torch==2.13.0` gives where pip has no local CPU wheel
    choice = _this_machine(gpu="GPU 0: faked")
    names = _dry_run_report(tmp_path, choice.command(sys.executable))
    assert "torch" in names and any(n.startswith("nvidia") for n in names)
