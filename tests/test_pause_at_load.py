"""areal_patches/pause_at_load: a disk weight push pauses the servers after the trainer has
saved the new weights, not before, so generation goes on through the save.

AReaL's real `FSDPEngine._update_weights_from_disk` runs, as the only rank of a gloo process
group, with its real name_resolve record. What cannot run in a unit test is mocked: the FSDP
model's save (it records whether the servers were paused while it ran) and the servers (they
record pause, load and continue; their load waits for the trainer's "weights saved" record,
as `RemoteInfEngine.update_weights_from_disk` does).
"""

import pytest

pytestmark = pytest.mark.e2e  # one AReaL engine in a process of its own (the `single_rank` fixture)

SCRIPT = r"""
import json, sys, threading
from concurrent.futures import Future
sys.path.insert(0, sys.argv[1])
import torch.distributed as dist
from areal.api.cli_args import NameResolveConfig
from areal.api.io_struct import WeightUpdateMeta
from areal.engine.fsdp_engine import FSDPEngine
from areal.utils import name_resolve, names

from areal_patches import pause_at_load

dist.init_process_group("gloo")
name_resolve.reconfigure(NameResolveConfig(type="nfs", nfs_record_root=sys.argv[2]))
VERSION = 0


class Servers:
    def __init__(self, events):
        self.events, self.paused = events, False

    def pause_generation(self):
        self.events.append("pause")
        self.paused = True

    def continue_generation(self):
        self.events.append("continue")
        self.paused = False

    def update_weights_from_disk(self, meta):
        self.events.append("load requested")
        loaded = Future()

        def load():
            name_resolve.wait(names.update_weights_from_disk("exp", "trial", VERSION), timeout=30)
            self.events.append(f"loaded {meta.path}")
            loaded.set_result(None)

        threading.Thread(target=load).start()
        return loaded


class Engine:
    # What _update_weights_from_disk reads of an FSDPEngine.
    class config:
        experiment_name, trial_name = "exp", "trial"

    tokenizer = processor = cpu_group = None

    def __init__(self, events, save_fails=False):
        self.events, self.save_fails = events, save_fails
        self.rollout_engine = Servers(events)

    def get_version(self):
        return VERSION

    def _save_model_to_hf(self, path, tokenizer, processor):
        state = "paused" if self.rollout_engine.paused else "generating"
        self.events.append(f"save {path} (servers {state})")
        if self.save_fails:
            raise OSError("disk full")


def push(save_fails=False):
    global VERSION
    VERSION += 1
    events = []
    engine = Engine(events, save_fails)
    servers = engine.rollout_engine
    try:
        FSDPEngine._update_weights_from_disk(engine, WeightUpdateMeta(type="disk", path=f"/w/v{VERSION}"))
    except OSError as error:
        events.append(f"raised {error}")
    restored = engine.rollout_engine is servers and "_save_model_to_hf" not in vars(engine)
    return {"events": events, "paused_after": servers.paused, "engine_restored": restored}


result = {"upstream": push()}
pause_at_load.install()
pause_at_load.install()  # idempotent: wraps AReaL's method once
result["patched"] = push()
result["patched, save fails"] = push(save_fails=True)
print("RESULT " + json.dumps(result))
"""


@pytest.fixture(scope="module")
def pushes(single_rank, tmp_path_factory):
    return single_rank(SCRIPT, tmp_path_factory.mktemp("name_resolve"))


def test_upstream_pauses_the_servers_for_the_whole_save(pushes):
    """The premise (if AReaL changes this order, drop the module)."""
    assert pushes["upstream"]["events"] == [
        "pause", "load requested", "save /w/v1 (servers paused)", "loaded /w/v1", "continue",
    ]  # fmt: skip


def test_the_servers_generate_through_the_save_and_pause_for_the_load(pushes):
    patched = pushes["patched"]
    assert patched["events"] == [
        "save /w/v2 (servers generating)", "pause", "load requested", "loaded /w/v2", "continue",
    ]  # fmt: skip
    assert not patched["paused_after"] and patched["engine_restored"]


def test_a_failed_save_raises_and_leaves_the_servers_generating(pushes):
    failed = pushes["patched, save fails"]
    assert failed["events"] == ["save /w/v3 (servers generating)", "raised disk full"]
    assert not failed["paused_after"] and failed["engine_restored"]
