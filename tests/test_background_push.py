"""areal_patches/background_push: under the SPMD launchers a disk weight push returns to the
trainer once the weights are copied to host memory; the folder, the record and the servers'
load follow in a thread, and the rollout client's new version waits for that load.

AReaL's real `FSDPEngine._update_weights_from_disk` (patched), `RemoteInfEngine.set_version`
(patched) and name_resolve record run, as the only rank of a gloo process group. What cannot run
in a unit test is mocked: the model's `save_pretrained` (it blocks until the script lets it go,
and records whether the servers were paused) and the servers' HTTP side (pause, load and
continue are recorded; the load waits for the trainer's record under the client's own version,
as `RemoteInfEngine.update_weights_from_disk` does).
"""

import pytest

pytestmark = pytest.mark.e2e  # one AReaL engine in a process of its own (the `single_rank` fixture)

SCRIPT = r"""
import json, os, sys, threading, time
from concurrent.futures import Future
sys.path.insert(0, sys.argv[1])
import torch
import torch.distributed as dist
from areal.api.cli_args import NameResolveConfig
from areal.api.io_struct import WeightUpdateMeta
from areal.engine.fsdp_engine import FSDPEngine
from areal.infra.remote_inf_engine import RemoteInfEngine
from areal.utils import name_resolve, names

from areal_patches import background_push

dist.init_process_group("gloo")
name_resolve.reconfigure(NameResolveConfig(type="nfs", nfs_record_root=sys.argv[2]))
background_push.install()
background_push.install()  # idempotent
os.environ["AREAL_SPMD_MODE"] = "1"


class Client:
    # The rollout client: AReaL's set_version (patched) on its own lock and version; the servers mocked.
    set_version = RemoteInfEngine.set_version
    get_version = RemoteInfEngine.get_version

    def __init__(self, events):
        self.lock, self._version, self.events, self.paused = threading.Lock(), 0, events, False

    def pause_generation(self):
        self.events.append("pause")
        self.paused = True

    def continue_generation(self):
        self.events.append("continue")
        self.paused = False

    def update_weights_from_disk(self, meta):
        version, loaded = self.get_version(), Future()
        self.events.append(f"load requested (client at v{version})")

        def load():
            name_resolve.wait(names.update_weights_from_disk("exp", "trial", version), timeout=30)
            self.events.append(f"loaded {meta.path}")
            loaded.set_result(None)

        threading.Thread(target=load).start()
        return loaded


class Model(torch.nn.Linear):
    def __init__(self, engine):
        super().__init__(4, 4)
        self.engine, self.go, self.fails = engine, threading.Event(), False

    def save_pretrained(self, path, state_dict):
        self.go.wait(30)
        state = "paused" if self.engine.rollout_engine.paused else "generating"
        self.engine.events.append(f"save {path} (servers {state}, {len(state_dict)} tensors)")
        if self.fails:
            raise OSError("disk full")


class Engine:
    # What the push reads of an FSDPEngine.
    class config:
        experiment_name, trial_name, use_lora = "exp", "trial", False

    class model_config:
        @staticmethod
        def save_pretrained(path):
            pass

    tokenizer = processor = cpu_group = None

    def __init__(self):
        self.events, self.version = [], 0
        self.rollout_engine = Client(self.events)
        self.model = Model(self)

    def get_version(self):
        return self.version

    def _cast_to_compute_dtype(self, value):
        return value

    def _save_model_to_hf(self, path, tokenizer, processor):  # upstream's save, which the single controller keeps
        self.events.append(f"upstream save {path}")


def push(engine, version, fails=False):
    engine.model.fails = fails
    engine.model.go.clear()
    start = time.monotonic()
    FSDPEngine._update_weights_from_disk(engine, WeightUpdateMeta(type="disk", path=f"/w/v{version}", version=version))
    returned = time.monotonic() - start
    engine.events.append("trainer goes on")
    engine.version = version  # the trainer's actor.set_version
    engine.rollout_engine.set_version(version)  # the trainer's rollout.set_version: held until the load
    held_at = engine.rollout_engine.get_version()
    engine.model.go.set()
    try:
        background_push.IN_FLIGHT.wait()
        error = None
    except RuntimeError as e:
        error = str(e)
    return {"events": list(engine.events), "returned_s": returned, "client_version_held": held_at,
            "client_version_after": engine.rollout_engine.get_version(), "error": error}


engine = Engine()
result = {"first": push(engine, 1)}
engine.events.clear()
result["second"] = push(engine, 2)
engine.events.clear()
result["fails"] = push(engine, 3, fails=True)

del os.environ["AREAL_SPMD_MODE"]  # the single controller: the push ends within the call, as upstream's
engine = Engine()
engine.version = engine.rollout_engine._version = 10  # a record name the pushes above have not used
engine.model.go.set()
FSDPEngine._update_weights_from_disk(engine, WeightUpdateMeta(type="disk", path="/w/sc", version=1))
result["single controller"] = list(engine.events)
print("RESULT " + json.dumps(result))
"""


@pytest.fixture(scope="module")
def pushes(single_rank, tmp_path_factory):
    return single_rank(SCRIPT, tmp_path_factory.mktemp("name_resolve"))


def test_the_trainer_goes_on_before_the_folder_is_written(pushes):
    first = pushes["first"]
    assert first["events"][0] == "trainer goes on"
    assert first["returned_s"] < 10  # the save was blocked for up to 30 s: the call did not wait for it


def test_the_servers_load_each_version_in_order_and_the_client_version_follows_the_load(pushes):
    for version, key in [(1, "first"), (2, "second")]:
        run = pushes[key]
        assert run["events"] == [
            "trainer goes on",
            f"save /w/v{version} (servers generating, 2 tensors)",
            "pause",
            f"load requested (client at v{version - 1})",
            f"loaded /w/v{version}",
            "continue",
        ]
        assert run["client_version_held"] == version - 1  # the trainer's set_version waited for the load
        assert run["client_version_after"] == version and run["error"] is None


def test_a_failed_push_is_raised_where_the_trainer_waits_and_sets_no_version(pushes):
    failed = pushes["fails"]
    assert failed["events"] == ["trainer goes on", "save /w/v3 (servers generating, 2 tensors)"]
    assert "weight version 3" in failed["error"] and "disk full" in failed["error"]
    assert failed["client_version_after"] == 2


def test_under_the_single_controller_the_push_ends_within_the_call(pushes):
    assert pushes["single controller"] == [
        "pause", "load requested (client at v10)", "upstream save /w/sc", "loaded /w/sc", "continue",
    ]  # fmt: skip
