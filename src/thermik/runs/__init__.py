"""Run modes: one builder (build.py), one RL-step core (step.py), one outer loop (loop.py), and the modes that
differ only in where each half of a step runs: local.py (`thermik rl`), ray.py (`thermik rl` with
distributed.enabled), split_trainer.py / split_orchestrator.py (`thermik trainer` / `thermik orchestrator`),
sft.py (`thermik sft`) and eval.py (`thermik eval`)."""
