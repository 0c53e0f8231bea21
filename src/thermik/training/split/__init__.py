"""The split processes `thermik trainer` and `thermik orchestrator` (docs/process_split.md)."""
