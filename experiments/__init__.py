"""The research workbench: learning runs, time-to-accuracy rows, the TRL row, benches and model
surgery. Not needed to train; its extra requirements are in experiments/requirements.txt."""
