"""Weights through POSIX shared memory: processes on one machine hand a state dict over without a safetensors file.

The writer copies every tensor into one segment under /dev/shm (memory, not disk) and writes a small manifest,
`shared_memory.json` (segment name, and per tensor its dtype, shape and byte offset), into the weight directory it
publishes. A reader maps the segment and views each tensor in place; loading copies them once, into the model.
`load_state` (weights.py) reads such a directory like one holding *.safetensors, so the inference server's
`POST /update_weights {"path": ...}` takes either.

A segment lives until `unlink_segment` removes it (the split trainer prunes old steps, the orchestrator removes what
the server holds); a crashed run may leave a few behind: `rm /dev/shm/thermik-*` frees them.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import torch

MANIFEST = "shared_memory.json"
SHM_ROOT = Path("/dev/shm")
ALIGN = 64  # each tensor starts on a cache line


def available() -> bool:
    """Whether this machine has a POSIX shared-memory filesystem to put weights in."""
    return SHM_ROOT.is_dir() and os.access(SHM_ROOT, os.W_OK)


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in a shared-memory weight manifest")
    return dtype


def write_shared(state: dict[str, torch.Tensor], directory: Path, prefix: str) -> Path:
    """Copy `state` into a new segment `<prefix>-<id>` and write directory/shared_memory.json describing it; tied
    tensors are stored once. Returns the segment's path."""
    entries, tensors, offset, seen = [], [], 0, set()
    for name, tensor in state.items():
        key = (tensor.data_ptr(), tuple(tensor.shape))
        if key in seen:
            continue  # a tied weight (lm_head = embed_tokens): loading the first name updates both
        seen.add(key)
        tensor = tensor.detach().to("cpu").contiguous()
        nbytes = tensor.numel() * tensor.element_size()
        entries.append({"name": name, "dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape),
                        "offset": offset, "nbytes": nbytes})  # fmt: skip
        tensors.append(tensor)
        offset += -(-nbytes // ALIGN) * ALIGN
    segment = SHM_ROOT / f"{prefix}-{uuid.uuid4().hex[:8]}"
    # write() into tmpfs, not a copy into a fresh mapping: the kernel fills new pages in bulk (measured ~10x faster
    # than faulting them in one by one); readers map it (read_shared)
    with segment.open("wb") as f:
        for entry, tensor in zip(entries, tensors, strict=True):
            f.seek(int(entry["offset"]))
            f.write(tensor.reshape(-1).view(torch.uint8).numpy().data)
        f.truncate(max(offset, 1))
    (directory / MANIFEST).write_text(json.dumps({"segment": segment.name, "bytes": offset, "tensors": entries}))
    return segment


def is_shared(directory: Path) -> bool:
    return (Path(directory) / MANIFEST).is_file()


def read_shared(directory: Path) -> dict[str, torch.Tensor]:
    """The tensors of a shared-memory weight directory, as views into the mapped segment (no copy)."""
    manifest = json.loads((Path(directory) / MANIFEST).read_text())
    segment = SHM_ROOT / manifest["segment"]
    if not segment.is_file():
        raise FileNotFoundError(
            f"shared-memory weights {segment} are gone (removed after use, or the machine restarted): publish them "
            "again, or use split.weight_transfer = 'files'"
        )
    buffer = torch.from_file(str(segment), shared=True, size=max(int(manifest["bytes"]), 1), dtype=torch.uint8)
    state = {}
    for entry in manifest["tensors"]:
        start = int(entry["offset"])
        raw = buffer[start : start + int(entry["nbytes"])]
        state[entry["name"]] = raw.view(_dtype(entry["dtype"])).view(entry["shape"])
    return state


def shared_segment(directory: Path) -> Path | None:
    """The segment a shared-memory weight directory names (None when it is not one)."""
    try:
        return SHM_ROOT / json.loads((Path(directory) / MANIFEST).read_text())["segment"]
    except (OSError, ValueError, KeyError):
        return None


def unlink_segment(directory: Path) -> None:
    """Free the segment a shared-memory weight directory names (nothing when it is not one, or already freed)."""
    segment = shared_segment(directory)
    if segment is not None:
        segment.unlink(missing_ok=True)
