"""areal_patches/callback_pool: a rollout worker's completion posts no longer fill the thread
pool its weight load needs while the controller's callback server is busy with a push.

AReaL's real `BatchTaskDispatcher._send_callback` posts to a real single-threaded werkzeug
server, started as `RolloutController` starts its callback server (`threaded=False`). Mocked,
and said so: the push that keeps that server busy (a first request whose handler waits until
the test releases it, as the "update weights" callback waits for the workers' load) and the
load itself (a task in the default pool, where `RemoteInfEngine.update_weights_from_disk`
submits it). Runs in a fresh interpreter: the pools are per process.
"""

import pytest

pytestmark = pytest.mark.e2e  # one AReaL engine in a process of its own (the `single_rank` fixture)

SCRIPT = r"""
import json, logging, sys, threading, time
sys.path.insert(0, sys.argv[1])
import requests
from flask import Flask
from werkzeug.serving import make_server
from areal.infra.utils.concurrent import get_executor
from areal.infra.workflow_executor import BatchTaskDispatcher

from areal_patches import callback_pool


class Worker:  # what _send_callback reads of a BatchTaskDispatcher
    logger = logging.getLogger("worker")


def push_with_four_completions():
    # The controller's callback server, busy with a push until `release` is set.
    release, served = threading.Event(), []
    app = Flask(__name__)

    @app.route("/callback/update_weights_disk", methods=["POST"])
    def update_weights():
        release.wait()
        return {"status": "ok"}

    @app.route("/callback/rollout_complete", methods=["POST"])
    def rollout_complete():
        served.append(1)
        return {"status": "ok"}

    server = make_server("127.0.0.1", 0, app, threaded=False)  # port 0: the OS picks a free one
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}/callback"
    threading.Thread(target=requests.post, args=(f"{base}/update_weights_disk",), daemon=True).start()
    time.sleep(0.5)  # the push's callback is being served
    for task_id in range(4):
        BatchTaskDispatcher._send_callback(Worker(), f"{base}/rollout_complete", task_id, None)
    time.sleep(0.5)
    loaded = threading.Event()
    get_executor().submit(loaded.set)  # the worker's weight load
    load_ran = loaded.wait(timeout=3)
    release.set()  # the push ends; the server answers what waited
    deadline = time.time() + 10
    while len(served) < 4 and time.time() < deadline:
        time.sleep(0.05)
    server.shutdown()
    return {"load_ran_during_push": load_ran, "completions_served": len(served)}


result = {"upstream": push_with_four_completions()}
callback_pool.install()
result["patched"] = push_with_four_completions()
print("RESULT " + json.dumps(result))
"""


@pytest.fixture(scope="module")
def pushes(single_rank):
    return single_rank(SCRIPT)


def test_upstream_queues_the_load_behind_the_waiting_posts(pushes):
    """The premise (if AReaL gives the posts a pool of their own, drop the module)."""
    assert pushes["upstream"] == {"load_ran_during_push": False, "completions_served": 4}


def test_the_load_runs_while_the_posts_wait_and_every_completion_arrives(pushes):
    assert pushes["patched"] == {"load_ran_during_push": True, "completions_served": 4}
