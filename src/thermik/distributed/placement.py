"""Where trainer workers and engine actors run: one Ray placement group, bundles chosen by placement mode.

- disaggregated: one bundle per trainer worker, then one per engine; every actor owns its devices.
- colocated: one bundle per trainer worker; engine i shares bundle i % num_trainers with trainer i, each
  taking half of the bundle's resources (engines sleep while the trainer trains; SkyRL's colocate_all).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from thermik.config.schema import DistributedConfig


@dataclass(frozen=True)
class ActorSlot:
    """The bundle an actor is placed in and the resources it reserves from it."""

    bundle_index: int
    num_cpus: float
    num_gpus: float


@dataclass(frozen=True)
class PlacementPlan:
    bundles: list[dict[str, float]]
    trainers: list[ActorSlot]
    engines: list[ActorSlot]
    strategy: str


def plan_placement(cfg: DistributedConfig) -> PlacementPlan:
    cpu, gpu = cfg.cpus_per_actor, cfg.gpus_per_actor
    bundle = {"CPU": cpu, **({"GPU": gpu} if gpu else {})}
    if cfg.placement == "colocated":
        half = ActorSlot(0, cpu / 2, gpu / 2)
        trainers = [ActorSlot(i, half.num_cpus, half.num_gpus) for i in range(cfg.num_trainers)]
        engines = [ActorSlot(i % cfg.num_trainers, half.num_cpus, half.num_gpus) for i in range(cfg.num_engines)]
        return PlacementPlan([dict(bundle) for _ in trainers], trainers, engines, strategy="PACK")
    trainers = [ActorSlot(i, cpu, gpu) for i in range(cfg.num_trainers)]
    engines = [ActorSlot(cfg.num_trainers + i, cpu, gpu) for i in range(cfg.num_engines)]
    return PlacementPlan([dict(bundle) for _ in range(len(trainers) + len(engines))], trainers, engines, "PACK")


def create_placement_group(plan: PlacementPlan, timeout_s: float = 60.0) -> Any:
    """Reserve the bundles; fails with the resources asked for and those the cluster has."""
    import ray
    from ray.util.placement_group import placement_group

    pg = placement_group(plan.bundles, strategy=plan.strategy)
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready:
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(pg)
        raise RuntimeError(
            f"Ray could not reserve {len(plan.bundles)} bundles of {plan.bundles[0]} within {timeout_s:.0f} s "
            f"(cluster has {ray.cluster_resources()}); lower distributed.cpus_per_actor / gpus_per_actor, "
            "num_trainers or num_engines, or add nodes"
        )
    return pg


def actor_options(slot: ActorSlot, pg: Any, **extra: Any) -> dict[str, Any]:
    """`ActorClass.options(...)` arguments that pin an actor to its bundle."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    strategy = PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=slot.bundle_index)
    return {"num_cpus": slot.num_cpus, "num_gpus": slot.num_gpus, "scheduling_strategy": strategy, **extra}
