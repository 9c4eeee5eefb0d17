"""Every training command in the README parses into a consistent GRPOConfig.

The GPU commands cannot run here (no GPU, no SGLang); this checks what can be checked on CPU:
the overrides exist, the YAML resolves, and the allocation adds up.
"""

import shlex

import pytest

from devkit import ROOT

PREFIXES = ("python3 train.py ", "python3 -m areal.infra.launcher.")


def readme_training_commands() -> list[str]:
    """The README's training commands, each on one line (`\\` continuations joined)."""
    lines = (ROOT / "README.md").read_text().replace("\\\n", " ").splitlines()
    return [" ".join(ln.split()) for ln in lines if ln.strip().startswith(PREFIXES)]


def test_the_demo_runs_the_readmes_first_training_command():
    """`make demo` is that command plus the CPU overrides of devkit/launch/training.py, applied after it."""
    from devkit.launch import training

    assert readme_training_commands()[0] == " ".join(["python3", *training.user_command("single")[1:]])


def parse(command: str):
    from omegaconf import OmegaConf

    from areal.api.cli_args import parse_cli_args, to_structured_cfg

    from train import CountDownConfig

    args = shlex.split(command)
    args = args[args.index("--config") :]
    args[1] = str(ROOT / args[1])
    cfg, _ = parse_cli_args(args)
    return OmegaConf.to_object(to_structured_cfg(cfg, CountDownConfig))


def test_readme_shows_every_launch_mode():
    commands = readme_training_commands()
    assert any("scheduler.type=local" in c for c in commands)
    for launcher in ("local", "ray", "slurm"):
        assert any(f"areal.infra.launcher.{launcher} train.py" in c for c in commands)
    assert len(commands) >= 7


@pytest.mark.parametrize("command", readme_training_commands())
def test_readme_command_parses_and_allocation_adds_up(command):
    from areal.api.alloc_mode import ModelAllocation


    config = parse(command)
    assert config.scheduler.type in ("local", "ray", "slurm")
    assert config.allocation_mode == f"{config.rollout.backend}+{config.actor.backend}"
    used = sum(
        ModelAllocation.from_str(b).parallel.world_size for b in (config.rollout.backend, config.actor.backend)
    )
    available = config.cluster.n_nodes * config.cluster.n_gpus_per_node
    assert used <= available or (used == 2 and available == 1)  # 1 GPU: SGLang and FSDP share it
    assert config.actor.reward_norm.group_size == config.gconfig.n_samples
    assert config.actor.attn_impl == "sdpa" and config.actor.weight_update_mode == "disk"
    kept = config.actor.layers_not_checkpointed
    assert isinstance(kept, int) and kept >= 0
    if ModelAllocation.from_str(config.actor.backend).parallel.world_size == 1:
        assert kept == 0  # one trainer GPU holds all the optimizer state: no room for kept activations
