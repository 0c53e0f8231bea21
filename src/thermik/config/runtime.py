"""Config sections of how a run executes: evaluation, monitoring, Ray and the split mode."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from thermik.config.base import Section


class EvalConfig(Section):
    every: int = Field(0, ge=0, description="Evaluate on the held-out set every k steps; 0 only before and after.")
    size: int = Field(200, ge=1, description="Held-out problems evaluated.")
    temperature: float = Field(1.0, ge=0, description="Sampling temperature for evaluation; 0 is greedy.")
    k: int = Field(1, ge=1, description="Samples per problem: pass@1, pass@k and avg@k (docs/evaluation.md).")
    before: bool = Field(True, description="Evaluate before training for the before/after table.")


class MonitorConfig(Section):
    progress: bool = Field(True, description="Show a rich progress bar.")
    save_trajectories_every: int = Field(10, ge=0, description="Dump sampled trajectories every k steps; 0 never.")
    tensorboard: bool = Field(False, description="Also write tensorboard events.")
    wandb_project: str = Field("", description="Also log to this wandb project when set.")
    wandb_mode: Literal["offline", "online", "disabled"] = Field(
        "offline", description="wandb mode: offline writes run_dir/wandb/ only (upload later with `wandb sync`)."
    )


class DistributedConfig(Section):
    """Scale-out on Ray (optional extra `distributed`): data-parallel trainer workers and engine actors."""

    enabled: bool = Field(False, description="Train on Ray with the workers and engines below (thermik.distributed).")
    num_trainers: int = Field(1, ge=1, description="Data-parallel trainer workers (Ray actors in one torch group).")
    num_engines: int = Field(
        1, ge=0, description="Inference engine actors (each an embedded engine); 0 when generation runs elsewhere."
    )
    placement: Literal["colocated", "disaggregated"] = Field(
        "disaggregated",
        description="colocated: engine i shares trainer i's placement bundle (devices); "
        "disaggregated: every actor gets its own bundle.",
    )
    strategy: Literal["ddp", "fsdp2"] = Field(
        "ddp", description="Data-parallel wrapper of the policy: DistributedDataParallel or FSDP2 (fully_shard)."
    )
    backend: Literal["gloo", "nccl"] = Field("gloo", description="torch.distributed backend: gloo (CPU) or nccl (GPU).")
    weight_sync: Literal["collective", "files"] = Field(
        "collective",
        description="Trainer -> engine weights: a broadcast in a process group with the engines, "
        "or safetensors files in weights_dir plus update_weights(path).",
    )
    weights_dir: str = Field(
        "", description="Where weight_sync=files writes safetensors (shared by all nodes); empty: <run_dir>/weights."
    )
    cpus_per_actor: float = Field(1.0, gt=0, description="CPUs reserved per trainer worker and per engine actor.")
    gpus_per_actor: float = Field(0.0, ge=0, description="GPUs reserved per trainer worker and per engine actor.")
    engine_max_restarts: int = Field(3, ge=0, description="Times Ray restarts a dead engine actor before giving up.")
    timeout_s: float = Field(300.0, gt=0, description="torch.distributed collective timeout in seconds.")
    ray_address: str = Field(
        "", description="Ray cluster to join ('auto' after `ray start`); empty starts a local one in this process."
    )

    @model_validator(mode="after")
    def _collective_fits_devices(self) -> DistributedConfig:
        if self.backend == "nccl" and self.placement == "colocated" and self.weight_sync == "collective":
            raise ValueError(
                "distributed: NCCL cannot broadcast between two processes on one GPU; with placement='colocated' "
                "and backend='nccl' set weight_sync='files'"
            )
        if self.backend == "nccl" and self.gpus_per_actor <= 0:
            raise ValueError("distributed.backend='nccl' needs GPUs: set distributed.gpus_per_actor > 0")
        return self


class SplitConfig(Section):
    """`thermik trainer` + `thermik orchestrator`: the file protocol between them (docs/process_split.md)."""

    wait_timeout_s: float = Field(
        1800.0,
        gt=0,
        description="Most seconds the trainer waits for a rollout batch, or the orchestrator for weights, before "
        "stopping with an error that names the other process; cover one step of the other side.",
    )
    poll_interval_s: float = Field(
        0.2,
        gt=0,
        description="Seconds between two looks for a new file when no notification arrives (on Linux the side that "
        "publishes notifies the waiting side at once; polling covers a restarted or remote process).",
    )
    weight_transfer: Literal["auto", "shared_memory", "files"] = Field(
        "auto",
        description="How the trainer hands weights to the inference server: 'shared_memory' (a /dev/shm segment and "
        "a small manifest in weights/step_<s>; needs the server on the trainer's machine), 'files' (a safetensors "
        "file in weights/step_<s>, for a server that shares only the run directory), 'auto': shared_memory when "
        "inference.base_url is a loopback address and /dev/shm is there, else files.",
    )
