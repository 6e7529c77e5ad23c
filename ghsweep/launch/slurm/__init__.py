"""SLURM through submitit: the launchers' launch() (SLURM's, and submitit's local executor, which stands
in for it with the same job records), the jobs a sweep submitted and what each ended with, a job SLURM
requeued, and the tasks of a run on several GPUs (their rendezvous, their reports to rank 0)."""
