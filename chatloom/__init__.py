"""The installed chatloom's one top-level name.

The repository keeps the design's folders at its top (app, engine, kernels, grammar, migrations,
bench) and its code imports them by those names. A wheel that installed them as they are would put
six generic top-level packages into site-packages, where they shadow (or are shadowed by) other
distributions of the same name: Hugging Face's `kernels`, any project's `app`. So the wheel holds
them inside this package (chatloom/app, chatloom/engine, ...: setup.py maps the folders), and
importing chatloom puts a finder first on sys.meta_path that resolves exactly these six names to
the copies here: in chatloom's own process its packages win; other programs in the same
environment never see them. A checkout run from its root (the tests) imports the folders
directly, as before.

One process still has one `kernels` module: see docs/packaging.md for why transformers stays
below 5.25."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

PACKAGES = ("app", "engine", "runner", "models", "kernels", "grammar", "migrations", "bench")


class _OwnPackages(importlib.abc.MetaPathFinder):
    """Finds the top-level `app`, `engine`, ... as chatloom.app, chatloom.engine, ... are found."""

    def find_spec(self, fullname, path=None, target=None):
        if path is not None or fullname not in PACKAGES:
            return None  # submodules follow their package's __path__
        inner = importlib.util.find_spec(f"{__name__}.{fullname}")
        if inner is None or inner.origin is None:
            return None
        return importlib.util.spec_from_file_location(
            fullname, inner.origin, submodule_search_locations=list(inner.submodule_search_locations or [])
        )


def install() -> None:
    """Put the finder first on sys.meta_path (once)."""
    if not any(isinstance(f, _OwnPackages) for f in sys.meta_path):
        sys.meta_path.insert(0, _OwnPackages())


install()


def main() -> int:
    """The `chatloom` console script."""
    from app.cli import main as cli_main

    return cli_main()
