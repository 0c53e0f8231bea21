"""Each ecosystem integration is found from one name: its env is `envs/<name>_env.py`, its rows
`tasks/<name>_rows.py` (docs/architecture.md, "Integrations: one name, one module per layer"), and the modules the
registries name exist. A new ecosystem that breaks the pattern fails here, naming the module."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from thermik.envs.registry import PREFIXED_SOURCES
from thermik.tasks.registry import PREFIXED_GENERATORS

SRC = Path(__file__).resolve().parents[1] / "src" / "thermik"


def _integration(prefix: str) -> str:
    """`openenv+wss://` -> openenv, `reasoning_gym:` -> reasoning_gym."""
    return prefix.split(":")[0].split("+")[0]


def test_every_ecosystem_env_lives_in_envs_name_env() -> None:
    for prefix, target in PREFIXED_SOURCES.items():
        module = target.split(":")[0]
        assert module == f"thermik.envs.{_integration(prefix)}_env", (prefix, module)
        assert importlib.util.find_spec(module) is not None, module


def test_every_ecosystem_rows_module_lives_in_tasks_name_rows() -> None:
    for prefix, module in PREFIXED_GENERATORS.items():
        assert module == f"thermik.tasks.{_integration(prefix)}_rows", (prefix, module)
        assert importlib.util.find_spec(module) is not None, module
        env_module = f"thermik.envs.{_integration(prefix)}_env:"
        assert any(target.startswith(env_module) for target in PREFIXED_SOURCES.values()), (prefix, env_module)


def test_no_module_is_named_after_an_integration_alone() -> None:
    """`envs/verifiers.py` beside `tasks/verifiers.py` hid what each was for: every module carries its job."""
    names = {_integration(prefix) for prefix in PREFIXED_SOURCES}
    bare = [str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if p.stem in names]
    assert bare == [], f"name these for their job (<integration>_env, _rows, _episodes...): {bare}"
