"""Trainer speed and memory choices for the policy's decoder layers: activation checkpointing and `torch.compile`.

- Activation checkpointing (`trainer.activation_checkpointing`): each decoder layer keeps only its input for the
  backward pass and recomputes the rest (transformers' gradient checkpointing, non-reentrant): activation memory
  falls from ~ layers x tokens x (many hidden-sized tensors) to ~ layers x tokens x hidden, for one more forward's
  compute (about a third more per step). For long sequences or large micro-batches that would not fit otherwise.
- Compilation (`trainer.compile`): each decoder layer's forward through `torch.compile` (inductor fuses the norms,
  RoPE, SiLU and residual additions that run as separate memory-bound kernels otherwise). The layers share one
  compiled graph; shapes are compiled as dynamic, since RL micro-batches change length every step. It pays on a
  GPU at RL sizes, where those element-wise kernels are a large share of a small model's step
  (benchmarks/trainer_mfu.py `--compile`); the first steps take the compile time (tens of seconds).

Both leave parameters, state-dict keys and values unchanged (logprobs and gradients equal up to float rounding).
"""

from __future__ import annotations

import torch

from thermik.errors import ThermikError


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList | None:
    """The decoder layer list of a Llama/Qwen-shaped HF model (`model.model.layers`), else None."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    return layers if isinstance(layers, torch.nn.ModuleList) else None


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each decoder layer's activations in the backward pass (non-reentrant checkpointing)."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ThermikError(
            f"{type(model).__name__} does not support activation checkpointing",
            hint="set trainer.activation_checkpointing = false",
        )
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x's name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def compile_layers(model: torch.nn.Module) -> int:
    """Compile each decoder layer's forward in place (`nn.Module.compile`, dynamic shapes); returns how many."""
    layers = decoder_layers(model)
    if layers is None:
        raise ThermikError(
            f"trainer.compile needs a model with decoder layers at model.layers; {type(model).__name__} has none",
            hint="set trainer.compile = false",
        )
    for layer in layers:
        layer.compile(dynamic=True)
    return len(layers)


def apply_train_speed(model: torch.nn.Module, activation_checkpointing: bool, compile: bool) -> list[str]:
    """Apply the trainer's choices to the policy; returns what was applied, for the trainer's log line."""
    applied = []
    if activation_checkpointing:
        enable_activation_checkpointing(model)
        applied.append("activation checkpointing")
    if compile:
        applied.append(f"torch.compile on {compile_layers(model)} decoder layers")
    return applied
