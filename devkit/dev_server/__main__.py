"""The server process: ``python3 -m devkit.dev_server --model PATH [options]`` (see --help).

Loads the model, starts the scheduler's worker and serves the HTTP app until SIGTERM or
SIGINT (or the death of ``--parent-pid``), then aborts the running batch, answers queued
requests with ``abort`` and exits with status 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import threading
import time

from devkit.dev_server.app import create_app, serve_http
from devkit.dev_server.scheduler import Scheduler

logger = logging.getLogger("dev_server")


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python3 -m devkit.dev_server",
        description="Development server speaking SGLang's HTTP protocol (subset used by AReaL).",
    )
    p.add_argument("--model", required=True, help="Hugging Face model folder")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    p.add_argument("--max-batch", type=int, default=64, help="most requests per static batch")
    p.add_argument("--batch-wait-ms", type=float, default=100.0,
                   help="longest wait for more requests before starting a batch (the wait "
                   "ends earlier once no new request arrived for 20 ms)")
    p.add_argument("--decoder", choices=["auto", "hf", "static"], default="auto",
                   help="hf: transformers' forward and KV cache, every step launched from "
                   "Python; static: devkit/dev_server/static_decode.py (Qwen2 and Llama; preallocated KV cache, "
                   "CUDA graphs on a GPU); auto (default): static on a GPU when the model "
                   "allows it, else hf")
    p.add_argument("--batching", choices=["continuous", "static"], default="continuous",
                   help="with the static decoder: continuous (default: requests join the running "
                   "batch and are answered as they finish, as in SGLang) or static (each batch "
                   "runs to its longest completion before the next starts; always so with hf)")
    p.add_argument("--static-max-len", type=int, default=1024,
                   help="static decoder: longest prompt + max_new_tokens it holds (longer "
                   "batches fall back to hf); its KV cache is sized max-batch x this")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default on CPU: 1; more help only larger models "
                   "on idle cores, oversubscribed cores are very slow)")
    p.add_argument("--step-delay-ms", type=float, default=0.0,
                   help="sleep this long after every decode step (a testing aid: makes "
                   "requests long enough to pause or abort them mid-flight)")
    p.add_argument("--parent-pid", type=int, default=None,
                   help="exit when this process (our parent) dies; set by serve()")
    p.add_argument("--log-level", default="INFO")
    return p


def configure_logging(level: str, port: int) -> None:
    """The server's own logger, not the root one: run in SGLang's place, the process has
    imported AReaL's packages first, and the root logger this one reports to is not
    logging.root any more. Lines name the port: a run with several servers logs them all
    to one file."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"%(asctime)s dev_server[{port}] %(levelname)s %(message)s"))
    logger.handlers, logger.propagate = [handler], False
    logger.setLevel(level.upper())


def watch_parent(parent_pid: int, on_orphan) -> None:
    """Exit when the process that started us is gone (covers SIGKILL of the parent)."""

    def run() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent_pid:
                logger.warning("parent process %d is gone; shutting down", parent_pid)
                on_orphan()
                time.sleep(10)
                os._exit(1)

    threading.Thread(target=run, name="parent-watch", daemon=True).start()


def load_engine(args: argparse.Namespace):
    """The engine for `args`, its load logged with the weights' fingerprint."""
    import torch

    from devkit.dev_server.engine import Engine

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.threads or device == "cpu":
        torch.set_num_threads(args.threads or 1)
    t0 = time.perf_counter()
    engine = Engine(args.model, device=device, dtype=args.dtype, seed=args.seed,
                    step_delay_s=args.step_delay_ms / 1000, decoder=args.decoder,
                    max_batch=args.max_batch, static_max_len=args.static_max_len)
    n_params = sum(p.numel() for p in engine.model.parameters())
    logger.info("loaded %s (%.2f M params) on %s/%s in %.1fs (fingerprint=%.6f)", args.model,
                n_params / 1e6, device, args.dtype, time.perf_counter() - t0,
                engine.fingerprint(engine.model))
    return engine


def main(argv: list[str] | None = None) -> int:
    args = build_arg_parser().parse_args(argv)
    configure_logging(args.log_level, args.port)
    if not os.path.isdir(args.model):  # fail fast, before the slow imports (torch, transformers)
        logger.error("no such model folder: %s", args.model)
        return 2
    stop_event = asyncio.Event()
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_event.set)
    if args.parent_pid is not None:
        if os.getppid() != args.parent_pid:
            logger.error("parent %d already gone", args.parent_pid)
            return 1
        watch_parent(args.parent_pid, lambda: loop.call_soon_threadsafe(stop_event.set))
    return serve(args, loop, stop_event)


def serve(args: argparse.Namespace, loop: asyncio.AbstractEventLoop, stop_event: asyncio.Event) -> int:
    """Load the model and serve it until `stop_event` is set; the exit status."""
    engine = load_engine(args)
    scheduler = Scheduler(engine, max_batch=args.max_batch, batch_wait_s=args.batch_wait_ms / 1000,
                          continuous=args.batching == "continuous")
    scheduler.start()
    try:
        loop.run_until_complete(serve_http(create_app(engine, scheduler), args.host, args.port,
                                           scheduler, stop_event))
    except OSError as e:  # e.g. the port is taken
        logger.error("cannot serve on %s:%d: %s", args.host, args.port, e)
        scheduler.shutdown()
        return 1
    finally:
        loop.close()
    logger.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
