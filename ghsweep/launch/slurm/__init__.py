"""SLURM: the submitit launchers, the jobs a sweep submitted and their ends, a requeued job, a run's tasks."""
