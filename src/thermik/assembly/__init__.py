"""Run assembly: the pieces a run is built from (policy, engine, environments, datasets) and the consistency guards
that watch an engine against the trainer. Above `training` and `rollout`, below `distributed` and `runs`."""
