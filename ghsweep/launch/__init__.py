"""Launch: the Hydra job that runs one combination, its worker process, and the sweep callbacks."""
