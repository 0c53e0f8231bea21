"""Weights through POSIX shared memory: processes on one machine hand a state dict over without a safetensors file.

The writer copies every tensor into a segment under /dev/shm (memory, not disk) and writes a small manifest,
`shared_memory.json` (segment name, the step written, and per tensor its dtype, shape and byte offset), into the
weight directory it publishes. A reader maps the segment and views each tensor in place; loading copies them once,
into the model. `load_state` (weights.py) reads such a directory like one holding *.safetensors, so the inference
server's `POST /update_weights {"path": ...}` takes either.

Segments are reused: the split trainer writes step s into slot s mod (max_staleness + 2), and both sides keep their
mapping of a slot open, so after the first round a transfer is two memory copies into and out of pages already
mapped (no file written, no page allocated). A segment's 64-byte header holds the step it holds (-1 while being
written); a reader refuses a directory whose segment now holds another step. The orchestrator removes the segments
when it stops; a crashed run may leave a few behind: `rm /dev/shm/thermik-*` frees them.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import torch

MANIFEST = "shared_memory.json"
SHM_ROOT = Path("/dev/shm")
ALIGN = 64  # each tensor starts on a cache line
HEADER = 64  # int64 step, then padding
_maps: dict[Path, tuple[int, int, torch.Tensor]] = {}  # segment -> (inode, bytes, its mapping) of this process


def available() -> bool:
    """Whether this machine has a POSIX shared-memory filesystem to put weights in."""
    return SHM_ROOT.is_dir() and os.access(SHM_ROOT, os.W_OK)


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in a shared-memory weight manifest")
    return dtype


def _layout(state: dict[str, torch.Tensor]) -> tuple[list[dict], list[torch.Tensor], int]:
    """(manifest entries, the tensors, total bytes): tied tensors once, each on an ALIGN boundary after the header."""
    entries, tensors, offset, seen = [], [], HEADER, set()
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
    return entries, tensors, offset


def _mapping(segment: Path, size: int) -> torch.Tensor | None:
    """This process's mapping of `segment` (kept open across steps), or None when it is not there at `size`."""
    try:
        stat = segment.stat()
    except FileNotFoundError:
        return None
    if stat.st_size != size:
        return None
    cached = _maps.get(segment)
    if cached is None or cached[:2] != (stat.st_ino, size):
        cached = (stat.st_ino, size, torch.from_file(str(segment), shared=True, size=size, dtype=torch.uint8))
        _maps[segment] = cached
    return cached[2]


def _step_word(buffer: torch.Tensor) -> torch.Tensor:
    return buffer[:8].view(torch.int64)


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Run memory-bound copies on this calling thread's OpenMP team of one (see weights.copy_state for why)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def write_shared(state: dict[str, torch.Tensor], directory: Path, segment_name: str, step: int) -> Path:
    """Copy `state` into segment `segment_name` (reused when it is there at the same size, else created) as `step`,
    and write directory/shared_memory.json describing it. Returns the segment's path."""
    entries, tensors, size = _layout(state)
    segment = SHM_ROOT / segment_name
    buffer = _mapping(segment, size)
    if buffer is None:  # first use: write() fills the new pages in bulk (far faster than faulting them in one by one)
        tmp = segment.with_name(f"{segment.name}.tmp{os.getpid()}")
        with tmp.open("wb") as f:
            f.write(torch.tensor([-1], dtype=torch.int64).numpy().tobytes())
            for entry, tensor in zip(entries, tensors, strict=True):
                f.seek(int(entry["offset"]))
                f.write(tensor.reshape(-1).view(torch.uint8).numpy().data)
            f.truncate(size)
        tmp.replace(segment)  # a reader's mapping of an older segment of that name sees the new inode and remaps
        buffer = _mapping(segment, size)
        assert buffer is not None
    else:
        _step_word(buffer).fill_(-1)
        with one_thread():
            for entry, tensor in zip(entries, tensors, strict=True):
                start = int(entry["offset"])
                buffer[start : start + int(entry["nbytes"])].copy_(tensor.reshape(-1).view(torch.uint8))
    _step_word(buffer).fill_(step)
    manifest = {"segment": segment.name, "bytes": size, "step": step, "tensors": entries}
    (directory / MANIFEST).write_text(json.dumps(manifest))
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
    buffer = _mapping(segment, int(manifest["bytes"]))
    held = int(_step_word(buffer).item()) if buffer is not None else None
    if held != int(manifest["step"]):
        raise ValueError(
            f"shared-memory weights {segment} hold step {held}, not the step {manifest['step']} of {directory}: "
            "the trainer reused the slot for newer weights; load a newer step"
        )
    assert buffer is not None
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
        _maps.pop(segment, None)
