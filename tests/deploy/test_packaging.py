"""The wheel (issue 48): one top-level name, `chatloom`, so an installed chatloom does not shadow
other distributions' `app`, `engine`, `kernels` or `grammar`, and in its own process its packages
win over theirs (chatloom/__init__.py, docs/packaging.md)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("app", "engine", "runner", "models", "kernels", "grammar", "migrations", "bench")


def test_the_dockerfile_copies_what_the_build_needs():
    text = (ROOT / "Dockerfile").read_text()
    assert "COPY pyproject.toml setup.py " in text and "COPY chatloom ./chatloom" in text


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # the checkout's files (tracked, and new ones git does not ignore) copied out: a build in the
    # checkout would leave build/, whose stale copies of deleted modules later wheels would carry
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    src = tmp_path_factory.mktemp("src")
    for name in listed:
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("wheel")
    # this environment's setuptools: nothing downloaded
    pip_wheel = ["pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(src)]
    subprocess.run(
        [sys.executable, "-m", *pip_wheel],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (found,) = out.glob("chatloom-*.whl")
    return found


@pytest.mark.slow  # builds the wheel (about 15 s)
def test_the_wheel_has_one_top_level_name(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        entry_points = next(z.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert {n.split("/")[0] for n in names if ".dist-info/" not in n} == {"chatloom"}
    for folder in FOLDERS:
        assert f"chatloom/{folder}/__init__.py" in names
    # what the folders carry beside code comes along (the chat template, the web page, migrations)
    assert "chatloom/app/chat/fallback_template.jinja" in names
    assert "chatloom/app/static/index.html" in names
    assert any(n.startswith("chatloom/migrations/versions/0001") for n in names)
    assert "chatloom = chatloom:main" in entry_points


def _run(target: Path, cwd: Path, code: str) -> subprocess.CompletedProcess:
    """Python without site processing: the installed wheel and this environment's dependencies on
    the path, but not the checkout (no editable finder, no working directory of the repository)."""
    paths = [str(cwd / "others"), str(target), sysconfig.get_paths()["purelib"]]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    return subprocess.run(
        [sys.executable, "-S", "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_installed_it_neither_shadows_nor_is_shadowed(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    # another distribution's `kernels` (Hugging Face's, say) earlier on the path
    other = tmp_path / "others" / "kernels"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text('OWNER = "another distribution"\n')
    out = _run(
        target,
        tmp_path,
        "import importlib.util, kernels\n"
        "print(kernels.OWNER)\n"
        "print([importlib.util.find_spec(n) for n in ('app', 'engine', 'grammar', 'migrations', 'bench')])\n",
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["another distribution", "[None, None, None, None, None]"]
    # chatloom's own process: its packages, found inside the installed chatloom
    out = _run(
        target,
        tmp_path,
        "import chatloom, app, engine, kernels, grammar\n"
        "import kernels.dispatch, app.memory.db\n"
        "print(kernels.__file__)\n"
        "print(app.memory.db.MIGRATIONS_DIR.is_dir())\n",
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [str(target / "chatloom" / "kernels" / "__init__.py"), "True"]
    version = _run(
        target,
        tmp_path,
        "import sys; from chatloom import main; sys.argv = ['chatloom', '--version']; main()",
    )
    assert version.returncode == 0 and version.stdout.startswith("chatloom "), version.stderr
