"""A few GRPO steps on Ray from a config, then the weight-broadcast time of both sync methods.

    python benchmarks/ray_demo.py @ config.toml --distributed.num_trainers 2 --trainer.steps 3

Rollouts run on the engine actors (through EnginePool), the update on the data-parallel trainer workers.
The step is `thermik rl --distributed.enabled true`'s own (thermik.runs.step.rl_step with thermik.runs.ray.RayMode).
"""

from __future__ import annotations

import asyncio
import statistics
import sys

from thermik.config import load_config
from thermik.config.schema import RunConfig
from thermik.distributed.launch import DistributedRun, start
from thermik.runs.ray import RayMode, setup


async def rl_steps(mode: RayMode) -> list[dict[str, float]]:
    """`thermik rl`'s Ray step (RayMode.step: the one RL step core) trainer.steps times, printed."""
    history = []
    for step in range(mode.cfg.trainer.steps):
        metrics = await mode.step(step)
        history.append(metrics)
        print(
            f"step {step + 1}: reward {metrics['reward/mean']:.3f} loss {metrics['policy/loss']:+.4f} "
            f"grad_norm {metrics['policy/grad_norm']:.3f} generate {metrics['time/generate']:.2f}s "
            f"train {metrics['time/train']:.2f}s weight_sync {metrics['time/weight_sync'] * 1000:.1f}ms "
            f"(version {int(metrics['weights/version'])})",
            flush=True,
        )
    return history


async def weight_sync_times(run: DistributedRun, repeats: int = 5) -> dict[str, float]:
    """Median seconds of one trainer -> engines weight sync per method (the first call, which forms the
    broadcast group, is excluded)."""
    out = {}
    for method in ("collective", "files"):
        await run.sync_weights(method)
        times = [(await run.sync_weights(method))[1] for _ in range(repeats)]
        out[method] = statistics.median(times)
    return out


async def _main(cfg: RunConfig) -> None:
    dist = start(cfg)
    mode = None
    try:
        mode = setup(cfg, dist)
        await rl_steps(mode)
        if cfg.distributed.num_engines:
            for method, seconds in (await weight_sync_times(dist)).items():
                print(f"weight sync {method}: {seconds * 1000:.1f} ms (median of 5)")
    finally:
        if mode is not None:
            await mode.run.close(engine=False)
        dist.shutdown()


def main(argv: list[str] | None = None) -> int:
    cfg = load_config(RunConfig, sys.argv[1:] if argv is None else argv)
    asyncio.run(_main(cfg))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
