"""The development kit: what runs, tests and demonstrates the example without a GPU cluster.

`dev_server/` stands in for SGLang, `launch/` starts runs (clusters, preflight checks), and the
tools build models (`make_tiny_model`, `smollm2`) and run the CPU demo (`demo`).
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the repository: train.py, train_config.yaml, runs/
