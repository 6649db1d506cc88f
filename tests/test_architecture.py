"""The dependency arrows: rlcore imports only its maths stack; the shell's layers point down.

rlcore may import the standard library, torch, numpy, attrs, beartype and
jaxtyping; `rlcore.jax` may add jax, flax and optax; `rlcore.testing` may add
hypothesis. Nothing in rlcore may import ray, transformers, gymnasium, rlshell
or anything else. Checked twice: statically over every source file (an import
inside a function counts too), and by importing rlcore in a fresh interpreter.

rlshell is layered (docs/architecture.md draws it): config and extensions at
the bottom, then cluster, then the domain packages (models, envs, rewards,
rollout records, weight sync, data, Hub ids, metrics, checkpoints, export,
evaluation), then engines, workers, runners, and the command lines on top. A
module imports only from its own layer or the ones below (statically, imports
inside functions and under TYPE_CHECKING included); the concerns form no
cycle; and every `Worker` subclass lives in `rlshell.workers`.
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
    assert violations("def f():\n    import gymnasium\n", "rlcore.shaping") == {"gymnasium"}
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


# ---------------------------------------------------------------------------- the shell

SHELL = Path(__file__).resolve().parents[1] / "src" / "rlshell"

# Lowest first. Every top-level module or package of rlshell is in exactly one layer.
SHELL_LAYERS: list[tuple[str, frozenset[str]]] = [
    (
        "base",
        frozenset(
            {
                "rlshell",
                "config",
                "extensions",
                "limits",
                "process",
                "process_pool",
                "randomness",
                "isolation",
                "debian_packages",
                "signing",
            }
        ),
    ),
    ("cluster", frozenset({"cluster"})),
    (
        "domain",
        frozenset(
            {
                "models",
                "envs",
                "rewards",
                "rollout",
                "sync",
                "data",
                "tokenizer",
                "hub",
                "gguf",
                "metrics",
                "checkpoint",
                "export",
                "evaluation",
                "rundir",
                "conversation",
                "tools",
                "hyperparameters",
                "demonstrations",
                "rlinf_plugins",
            }
        ),
    ),
    ("engines", frozenset({"engines"})),
    ("workers", frozenset({"workers"})),
    ("runners", frozenset({"runners"})),
    ("apps", frozenset({"api", "train", "evaluate", "record"})),
]


def shell_module(path: Path) -> str:
    parts = path.relative_to(SHELL.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def concern(module: str) -> str:
    """``rlshell.runners.loop`` → ``runners``; the package itself → ``rlshell``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "rlshell"


def layer_of(name: str) -> int:
    for index, (_, members) in enumerate(SHELL_LAYERS):
        if name in members:
            return index
    raise KeyError(name)


def shell_imports(source: str, module: str, is_package: bool) -> set[str]:
    """The rlshell modules a module's source imports (relative imports resolved)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "rlshell")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = module.split(".")
                if not is_package:
                    package = package[:-1]
                base = package[: len(package) - node.level + 1]
                name = ".".join([*base, *([node.module] if node.module else [])])
            else:
                name = node.module or ""
            if name.split(".")[0] == "rlshell":
                found.add(name)
    return found


def upward_imports(source: str, module: str, is_package: bool = False) -> list[str]:
    """``module``'s imports of a layer above its own, as 'a → b (layer x above y)'."""
    own = layer_of(concern(module))
    bad = []
    for name in sorted(shell_imports(source, module, is_package)):
        target = layer_of(concern(name))
        if target > own:
            bad.append(
                f"{module} → {name} ({SHELL_LAYERS[target][0]} above {SHELL_LAYERS[own][0]})"
            )
    return bad


SHELL_FILES = sorted(SHELL.rglob("*.py"))


def test_the_shell_checker_catches_upward_imports() -> None:
    """The rule has teeth: a worker importing a runner, the config importing validation."""
    assert upward_imports("from rlshell.runners.loop import run\n", "rlshell.workers.actor") == [
        "rlshell.workers.actor → rlshell.runners.loop (runners above workers)"
    ]
    source = "def f():\n    from rlshell.runners.validation import validate\n"
    assert upward_imports(source, "rlshell.config.loading") == [
        "rlshell.config.loading → rlshell.runners.validation (runners above base)"
    ]
    assert upward_imports("from . import schema\n", "rlshell.config", is_package=True) == []
    assert (
        upward_imports("from rlshell.cluster.group import WorkerGroup\n", "rlshell.runners.sac")
        == []
    )


def test_every_shell_module_is_in_a_layer() -> None:
    unplaced = sorted(
        {concern(shell_module(p)) for p in SHELL_FILES}
        - set().union(*(members for _, members in SHELL_LAYERS))
    )
    assert not unplaced, f"rlshell modules in no layer of SHELL_LAYERS: {unplaced}"


@pytest.mark.parametrize("path", SHELL_FILES, ids=lambda p: str(p.relative_to(SHELL)))
def test_shell_module_imports_only_its_layer_and_below(path: Path) -> None:
    module = shell_module(path)
    bad = upward_imports(path.read_text(), module, path.name == "__init__.py")
    assert not bad, "imports up the layers (docs/architecture.md):\n" + "\n".join(bad)


def test_the_shell_concerns_form_no_cycle() -> None:
    graph: dict[str, set[str]] = {}
    for path in SHELL_FILES:
        module = shell_module(path)
        for name in shell_imports(path.read_text(), module, path.name == "__init__.py"):
            if concern(name) != concern(module):
                graph.setdefault(concern(module), set()).add(concern(name))
    visiting: list[str] = []
    done: set[str] = set()

    def visit(node: str) -> None:
        if node in done:
            return
        assert node not in visiting, f"import cycle: {' → '.join([*visiting, node])}"
        visiting.append(node)
        for target in sorted(graph.get(node, ())):
            visit(target)
        visiting.pop()
        done.add(node)

    for node in sorted(graph):
        visit(node)


