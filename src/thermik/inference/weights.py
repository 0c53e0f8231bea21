"""Loading a weight source (state dict, *.safetensors file or directory) and copying it into a model in place."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from thermik.inference.base import WeightSource


def load_state(source: WeightSource) -> dict[str, torch.Tensor]:
    if isinstance(source, dict):
        return source
    path = Path(source)
    if path.is_file() and path.suffix == ".safetensors":
        return load_file(str(path))
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
    for name, tensor in state.items():
        params[name].copy_(tensor)
