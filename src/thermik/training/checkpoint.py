"""Checkpoints that are complete or absent on disk (docs/architecture.md, invariant 5).

Layout under `root`: `step_<n>/` (complete checkpoints), `latest` (text file naming the newest
complete one, written last), `.tmp_*` (work in progress or debris of a killed run).

A checkpoint is written into `.tmp_step_<n>`, fsynced and renamed to `step_<n>` in one atomic
rename; deletions go the other way (rename to `.tmp_*`, then remove), so a `step_<n>` directory
is never partial. `latest` is replaced atomically after the rename.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from thermik.atomic import TMP_PREFIX, publish_dir, remove_dir, remove_path, write_text_atomic

STEP_DIR = re.compile(r"^step_(\d+)$")
LATEST = "latest"


class CheckpointManager:
    """Writes `root/step_<n>` checkpoints atomically and keeps at most `keep` complete ones."""

    def __init__(self, root: Path, keep: int) -> None:
        if keep < 1:
            raise ValueError(f"CheckpointManager: keep must be >= 1, got {keep}")
        self.root = Path(root)
        self.keep = keep

    def list_complete(self) -> list[Path]:
        """Complete checkpoint directories, oldest step first."""
        if not self.root.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.root.iterdir() if (m := STEP_DIR.match(p.name)) and p.is_dir()]
        return [p for _, p in sorted(found)]

    def latest(self) -> Path | None:
        """The directory `latest` names if it is complete, else the highest complete step, else None."""
        marker = self.root / LATEST
        if marker.is_file():
            name = marker.read_text().strip()
            if STEP_DIR.match(name) and (self.root / name).is_dir():
                return self.root / name
        complete = self.list_complete()
        return complete[-1] if complete else None

    def save(self, step: int, write_fn: Callable[[Path], None]) -> Path:
        """Call `write_fn(tmp_dir)` and publish its contents as `root/step_<step>`; returns that path.

        If `write_fn` raises, its partial output is removed and the previous checkpoints stay as they were.
        """
        if step < 0:
            raise ValueError(f"CheckpointManager.save: step must be >= 0, got {step}")
        self.root.mkdir(parents=True, exist_ok=True)
        self._clean_tmp()
        # Make room first (disk may be tight); the newest complete checkpoint always survives.
        self._prune(self.keep - 1)
        name = f"step_{step}"
        # Written into .tmp_step_<n>, fsynced, renamed; saving the same step again retires the old copy first.
        final = publish_dir(self.root / name, write_fn, durable=True, unique_tmp=False)
        write_text_atomic(self.root / LATEST, name + "\n", durable=True)
        self._prune(self.keep)
        self._clean_tmp()
        return final

    def _prune(self, max_remaining: int) -> None:
        complete = self.list_complete()
        protected = {complete[-1], self.latest()} if complete else set()
        excess = len(complete) - max(max_remaining, 0)
        for path in complete:
            if excess <= 0:
                break
            if path in protected:
                continue
            remove_dir(path)  # renamed (invisible as a checkpoint) before any file is removed
            excess -= 1

    def _clean_tmp(self) -> None:
        for path in self.root.iterdir():
            if path.name.startswith(TMP_PREFIX):
                remove_path(path)


# ---------------------------------------------------------------- training state

MODEL_DIR = "model"
OPTIMIZER_FILE = "optimizer.pt"
RNG_FILE = "rng.pt"
STATE_FILE = "trainer_state.json"


def _rng_state() -> dict[str, Any]:
    """All RNG states as tensors and plain Python values, so they load with weights_only=True."""
    py_version, py_state, py_gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": [py_version, list(py_state), py_gauss],
        "numpy": [np_name, torch.from_numpy(np_keys.astype(np.int64)), int(np_pos), int(np_has_gauss), float(np_gauss)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    py_version, py_state, py_gauss = state["python"]
    random.setstate((py_version, tuple(py_state), py_gauss))
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = state["numpy"]
    np.random.set_state((np_name, np_keys.numpy().astype(np.uint32), np_pos, np_has_gauss, np_gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@contextmanager
def rng_kept() -> Iterator[None]:
    """Run a block without moving any global RNG (work before a seeded run that must not change its draws)."""
    state = _rng_state()
    try:
        yield
    finally:
        _set_rng_state(state)


def save_training_state(
    directory: Path,
    model: Any,
    optimizer: torch.optim.Optimizer,
    step: int,
    rng: bool = True,
    extra: dict[str, Any] | None = None,
) -> None:
    """Write model (`save_pretrained`, safetensors), optimizer state, RNG states and `extra` into `directory`.

    `model` is anything with `save_pretrained` (a transformers model or a PEFT model); transformers 5
    always writes safetensors. `extra` must be JSON-serializable (dataloader position, metrics, ...).
    """
    extra = dict(extra or {})
    if extra.get("step", step) != step:
        raise ValueError(f"save_training_state: extra['step']={extra['step']} disagrees with step={step}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory / MODEL_DIR)
    if not any((directory / MODEL_DIR).glob("*.safetensors")):
        raise RuntimeError(f"save_training_state: {type(model).__name__}.save_pretrained wrote no .safetensors file")
    torch.save(optimizer.state_dict(), directory / OPTIMIZER_FILE)
    if rng:
        torch.save(_rng_state(), directory / RNG_FILE)
    state = {"step": step, "extra": extra}
    (directory / STATE_FILE).write_text(json.dumps(state, indent=2, sort_keys=True))


def read_model_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the `.safetensors` files `save_training_state` wrote for a whole (not PEFT) model."""
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    if not tensors:
        raise FileNotFoundError(f"load_training_state: no .safetensors weights in {model_dir}")
    return tensors


def _load_model_weights(model: Any, model_dir: Path) -> None:
    from safetensors.torch import load_file

    adapter = model_dir / "adapter_model.safetensors"
    if adapter.is_file():  # PEFT: save_pretrained wrote only the adapter weights
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, load_file(str(adapter)))
        return
    tensors = read_model_weights(model_dir)
    result = model.load_state_dict(tensors, strict=False)
    # Tied weights (e.g. lm_head = embed_tokens) are saved once; anything else missing is an error.
    loaded_ptrs = {p.data_ptr() for name, p in model.state_dict().items() if name in tensors}
    params = model.state_dict()
    missing = [k for k in result.missing_keys if params[k].data_ptr() not in loaded_ptrs]
    if missing or result.unexpected_keys:
        raise RuntimeError(
            f"load_training_state: weights in {model_dir} do not match the model: "
            f"missing {missing[:5]}, unexpected {list(result.unexpected_keys)[:5]}"
        )


def load_training_state(directory: Path, model: Any | None, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    """Restore what `save_training_state` wrote, in place; returns the saved `extra` dict plus "step": int.

    Tensors are loaded with `weights_only=True`; RNG states are restored only if they were saved. A `model` or
    `optimizer` of None is left out (a caller that loads the weights its own way, e.g. into FSDP2 shards).
    """
    directory = Path(directory)
    if not (directory / STATE_FILE).is_file():
        raise FileNotFoundError(f"load_training_state: {directory} has no {STATE_FILE}; not a training checkpoint")
    if model is not None:
        _load_model_weights(model, directory / MODEL_DIR)
    if optimizer is not None:
        optimizer.load_state_dict(torch.load(directory / OPTIMIZER_FILE, map_location="cpu", weights_only=True))
    if (directory / RNG_FILE).is_file():
        _set_rng_state(torch.load(directory / RNG_FILE, map_location="cpu", weights_only=True))
    state = json.loads((directory / STATE_FILE).read_text())
    return {**state["extra"], "step": int(state["step"])}
