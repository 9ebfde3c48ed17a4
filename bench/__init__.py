"""Benchmark suite for jobrunner (see bench/README.md)."""
