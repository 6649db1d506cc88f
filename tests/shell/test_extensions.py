"""RLSHELL_EXT_MODULE: loaded once per process, errors name the module, and Ray workers get it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from rlshell.cluster.ray_cluster import Cluster
from rlshell.cluster.worker import Worker
from rlshell.config import ModelConfig
from rlshell.extensions import ENV_VAR, ExtensionError, extension_modules, load_extensions

from .conftest import PlanFactory

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_EXT = ROOT / "examples" / "extension"


class ModelBuildingWorker(Worker):
    """Builds a model by its registered name; never imports the extension itself."""

    def build(self, model_type: str) -> dict[str, Any]:
        from rlshell.models import get_model

        model = get_model(ModelConfig(model_type=model_type, category="embodied"))
        return {
            "class": f"{type(model).__module__}.{type(model).__qualname__}",
            "parameters": sum(p.numel() for p in model.parameters()),
            "extension_imported": "rlshell_example_ext" in sys.modules,
        }


def test_an_extension_model_is_built_inside_a_ray_worker(
    ray_cluster: Cluster, plan_component: PlanFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_VAR, "rlshell_example_ext")
    monkeypatch.setenv("PYTHONPATH", str(EXAMPLE_EXT))
    group = ModelBuildingWorker.create_group().launch(ray_cluster, plan_component("ext"))
    try:
        built = group.build("bandit_mlp").wait(timeout=60)
    finally:
        group.shutdown()
    assert "rlshell_example_ext" not in sys.modules, "the driver must not have imported it"
    assert (
        built
        == [
            {
                "class": "rlshell_example_ext.policy.BanditPolicy",
                "parameters": 16 * 1 + 16 + 16 * 2 + 2 + 16 + 1,
                "extension_imported": True,
            }
        ]
        * 2
    )


def test_a_worker_without_the_extension_does_not_know_the_name(
    ray_cluster: Cluster, plan_component: PlanFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    group = ModelBuildingWorker.create_group().launch(ray_cluster, plan_component("noext", 1))
    try:
        with pytest.raises(KeyError, match="unknown model type 'bandit_mlp'"):
            group.build("bandit_mlp").wait(timeout=60)
    finally:
        group.shutdown()


def test_extension_modules_are_read_from_the_environment() -> None:
    assert extension_modules({ENV_VAR: " a.b , c,, "}) == ("a.b", "c")
    assert extension_modules({}) == ()


def write_module(directory: Path, name: str, body: str) -> None:
    (directory / f"{name}.py").write_text(body)


def test_register_runs_once_per_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_module(tmp_path, "ext_counting", "calls = []\ndef register():\n    calls.append(1)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_extensions(("ext_counting",)) == ["ext_counting"]
    assert load_extensions(("ext_counting",)) == []
    assert sys.modules["ext_counting"].calls == [1]


@pytest.mark.parametrize(
    ("name", "body", "message"),
    [
        ("ext_missing_xyz", None, "module 'ext_missing_xyz' could not be imported on the tool A"),
        ("ext_no_register", "x = 1\n", "defines no register() function; the tool A"),
        (
            "ext_raising",
            "def register():\n    raise RuntimeError('bad builder')\n",
            "module 'ext_raising': register() raised on the tool A",
        ),
        (
            "ext_broken_import",
            "import no_such_dependency_xyz\n",
            "ModuleNotFoundError: No module named 'no_such_dependency_xyz'",
        ),
    ],
)
def test_a_broken_extension_names_the_module_and_the_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, body: str | None, message: str
) -> None:
    if body is not None:
        write_module(tmp_path, name, body)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ExtensionError) as caught:
        load_extensions((name,), where="tool A")
    assert message in str(caught.value)
    assert "pid" in str(caught.value)