def module_graph() -> dict[str, set[str]]:
    """Each rlshell module and the rlshell modules it imports (statically: imports inside
    functions and under TYPE_CHECKING count; an imported name resolves to its module)."""
    modules = {shell_module(path): path for path in SHELL_FILES}

    def module_of(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        imported = shell_imports(path.read_text(), module, path.name == "__init__.py")
        graph[module] = {module_of(name) for name in imported} - {module, ""}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(cycles)


# Module cycles not yet taken apart: each must go, and no other may appear.
KNOWN_CYCLES: list[list[str]] = []


def test_the_cycle_finder_finds_cycles_through_any_import() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_the_shell_modules_form_no_import_cycle_but_the_known_ones() -> None:
    assert import_cycles(module_graph()) == KNOWN_CYCLES


# The workers of the policy and value models reach a training backend only through its
# protocol (`rlshell.engines.training.TrainingBackend`): no backend's own module, no
# Megatron, no FSDP.
BACKEND_BLIND = ["actor", "critic", "policy_update", "sft_update", "weight_publishing"]
BACKEND_INTERNALS = (
    "rlshell.engines.training.",
    "megatron",
    "torch.distributed.fsdp",
    "torch.distributed.tensor",
)


def imported_names(source: str) -> set[str]:
    """Every absolute module a source imports, anywhere in it (functions, TYPE_CHECKING)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module)
    return names


def backend_internals(source: str) -> list[str]:
    return sorted(
        name
        for name in imported_names(source)
        if any(
            name.startswith(p)
            if p.endswith(".")
            else name.split(".")[: len(p.split("."))] == p.split(".")
            for p in BACKEND_INTERNALS
        )
    )


def test_the_backend_checker_catches_internals() -> None:
    source = (
        "from rlshell.engines.training import TrainingBackend\n"
        "def f():\n    from megatron.core import parallel_state\n"
        "from rlshell.engines.training.fsdp import gathered_named_tensors\n"
    )
    assert backend_internals(source) == ["megatron.core", "rlshell.engines.training.fsdp"]


@pytest.mark.parametrize("name", BACKEND_BLIND)
def test_model_workers_reach_the_backend_only_through_its_protocol(name: str) -> None:
    source = (SHELL / "workers" / f"{name}.py").read_text()
    assert backend_internals(source) == []


# Facts a run's config fixes, each derived in one place (`rlshell.runners.facts`): the
# placement layout, and whether a critic is trained. Everything else reads them from the
# `RunSpec` (a `RunFacts`) it is handed.
DERIVATIONS = {
    "ProcessLayout.of(": "the process layout",
    'adv_type == "gae"': "whether a critic is trained",
}


def test_each_derived_fact_is_derived_in_one_module() -> None:
    found = {
        (needle, shell_module(path))
        for path in SHELL_FILES
        for needle in DERIVATIONS
        if needle in path.read_text()
    }
    elsewhere = sorted(
        f"{module} derives {DERIVATIONS[needle]} again ({needle!r})"
        for needle, module in found
        if module != "rlshell.runners.facts"
    )
    assert not elsewhere, elsewhere


def worker_classes() -> dict[str, str]:
    """Every class deriving (by name, transitively) from `Worker`, and its module."""
    bases: dict[str, tuple[str, list[str]]] = {}
    for path in SHELL_FILES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                names = [
                    b.id if isinstance(b, ast.Name) else b.attr
                    for b in node.bases
                    if isinstance(b, ast.Name | ast.Attribute)
                ]
                bases[node.name] = (shell_module(path), names)
    workers: dict[str, str] = {}
    changed = True
    while changed:
        changed = False
        for name, (module, parents) in bases.items():
            if name not in workers and any(p == "Worker" or p in workers for p in parents):
                workers[name] = module
                changed = True
    return workers


def test_every_worker_class_lives_in_workers_and_its_name_is_unique() -> None:
    classes = worker_classes()
    assert {"ActorWorker", "EmbodiedWorker", "SACLearnerWorker"} <= classes.keys()
    misplaced = {
        name: module
        for name, module in classes.items()
        if not module.startswith("rlshell.workers.")
    }
    assert not misplaced, f"worker classes outside rlshell.workers: {misplaced}"
    names = [
        node.name
        for path in SHELL_FILES
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
    ]
    repeated = sorted({name for name in names if names.count(name) > 1})
    assert not repeated, f"classes defined twice in rlshell under one name: {repeated}"


def test_the_documented_public_import_paths_exist() -> None:
    """docs/extending.md's table of public paths: each module imports and has the names."""
    import importlib
    import re

    page = (SHELL.parents[1] / "docs" / "extending.md").read_text()
    table = page[page.index("## Public import paths") :]
    named = re.findall(r"`(rlshell(?:\.\w+)+)`(?: \(([^)]*)\))?", table)
    assert len(named) >= 10, named
    for path, names in named:
        module_name, attribute = path, None
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError:
            module_name, attribute = path.rsplit(".", 1)
            module = importlib.import_module(module_name)
        if attribute is not None:
            assert hasattr(module, attribute), f"{module_name} has no {attribute}"
        for name in re.findall(r"`(\w+)`", names):
            assert hasattr(module, name), f"{module_name} has no {name}"
