"""Install the torch build this machine needs, and say which: `make install` runs it before chatloom.

PyPI's torch for Linux is the CUDA build: it pulls CUDA and about 20 nvidia-* wheels (several GB),
useless without an NVIDIA GPU. So:

- no NVIDIA GPU (`nvidia-smi -L` lists none): the CPU build. A CPU wheel pip already has on this
  machine (a --find-links folder or a file:// index of its configuration) is taken as it is;
  otherwise PyTorch's CPU index (https://download.pytorch.org/whl/cpu) on Linux, and PyPI on macOS
  and Windows, whose wheels are CPU builds. When that index cannot be reached and no local wheel
  exists, it stops with one line rather than fall back to the CUDA build.
- an NVIDIA GPU: the CUDA build, a local one where pip has it, else PyPI's, asked for as
  `torch===VERSION`: the exact version without a local label, since `torch==2.13.0` is also met by
  a local 2.13.0+cpu wheel, which pip prefers (it sorts above 2.13.0).

A torch of that version and build already installed is kept as it is (no index needed, so a
GPU machine without network keeps its CUDA build). CHATLOOM_TORCH=cpu | cuda | keep overrides the
GPU check (keep: install nothing, e.g. for a ROCm build installed by hand). Stdlib only: it runs
before anything else is installed.

    python deploy/pick_torch.py [--version 2.13.0] [--dry-run]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl: version, python tag, abi tag, platform tag
_WHEEL = re.compile(r"^torch-([^-]+)-([^-]+)-([^-]+)-([^-]+)\.whl$")


@dataclass(frozen=True)
class LocalWheel:
    version: str  # with its local label: "2.13.0+cpu"
    where: str  # the folder or index that holds it

    @property
    def label(self) -> str:
        return self.version.partition("+")[2]


@dataclass(frozen=True)
class Machine:
    system: str  # platform.system(): Linux, Darwin, Windows
    gpu: str | None  # the first GPU `nvidia-smi -L` lists, None without one
    local: tuple[LocalWheel, ...] = ()  # torch wheels pip's configuration already holds on disk
    installed: str | None = None  # the torch version this interpreter already has ("2.13.0+cpu")


@dataclass
class Choice:
    build: str  # "cpu" | "cuda" | "keep"
    requirement: str | None  # what pip installs ("torch==2.13.0+cpu"); None: nothing
    pip_args: list[str] = field(default_factory=list)  # after the requirement
    reason: str = ""

    def command(self, python: str) -> list[str]:
        if self.requirement is None:
            return []
        return [python, "-m", "pip", "install", self.requirement, *self.pip_args]


class PickError(Exception):
    """No build can be installed as asked: the message is the one line printed."""


def choose(
    version: str, machine: Machine, override: str = "", cpu_index_reachable: Callable[[], bool] = lambda: True
) -> Choice:
    """The build and install command for `machine`; cpu_index_reachable is asked only when needed."""
    build = override.strip().lower() or ("cuda" if machine.gpu else "cpu")
    if build == "keep":
        return Choice("keep", None, reason="CHATLOOM_TORCH=keep: torch is left as it is")
    if build not in ("cpu", "cuda"):
        raise PickError(f"CHATLOOM_TORCH must be cpu, cuda or keep, got {override!r}")
    why = (
        "CHATLOOM_TORCH=" + build
        if override.strip()
        else (f"NVIDIA GPU: {machine.gpu}" if machine.gpu else "no NVIDIA GPU")
    )
    # this build of this version already installed: pinned as it is, so pip needs no index at all
    # (a GPU machine without network keeps its CUDA build)
    if machine.installed is not None and machine.installed.partition("+")[0] == version:
        label = machine.installed.partition("+")[2]
        if _is_build(label, build, machine.system):
            return Choice(
                build, f"torch=={machine.installed}", reason=f"{why}; torch {machine.installed} is installed"
            )
    same = [w for w in machine.local if w.version.partition("+")[0] == version]
    if build == "cpu":
        local = [w for w in same if _is_build(w.label, "cpu", "Linux")]
        if local:
            return Choice(
                "cpu", f"torch=={local[0].version}", reason=f"{why}; the local CPU wheel in {local[0].where}"
            )
        if machine.system != "Linux":
            return Choice(
                "cpu", f"torch=={version}", reason=f"{why}; PyPI's {machine.system} wheel is a CPU build"
            )
        if not cpu_index_reachable():
            raise PickError(
                f"{why}, pip has no local CPU wheel of torch {version}, and {CPU_INDEX} cannot be reached: "
                f"put torch-{version}+cpu-*.whl in a pip --find-links folder, or set CHATLOOM_TORCH=cuda "
                "to take PyPI's CUDA build (several GB)"
            )
        # the +cpu label pins the CPU build whatever else pip's indexes hold; its dependencies (sympy,
        # networkx...) still come from the usual index
        return Choice(
            "cpu",
            f"torch=={version}+cpu",
            ["--extra-index-url", CPU_INDEX],
            reason=f"{why}; the CPU build from {CPU_INDEX}",
        )
    # a CUDA build: a local label cuNNN, or none (the PyPI Linux wheel, which is the CUDA build)
    local = [w for w in same if _is_build(w.label, "cuda", machine.system)]
    if local:
        return Choice(
            "cuda", f"torch=={local[0].version}", reason=f"{why}; the local CUDA wheel in {local[0].where}"
        )
    # ===: exactly this version, no local label (a local +cpu wheel would otherwise win)
    return Choice(
        "cuda",
        f"torch==={version}",
        reason=f"{why}; PyPI's CUDA build (CUDA and its nvidia-* wheels, several GB)",
    )


def _is_build(label: str, build: str, system: str) -> bool:
    """Whether a wheel's local label (the part after "+") is `build`. Without a label, PyPI's wheel:
    the CUDA build on Linux, the CPU build elsewhere."""
    if build == "cpu":
        return label == "cpu" or (label == "" and system != "Linux")
    return label.startswith("cu") or (label == "" and system == "Linux")


def installed_torch() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return None


def nvidia_gpu() -> str | None:
    """The first GPU nvidia-smi lists, None without nvidia-smi or a GPU."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    gpus = [line.strip() for line in out.stdout.splitlines() if line.startswith("GPU ")]
    return gpus[0] if out.returncode == 0 and gpus else None


