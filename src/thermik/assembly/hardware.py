"""What this machine must have to run a config: asked when a run is assembled, never when a config is validated.

A config validates the same on every machine (docs/configuration.md, "Validation and the machine"): it can be written
and checked on a laptop and run on a server. The questions that depend on the machine (does model.device exist here,
does this CPU run bfloat16) are asked here, by every command before it writes or loads anything, and a missing piece
is one `ThermikError` line naming the setting to change.
"""

from __future__ import annotations

import torch

from thermik.config.schema import InferenceConfig, ModelConfig
from thermik.cpu.isa import bf16_refusal
from thermik.errors import ThermikError


class HardwareError(ThermikError):
    """This machine lacks what the config asks for (a device, bfloat16 arithmetic)."""


def check_device(device: str) -> None:
    """Refuse a model.device this machine does not have."""
    kind, _, index = device.partition(":")
    if kind != "cuda":
        return
    if not torch.cuda.is_available():
        raise HardwareError(f"model.device = {device!r} but this machine has no CUDA device: set model.device = 'cpu'")
    count = torch.cuda.device_count()
    if index.isdigit() and int(index) >= count:
        raise HardwareError(
            f"model.device = {device!r} but this machine has {count} CUDA device(s): set model.device = 'cuda:0'"
        )


def _check_bf16(key: str, value: str, device: str) -> None:
    if device.startswith("cuda") and not torch.cuda.is_bf16_supported():
        raise HardwareError(f"{key} = {value!r} needs a GPU with bfloat16; this one has none: set {key} = 'float32'")
    refusal = bf16_refusal(key, value, device)
    if refusal is not None:
        raise HardwareError(refusal)


def check_hardware(
    model: ModelConfig | None, inference: InferenceConfig | None = None, *, training: bool = True
) -> None:
    """Refuse, before any work, what this machine cannot run: `model` (its device; with `training`, its
    train_precision) and `inference` (an embedded engine's precision on model.device). None skips a part (a process
    that holds no policy, or no engine)."""
    if model is None:
        return
    check_device(model.device)
    if training and model.train_precision == "bf16-mixed":
        _check_bf16("model.train_precision", model.train_precision, model.device)
    if inference is not None and inference.backend == "embedded" and inference.precision == "bfloat16":
        _check_bf16("inference.precision", inference.precision, model.device)
