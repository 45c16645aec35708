"""The package layout (the rest of the metadata is in pyproject.toml): the repository's top-level
folders go into the wheel under the one name `chatloom` (chatloom/__init__.py says why)."""

from setuptools import find_packages, setup

FOLDERS = ("app", "engine", "runner", "models", "kernels", "grammar", "migrations", "bench")

inner = find_packages(include=[pattern for name in FOLDERS for pattern in (name, f"{name}.*")])
setup(
    packages=["chatloom", *(f"chatloom.{name}" for name in inner)],
    package_dir={"chatloom": "chatloom", **{f"chatloom.{name}": name for name in FOLDERS}},
)
