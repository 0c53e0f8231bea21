"""The frozen config surface: every command's keys, types and defaults match tests/config_surface/*.txt, and a change
to them fails here until `python scripts/config_surface.py --write` regenerates the files in the same commit."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from config_variants import Toy

from tests.conftest import cli_env
from thermik.config.surface import surface

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "config_surface.py"


@pytest.fixture(scope="module")
def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("config_surface", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_command_config_matches_its_checked_in_surface(script: ModuleType) -> None:
    diffs = script.changes()
    assert not diffs, (
        "the config surface changed (a key added, renamed, retyped, dropped or given another default): if on "
        f"purpose, run `{script.WRITE}` and note the change in the commit (a renamed or removed key needs an old-key "
        "pointer, docs/configuration.md)\n" + "\n".join(diffs)
    )


def test_a_changed_key_is_caught_and_write_regenerates(script: ModuleType, tmp_path: Path) -> None:
    script.write(tmp_path)
    assert script.changes(tmp_path) == []
    run = tmp_path / "RunConfig.txt"
    run.write_text(run.read_text().replace("trainer.steps int 80\n", "trainer.steps int 81\n"))
    (diff,) = script.changes(tmp_path)
    assert "-trainer.steps int 81" in diff and "+trainer.steps int 80" in diff
    (tmp_path / "ServeConfig.txt").unlink()
    assert len(script.changes(tmp_path)) == 2


def test_the_surface_lists_every_leaf_with_type_and_default(script: ModuleType) -> None:
    lines = surface(script.COMMAND_CONFIGS["RunConfig"])
    assert "trainer.steps int 80" in lines
    assert "trainer.optimizer.betas tuple[float, float] [0.9, 0.98]" in lines
    assert 'inference.precision {model,float32,bfloat16,bf16-weights,int8,auto} "auto"' in lines
    assert "inference.kv_cache_gb float | None None" in lines
    assert len(lines) == len({line.split()[0] for line in lines})  # one line per key


def test_union_sections_are_listed_per_variant() -> None:
    assert surface(Toy) == [
        'name str "toy"',
        "algorithm.steps int 3",
        'algorithm.loss.type {ppo,gspo} "ppo"',
        "algorithm.loss[type=ppo].clip float 0.2",
        "algorithm.loss[type=gspo].clip_low float 0.0003",
        "algorithm.loss[type=gspo].clip_high float 0.0004",
    ]


def test_the_script_exits_0_on_the_checked_in_surface() -> None:
    """The script itself, as CI or a contributor runs it: 0 on the checked-in surface."""
    res = subprocess.run([sys.executable, str(SCRIPT)], env=cli_env(), capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
