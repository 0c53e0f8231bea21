"""torch.distributed plumbing: free ports, the trainers' default group, and standalone broadcast groups.

The weight-broadcast group (trainer rank 0 + every engine actor) is a second process group built directly on
its own TCPStore: `torch.distributed.new_group` would need every trainer rank, and the engines are not
members of the trainers' default group.
"""

from __future__ import annotations

import datetime
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

Backend = str  # "gloo" | "nccl"


def node_ip() -> str:
    """This node's IP as Ray sees it (loopback when Ray is absent)."""
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:
        return "127.0.0.1"


def free_port() -> int:
    """A TCP port free on this node now (the OS picks it; a short race with other programs remains)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def endpoint() -> tuple[str, int]:
    """(address, port) for a rendezvous hosted by the calling process."""
    return node_ip(), free_port()


def init_default_group(backend: Backend, rank: int, world_size: int, addr: str, port: int, timeout_s: float) -> None:
    """The trainers' data-parallel group (MASTER_ADDR/PORT chosen by rank 0's node, handed out by the driver)."""
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = addr, str(port)
    dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s))


def device_for(backend: Backend, configured: str) -> torch.device:
    """NCCL ranks use the GPU Ray assigned (CUDA_VISIBLE_DEVICES makes it cuda:0); gloo uses the model config."""
    return torch.device("cuda", 0) if backend == "nccl" else torch.device(configured)


@dataclass
class BroadcastGroup:
    """A process group of `size` members used only to broadcast from member 0."""

    group: dist.ProcessGroup
    rank: int
    size: int
    store: dist.Store  # the group reaches its peers through it: keep it alive as long as the group

    @classmethod
    def join(cls, backend: Backend, addr: str, port: int, rank: int, size: int, timeout_s: float) -> BroadcastGroup:
        """Blocks until all `size` members joined; member 0 hosts the store at addr:port."""
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore(addr, port, size, rank == 0, timeout=timeout)
        prefixed = dist.PrefixStore("thermik_weights", store)
        if backend == "nccl":
            group: dist.ProcessGroup = dist.ProcessGroupNCCL(prefixed, rank, size)
        elif backend == "gloo":
            group = dist.ProcessGroupGloo(prefixed, rank, size, timeout)
        else:
            raise ValueError(f"unknown backend {backend!r}; valid: 'gloo', 'nccl'")
        return cls(group, rank, size, store)

    def broadcast(self, tensor: torch.Tensor) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.group.broadcast([tensor], opts).wait()


WeightSpec = list[tuple[str, tuple[int, ...], str]]
"""(name, shape, dtype name) of every tensor in a state dict, in state-dict order."""


def weight_spec(state: dict[str, torch.Tensor]) -> WeightSpec:
    return [(name, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for name, t in state.items()]


def _dtype_groups(spec: WeightSpec) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for i, (_, _, dtype) in enumerate(spec):
        groups.setdefault(dtype, []).append(i)
    return groups


def send_state(group: BroadcastGroup, state: dict[str, torch.Tensor], device: torch.device) -> None:
    """Broadcast a state dict as one flat buffer per dtype (few large messages instead of one per tensor)."""
    tensors = list(state.values())
    for indices in _dtype_groups(weight_spec(state)).values():
        flat = torch.cat([tensors[i].reshape(-1).to(device) for i in indices])
        group.broadcast(flat)


def receive_state(group: BroadcastGroup, spec: WeightSpec, device: torch.device) -> dict[str, torch.Tensor]:
    """The receiving side of `send_state`: rebuilds the state dict described by `spec`."""
    out: dict[str, torch.Tensor] = {}
    for dtype, indices in _dtype_groups(spec).items():
        shapes: Sequence[tuple[int, ...]] = [spec[i][1] for i in indices]
        numel = [int(torch.Size(s).numel()) for s in shapes]
        flat = torch.empty(sum(numel), dtype=getattr(torch, dtype), device=device)
        group.broadcast(flat)
        for i, piece, shape in zip(indices, flat.split(numel), shapes, strict=True):
            out[spec[i][0]] = piece.view(shape)
    return out
