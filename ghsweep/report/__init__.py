"""Reports: each run's markdown report and the sweep's summary table."""
