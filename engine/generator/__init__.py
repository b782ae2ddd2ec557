"""Dynamic generator: jobs, scheduling, sampling."""
