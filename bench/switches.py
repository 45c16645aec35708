"""`chatloom bench --set module.NAME=value`: flips a module-level switch (a kernel choice, a tile
configuration, a split rule) for one benchmark process, so two settings are compared by two runs of
the same command instead of a python one-liner per experiment.

Only existing UPPER_CASE attributes of chatloom's own modules (kernels.*, engine.*, grammar.*, bench.*) are
accepted, and only with a Python literal of the type they already hold (an int where a float is held
too): a typo fails before the model loads instead of silently measuring the default.
"""

from __future__ import annotations

import ast
import importlib
import sys

PACKAGES = ("kernels", "engine", "grammar", "bench")


def parse(spec: str) -> tuple[str, str, object]:
    """'kernels.pdl.PDL=False' -> ('kernels.pdl', 'PDL', False)."""
    target, sep, text = spec.partition("=")
    module, _, name = target.strip().rpartition(".")
    if not sep or not module or not name:
        example = "kernels.pdl.PDL=False"
        raise ValueError(f"--set {spec!r}: expected module.NAME=value, e.g. {example}")
    if module.split(".")[0] not in PACKAGES:
        raise ValueError(f"--set {spec!r}: only switches of {', '.join(PACKAGES)} modules")
    if not name.isupper():
        raise ValueError(f"--set {spec!r}: {name} is not a module-level switch (UPPER_CASE)")
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError) as exc:
        literals = "True, 2, 0.5, 'x', (64, 4, 3)"
        raise ValueError(f"--set {spec!r}: the value must be a Python literal ({literals})") from exc
    return module, name, value


def _module(module_name: str):
    """The module the running program reads `module_name`'s switches from: `__main__` when the program
    is that module (`python -m bench.w2_attention` runs it as `__main__`, and an import by name would give a
    second copy whose switches nothing reads), else the imported module."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name == module_name:
        return main
    return importlib.import_module(module_name)


def apply(specs: list[str]) -> dict[str, object]:
    """Sets every switch (all checked first, then all set); returns {module.NAME: value} as set."""
    planned = []
    for spec in specs:
        module_name, name, value = parse(spec)
        try:
            module = _module(module_name)
        except ImportError as exc:
            raise ValueError(f"--set {spec!r}: no module {module_name} ({exc})") from exc
        if not hasattr(module, name):
            raise ValueError(f"--set {spec!r}: {module_name} has no {name}")
        old = getattr(module, name)
        ok = type(value) is type(old) or (isinstance(old, float) and type(value) is int)
        if not ok:
            held, got = type(old).__name__, type(value).__name__
            raise ValueError(f"--set {spec!r}: {module_name}.{name} holds a {held}, got a {got}")
        planned.append((module, f"{module_name}.{name}", name, value))
    for module, _, name, value in planned:
        setattr(module, name, value)
    return {full: value for _, full, _, value in planned}


def add_option(parser, example: str) -> None:
    """The repeatable `--set MODULE.NAME=VALUE` option of a benchmark command (`example`: its help)."""
    parser.add_argument("--set", action="append", default=[], metavar="MODULE.NAME=VALUE", help=example)


def apply_or_exit(parser, specs: list[str]) -> dict[str, object]:
    """apply(specs), a bad switch reported as the parser's usage error (exit 2) before anything runs."""
    try:
        return apply(specs)
    except ValueError as exc:
        parser.error(str(exc))