def pip_sources(python: str) -> list[str]:
    """pip's find-links and index URLs, from its configuration files and PIP_* variables."""
    values: list[str] = []
    try:
        out = subprocess.run(
            [python, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60
        )
        lines = out.stdout.splitlines()
    except (OSError, subprocess.TimeoutExpired):
        lines = []
    for line in lines:
        key, _, value = line.partition("=")
        if key.rpartition(".")[2] in ("find-links", "index-url", "extra-index-url"):
            values += value.strip().strip("'\"").split()
    for name in ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
        values += os.environ.get(name, "").split()
    return list(dict.fromkeys(values))


def _local_folder(source: str) -> Path | None:
    if source.startswith("file:"):
        return Path(unquote(urlparse(source).path))
    if "://" in source:
        return None  # a remote index: not "already on this machine"
    return Path(source).expanduser()


def _fits(python_tag: str, platform_tag: str) -> bool:
    """Whether a wheel's tags fit this interpreter and machine (enough to tell torch wheels apart)."""
    here = f"cp{sys.version_info.major}{sys.version_info.minor}"
    system = {"Linux": "linux", "Darwin": "macosx", "Windows": "win"}.get(platform.system(), "?")
    arch = platform.machine().lower().replace("amd64", "x86_64").replace("arm64", "aarch64")
    plat = platform_tag.lower().replace("arm64", "aarch64").replace("amd64", "x86_64")
    return here in python_tag.split(".") and system in plat and (arch in plat or "universal" in plat)


def local_wheels(sources: Iterable[str]) -> list[LocalWheel]:
    """torch wheels for this interpreter in local folders and file:// simple indexes."""
    found = []
    for source in sources:
        folder = _local_folder(source)
        if folder is None or not folder.is_dir():
            continue
        names = [p.name for p in folder.glob("torch-*.whl")]
        index = folder / "torch" / "index.html"  # a PEP 503 simple index on disk
        if index.is_file():
            names += re.findall(r">\s*(torch-[^<\s]+\.whl)\s*<", index.read_text(errors="replace"))
        for name in names:
            m = _WHEEL.match(name)
            if m and _fits(m.group(2), m.group(4)):
                found.append(LocalWheel(m.group(1), str(folder)))
    return found


def reachable(url: str, timeout: float = 10.0) -> bool:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout):
            return True
    except Exception:  # DNS, refused, TLS, HTTP errors: not usable either way
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default="2.13.0", help="the torch release (default 2.13.0)")
    parser.add_argument(
        "--dry-run", action="store_true", help="print the choice and command; install nothing"
    )
    args = parser.parse_args(argv)
    python = sys.executable
    machine = Machine(
        platform.system(), nvidia_gpu(), tuple(local_wheels(pip_sources(python))), installed_torch()
    )
    try:
        choice = choose(
            args.version,
            machine,
            os.environ.get("CHATLOOM_TORCH", ""),
            lambda: reachable(CPU_INDEX + "/torch/"),
        )
    except PickError as exc:
        print(f"torch: {exc}", file=sys.stderr)
        return 1
    command = choice.command(python)
    print(f"torch: {choice.build} build ({choice.reason})", flush=True)
    if command:
        print(f"torch: {' '.join(command)}", flush=True)
    if args.dry_run or not command:
        return 0
    return subprocess.run([*command, "-q"]).returncode


if __name__ == "__main__":
    sys.exit(main())
