"""Benchmarks, run as scripts (`python3 experiments/bench/bench_reward.py`). A package so that the
tests import what they share with the benchmarks (experiments.bench.hostile_inputs) by one name."""
