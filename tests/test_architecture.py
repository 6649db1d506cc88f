"""The dependency arrow: rlcore imports only its maths stack, never the shell's.

rlcore may import the standard library, torch, numpy, attrs, beartype and
jaxtyping; `rlcore.jax` may add jax, flax and optax; `rlcore.testing` may add
hypothesis. Nothing in rlcore may import ray, transformers, gymnasium, rlshell
or anything else. Checked twice: statically over every source file (an import
inside a function counts too), and by importing rlcore in a fresh interpreter.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

RLCORE = Path(__file__).resolve().parents[1] / "src" / "rlcore"

ALLOWED = {"torch", "numpy", "attrs", "attr", "beartype", "jaxtyping", "rlcore"}
ALLOWED_IN = {
    "rlcore.jax": {"jax", "jaxlib", "flax", "optax"},
    "rlcore.testing": {"hypothesis"},
}
FORBIDDEN_AT_IMPORT = ["ray", "transformers", "gymnasium", "rlshell", "jax", "hypothesis", "vllm"]


def module_name(path: Path) -> str:
    parts = path.relative_to(RLCORE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_roots(source: str, module: str) -> set[str]:
    """Top-level package names a module's source imports (relative imports resolve to rlcore)."""
    roots: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            roots.add(module.split(".")[0] if node.level else (node.module or "").split(".")[0])
    return roots


def violations(source: str, module: str) -> set[str]:
    allowed = set(ALLOWED)
    for prefix, extra in ALLOWED_IN.items():
        if module == prefix or module.startswith(prefix + "."):
            allowed |= extra
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    return {root for root in imported_roots(source, module) if root not in allowed | stdlib}


def test_the_checker_catches_forbidden_imports() -> None:
    """The rule has teeth: each kind of forbidden import is reported."""
    assert violations("import ray\n", "rlcore.masked") == {"ray"}
    assert violations("from transformers import AutoModel\n", "rlcore.losses") == {"transformers"}
    assert violations("def f():\n    import gymnasium\n", "rlcore.rollout") == {"gymnasium"}
    assert violations("from rlshell.config import X\n", "rlcore.advantages") == {"rlshell"}
    assert violations("import jax\n", "rlcore.masked") == {"jax"}
    assert violations("import jax\n", "rlcore.jax.advantages") == set()
    assert violations("import hypothesis\n", "rlcore.testing.strategies") == set()
    assert violations("import torch, numpy, attrs\nfrom . import x\n", "rlcore.masked") == set()


@pytest.mark.parametrize(
    "path", sorted(RLCORE.rglob("*.py")), ids=lambda p: str(p.relative_to(RLCORE))
)
def test_rlcore_module_imports_only_its_stack(path: Path) -> None:
    module = module_name(path)
    bad = violations(path.read_text(), module)
    assert not bad, f"{module} imports {sorted(bad)}: rlcore must stay pure (see DESIGN.md)"


def test_importing_rlcore_loads_no_shell_or_optional_package() -> None:
    code = (
        "import sys, rlcore, rlcore.registry\n"
        f"bad = [m for m in {FORBIDDEN_AT_IMPORT!r} if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.strip() == "", f"import rlcore loaded: {result.stdout.strip()}"
