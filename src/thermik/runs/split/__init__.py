"""The split run mode (docs/process_split.md): `thermik inference`, `thermik trainer` and `thermik orchestrator` as
three processes of one config. launch.py starts all three (`thermik rl --split`), trainer.py and orchestrator.py are
the two sides of the RL step, protocol.py the files in the run directory between them."""
