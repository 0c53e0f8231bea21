"""Record and replay the updates of a local run, for debugging a bad step or bisecting a regression.

`thermik rl --record` (config `record = true`) writes, for every step s, `records/step_<s>/`: the training batch
as the rollout produced it (token ids, rollout logprobs, rewards on their tokens, loss mask, group ids:
`batch.safetensors`), the torch RNG state before the update (`rng.pt`), and in `meta.json` the weight versions
that sampled each trajectory and an exact checksum of every policy tensor after the update.

`thermik replay RUN --from-step S` loads the policy of checkpoint step S (S = 0: `model.path`), re-runs the
recorded updates S+1, S+2, ... from those batches (no engine, no environments) and compares each step's weights
with the recorded checksums: bit for bit on the same machine and thread count.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import torch

from thermik.assembly import components
from thermik.assembly.guards import checksum
from thermik.atomic import publish_dir
from thermik.config import load_config
from thermik.config.schema import RunConfig
from thermik.errors import ThermikError
from thermik.rollout.staleness import is_asynchronous
from thermik.runs.split.protocol import load_batch, save_batch
from thermik.runs.step import Rollout
from thermik.training.batch import TokenBatch
from thermik.training.learner import Learner, build_learner, train_on_batch
from thermik.training.run_checkpoint import restore

RECORDS = "records"
META_FILE = "meta.json"
RNG_FILE = "rng.pt"
Snapshot = tuple[TokenBatch, torch.Tensor, list[list[int]]]
"""The batch before the update, the torch RNG state, the weight versions of each trajectory."""


def weight_checksums(policy: torch.nn.Module) -> dict[str, int]:
    return {name: checksum(tensor) for name, tensor in policy.state_dict().items()}


class Recorder:
    """Writes `records/step_<s>/` around each update of a local run (see the module docstring)."""

    def __init__(self, run_dir: Path) -> None:
        self.root = run_dir / RECORDS

    def before_update(self, rollout: Rollout) -> Snapshot:
        """What the update is about to see (it fills advantages into the batch in place, so a copy)."""
        assert rollout.batch is not None  # rl_step updates only a rollout with a batch
        fields = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in vars(rollout.batch).items()}
        versions = [sorted({v for v in t.all_weight_versions if v >= 0}) for t in rollout.trajs]
        return TokenBatch(**fields), torch.get_rng_state(), versions

    def after_update(self, before: Snapshot, policy: torch.nn.Module, step: int) -> None:
        batch, rng, versions = before
        meta = {"step": step + 1, "weight_versions": versions, "checksums": weight_checksums(policy)}

        def write(tmp: Path) -> None:
            save_batch(batch, tmp)
            torch.save(rng, tmp / RNG_FILE)
            (tmp / META_FILE).write_text(json.dumps(meta))

        publish_dir(self.root / f"step_{step + 1}", write)


def recorded_steps(run_dir: Path) -> list[int]:
    root = run_dir / RECORDS
    return sorted(int(p.name.removeprefix("step_")) for p in root.glob("step_*") if (p / META_FILE).is_file())


def _learner_at(cfg: RunConfig, run_dir: Path, from_step: int) -> Learner:
    components.seed_everything(cfg.seed)
    policy, chat = components.load_policy(cfg.model, cfg.lora, cfg.env.tool_parser)
    learner = build_learner(cfg, policy, chat.tokenizer)
    if from_step:
        checkpoint = run_dir / "checkpoints" / f"step_{from_step}"
        if not checkpoint.is_dir():
            raise FileNotFoundError(f"thermik replay: no checkpoint {checkpoint} to start step {from_step + 1} from")
        restore(learner, checkpoint)
    return learner


def replay(run_dir: Path, from_step: int) -> list[dict[str, Any]]:
    """Re-run the recorded updates after checkpoint `from_step`; one report per step (`mismatched` tensor names)."""
    cfg = load_config(RunConfig, ["@", str(run_dir / "config.toml")], env={})
    steps = [s for s in recorded_steps(run_dir) if s > from_step]
    if not steps or steps[0] != from_step + 1:
        raise ThermikError(f"{run_dir / RECORDS} holds no record of step {from_step + 1}: run `thermik rl --record`")
    learner = _learner_at(cfg, run_dir, from_step)
    reports = []
    for step in steps:
        directory = run_dir / RECORDS / f"step_{step}"
        torch.set_rng_state(torch.load(directory / RNG_FILE))
        asynchronous = is_asynchronous(cfg)
        asyncio.run(train_on_batch(learner, load_batch(directory), step - 1, asynchronous=asynchronous))
        want = json.loads((directory / META_FILE).read_text())["checksums"]
        got = weight_checksums(learner.policy)
        reports.append({"step": step, "mismatched": sorted(k for k in want if got.get(k) != want[k])})
    return reports


def main(argv: list[str]) -> int:
    """`thermik replay RUN_DIR [--from-step S]`: prints one line per step; exit status 1 on any mismatch."""
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: thermik replay RUN_DIR [--from-step S]\n\n" + (__doc__ or ""))
        return 0 if argv else 2
    from_step = int(argv[argv.index("--from-step") + 1]) if "--from-step" in argv else 0
    if not (Path(argv[0]) / "config.toml").is_file():
        raise ThermikError(f"{argv[0]} is not a run directory (no config.toml): pass the --output_dir/--name of a "
                           "`thermik rl --record` run")  # fmt: skip
    reports = replay(Path(argv[0]), from_step)
    for r in reports:
        status = "identical" if not r["mismatched"] else f"DIFFERS in {len(r['mismatched'])} tensors"
        print(f"step {r['step']}: weights {status}{': ' + ', '.join(r['mismatched'][:3]) if r['mismatched'] else ''}")
    bad = sum(bool(r["mismatched"]) for r in reports)
    print(f"replayed {len(reports)} steps from step {from_step}: {len(reports) - bad} identical, {bad} differ")
    sys.stdout.flush()
    return 1 if bad else 0
