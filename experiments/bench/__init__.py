"""Benchmarks, run as scripts (`python3 bench/bench_reward.py`). A package so that the
tests import what they share with the benchmarks (bench.hostile_inputs) by one name."""
