"""Config: validation of a composed run config before any training starts."""
