"""Run modes: one builder (build.py), one RL-step core (step.py), one outer loop (loop.py), and the modes that
differ only in where each half of a step runs: local.py (`thermik rl`), ray.py (`thermik rl` with
distributed.enabled), the split/ subpackage (`thermik rl --split`: launch.py starts the three processes, trainer.py
and orchestrator.py are `thermik trainer` / `thermik orchestrator`, protocol.py the files between them),
sft.py (`thermik sft`) and eval.py (`thermik eval`)."""
