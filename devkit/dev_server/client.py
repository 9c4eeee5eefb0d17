"""Starting, stopping and calling a dev server from scripts and tests; imports no torch.

    from devkit.dev_server.client import http_json, serve
    with serve("models/tiny-qwen2") as addr:                 # "127.0.0.1:PORT"
        out = http_json(addr, "/generate", {"input_ids": [1, 2, 3]})

    serve(model_path, port=None, **DevServer kwargs)  -> context manager yielding "host:port"
    DevServer(model_path, port=None, host="127.0.0.1", device="cpu", dtype="float32",
              max_batch=64, seed=0, timeout=120.0, log_file=None, extra_args=(),
              python=None, env=None)      .start() .stop() .command() .addr .pid .log_file, a context manager
    http_json(addr, endpoint, payload=None, method=None, timeout=60) -> body (HTTPStatusError
              unless 200);  http_request(...) -> (status, body)

``serve()`` / ``DevServer`` start the server (``python3 -m devkit.dev_server``) as a subprocess in
its own session with stdout+stderr going to a log file, wait until ``/health`` answers, and
stop the whole process group on exit (context manager and atexit). The server also exits by
itself when its parent process dies (``--parent-pid``, set by the helpers).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from devkit import ROOT  # on the server's PYTHONPATH: `-m devkit.dev_server`
from devkit.processes import find_free_port, stop_group, tail


class HTTPStatusError(RuntimeError):
    """A non-200 answer from http_json(); ``status`` and ``body`` hold the details."""

    def __init__(self, url: str, status: int, body: Any):
        super().__init__(f"{url} answered HTTP {status}: {body}")
        self.status, self.body = status, body


def http_request(addr: str, endpoint: str, payload: dict | None = None,
                 method: str | None = None, timeout: float = 60.0) -> tuple[int, Any]:
    """Tiny stdlib JSON HTTP call: ``(status, decoded body)`` for any status.

    GET without a payload, POST with one (unless ``method`` says otherwise). Raises
    OSError (URLError, ConnectionRefusedError, timeout) when nothing answers.
    """
    method = method or ("GET" if payload is None else "POST")
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(f"http://{addr}{endpoint}", data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        raw, status = e.read(), e.code
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


def http_json(addr: str, endpoint: str, payload: dict | None = None,
              method: str | None = None, timeout: float = 60.0) -> Any:
    """Like http_request() but returns just the body, raising HTTPStatusError unless 200."""
    status, body = http_request(addr, endpoint, payload, method, timeout)
    if status != 200:
        raise HTTPStatusError(f"http://{addr}{endpoint}", status, body)
    return body


class _PortTaken(Exception):
    pass


class DevServer:
    """A dev_server subprocess. Use as a context manager, or call start() / stop().

    The server runs in its own session (process group) and is killed with its whole
    group by stop(), at interpreter exit, and, through ``--parent-pid``, by itself when
    this process dies without cleaning up. Its stdout+stderr go to ``log_file`` or, by
    default, to a temporary ``dev_server-PORT-*.log`` that is deleted when the context
    manager exits normally and kept (and named in the error) when something failed.
    """

    def __init__(self, model_path: str | os.PathLike, port: int | None = None,
                 host: str = "127.0.0.1", device: str | None = "cpu", dtype: str = "float32",
                 max_batch: int = 64, seed: int = 0, timeout: float = 120.0,
                 log_file: str | os.PathLike | None = None, extra_args: list[str] | tuple = (),
                 python: str | None = None, env: dict | None = None):
        # absolute, so the server does not depend on our working directory
        self.model_path = os.path.abspath(model_path) if os.path.exists(model_path) else str(model_path)
        self.host = host
        self.requested_port = port
        self.port: int | None = None
        self.device, self.dtype, self.max_batch, self.seed = device, dtype, max_batch, seed
        self.timeout = timeout
        self.log_file = Path(log_file).absolute() if log_file else None
        self.extra_args = list(extra_args)
        self.python = python or sys.executable
        self.env = env
        self.proc: subprocess.Popen | None = None
        self._auto_log = False

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def command(self) -> list[str]:
        """The command that starts the server. Override it to run another server that speaks
        SGLang's protocol (evaluate.py runs SGLang itself) under the same process handling:
        its own process group, the /health wait, the kill on exit."""
        cmd = [self.python, "-m", "devkit.dev_server", "--model", self.model_path,
               "--host", self.host, "--port", str(self.port), "--dtype", self.dtype,
               "--max-batch", str(self.max_batch), "--seed", str(self.seed),
               "--parent-pid", str(os.getpid())]
        if self.device:
            cmd += ["--device", self.device]
        return cmd + self.extra_args

    def start(self) -> DevServer:
        attempts = 1 if self.requested_port else 3  # a free port can be taken meanwhile
        self._auto_log = self.log_file is None
        for _ in range(attempts):
            self._launch()
            try:
                self._wait_healthy()
                return self
            except _PortTaken:
                self.stop()
            except BaseException:
                self.stop()
                raise
        raise RuntimeError(f"dev server could not bind {self.addr}; log: {self.log_file}")

    def _launch(self) -> None:
        """Start the server process on a port (a free one unless one was asked for)."""
        self.port = self.requested_port or find_free_port(self.host)
        if self._auto_log:
            fd, name = tempfile.mkstemp(prefix=f"dev_server-{self.port}-", suffix=".log")
            os.close(fd)
            self.log_file = Path(name)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ if self.env is None else self.env)
        env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        with open(self.log_file, "ab") as log:
            self.proc = subprocess.Popen(
                self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, env=env,
            )
        atexit.register(self.stop)

    def _log_tail(self) -> str:
        try:
            return tail(Path(self.log_file).read_text(errors="replace"))
        except OSError:
            return ""

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                log_tail = self._log_tail()
                if "address already in use" in log_tail.lower() and not self.requested_port:
                    raise _PortTaken()
                raise RuntimeError(
                    f"dev server for {self.model_path} at {self.addr} exited with code {rc} "
                    f"before becoming healthy; log: {self.log_file}\n{log_tail}")
            try:
                status, _ = http_request(self.addr, "/health", timeout=2)
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(
            f"dev server at {self.addr} not healthy after {self.timeout:.0f}s; "
            f"log: {self.log_file}\n{self._log_tail()}")

    def stop(self, timeout: float = 10.0, keep_log: bool = True) -> None:
        """SIGTERM the process group, SIGKILL it if still alive after `timeout` s.

        ``keep_log=False`` deletes the log file if it was a temporary one made by start().
        """
        proc, self.proc = self.proc, None
        atexit.unregister(self.stop)
        if proc is not None:
            stop_group(proc, timeout)
        if not keep_log and self._auto_log and self.log_file is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.log_file)

    def __enter__(self) -> DevServer:
        return self.start() if self.proc is None else self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.stop(keep_log=exc_type is not None)  # a temporary log is kept only on errors


@contextlib.contextmanager
def serve(model_path: str | os.PathLike, port: int | None = None, **kwargs) -> Iterator[str]:
    """Start a dev server, yield its address ``"host:port"``, stop it for sure on exit.

    ``kwargs`` go to ``DevServer`` (host, device, dtype, max_batch, seed, timeout,
    log_file, extra_args). Raises TimeoutError / RuntimeError naming the address and
    the log file if the server does not become healthy.
    """
    server = DevServer(model_path, port=port, **kwargs)
    server.start()
    ok = False
    try:
        yield server.addr
        ok = True
    finally:
        server.stop(keep_log=not ok)  # a temporary log is kept only on errors
