"""Weights on disk as safetensors: writing a state dict (a file, or a directory published atomically), loading a weight
source (state dict, *.safetensors file, directory of them, or a shared-memory weight directory: shared_weights.py) and
copying it into a model in place."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from thermik.atomic import publish_dir
from thermik.inference.base import WeightSource
from thermik.inference.shared_weights import is_shared, one_thread, read_shared

WEIGHTS_FILE = "model.safetensors"  # the file name of a published weight directory


def write_safetensors(state: dict[str, torch.Tensor], path: Path) -> None:
    """Write `state` as one safetensors file; tied tensors are stored once."""
    seen: set[tuple[int, tuple[int, ...]]] = set()
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        key = (tensor.data_ptr(), tuple(tensor.shape))
        if key in seen:
            continue  # a tied weight (e.g. lm_head = embed_tokens): loading the first name updates both
        seen.add(key)
        tensors[name] = tensor.detach().to("cpu").contiguous()
    save_file(tensors, str(path))


def save_state_dict(state: dict[str, torch.Tensor], directory: Path) -> Path:
    """Write `state` as directory/model.safetensors atomically (replacing an older copy); tied tensors stored once."""
    return publish_dir(directory, lambda tmp: write_safetensors(state, tmp / WEIGHTS_FILE))


def load_state(source: WeightSource) -> dict[str, torch.Tensor]:
    if isinstance(source, dict):
        return source
    path = Path(source)
    if path.is_file() and path.suffix == ".safetensors":
        return load_file(str(path))
    if path.is_dir() and is_shared(path):
        return read_shared(path)
    if path.is_dir():
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors files in {path}")
        state: dict[str, torch.Tensor] = {}
        for file in files:
            state.update(load_file(str(file)))
        return state
    raise FileNotFoundError(f"weight source {path} is neither a *.safetensors file nor a directory")


def check_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The model's parameters and buffers by name, after checking that `state` names only those, shape for shape."""
    params = model.state_dict()
    unknown = sorted(set(state) - set(params))
    if unknown:
        raise KeyError(f"weights not in the model: {unknown[:5]}{' ...' if len(unknown) > 5 else ''}")
    for name, tensor in state.items():
        if tensor.shape != params[name].shape:
            have, want = tuple(tensor.shape), tuple(params[name].shape)
            raise ValueError(f"weight {name!r} has shape {have}, the model has {want}")
    return params


@torch.no_grad()
def copy_state(params: dict[str, torch.Tensor], state: dict[str, torch.Tensor]) -> None:
    """Copy in place, on one OpenMP thread (this calling thread only): a copy is memory-bound, and a parallel region
    per tensor waits for every team thread to be scheduled; on a busy 2-core machine the 51 tensors of a 1M model
    took 230 ms with two threads and 0.15 ms with one (benchmarks/split_weight_transfer.py)."""
    with one_thread():
        for name, tensor in state.items():
            params[name].copy_(tensor)
