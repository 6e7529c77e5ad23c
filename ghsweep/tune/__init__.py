"""`hydra/sweeper=tune`: an Optuna study over the knobs of a sweep, its trials run by ghsweep's launchers."""
