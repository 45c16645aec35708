"""The packages import downward only: kernels <- models <- runner <- engine <- app, grammar beside
them, and nothing shipped imports the lab (bench/, train/) or the tests. Imports under
`if TYPE_CHECKING:` name types for annotations and are not counted."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIRST_PARTY = {
    "app",
    "engine",
    "runner",
    "models",
    "kernels",
    "grammar",
    "migrations",
    "bench",
    "train",
    "tests",
}

# each package and the first-party packages it may import at run time (itself included)
ALLOWED = {
    "kernels": {"kernels"},
    "models": {"models", "kernels"},
    "runner": {"runner", "models", "kernels"},
    "grammar": {"grammar"},
    "engine": {"engine", "runner", "models", "kernels", "grammar"},
    "app": {"app", "engine", "runner", "models", "kernels", "grammar", "migrations"},
    "migrations": {"migrations", "app"},
}


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_modules(tree: ast.AST, type_checking: bool = True) -> set[str]:
    """First-party modules named by absolute imports, function bodies included (and the imports under
    `if TYPE_CHECKING:` unless type_checking is False)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if not type_checking and isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {n for n in found if n.split(".")[0] in FIRST_PARTY}


def imported_packages(tree: ast.AST) -> set[str]:
    """First-party top-level packages a module imports at run time (function bodies included)."""
    return {n.split(".")[0] for n in imported_modules(tree, type_checking=False)}


def test_the_rule_sees_imports_in_functions_and_skips_type_checking():
    tree = ast.parse(
        "from typing import TYPE_CHECKING\nimport kernels.x\nif TYPE_CHECKING:\n    import engine\n"
        "def f():\n    from bench import w\n"
    )
    assert imported_packages(tree) == {"kernels", "bench"}


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_the_layers_below(package):
    wrong = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        extra = imported_packages(ast.parse(path.read_text(), str(path))) - ALLOWED[package]
        if extra:
            wrong[str(path.relative_to(ROOT))] = sorted(extra)
    assert not wrong, f"imports against the layering: {wrong}"


def _module_exists(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def test_every_first_party_import_names_a_module_that_exists():
    """Imports that only GPU runs or optional paths execute still name real modules (a test that
    imported a helper from the folder it had left failed only on the GPU)."""
    missing = {}
    for top in sorted(FIRST_PARTY):
        for path in sorted((ROOT / top).rglob("*.py")):
            gone = sorted(
                m for m in imported_modules(ast.parse(path.read_text(), str(path))) if not _module_exists(m)
            )
            if gone:
                missing[str(path.relative_to(ROOT))] = gone
    assert not missing, f"imports of modules that do not exist: {missing}"
