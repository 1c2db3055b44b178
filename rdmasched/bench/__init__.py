"""Benchmarks that print figures (never timed tests). `rdmasched bench --help`."""
