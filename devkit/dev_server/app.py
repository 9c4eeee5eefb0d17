"""The HTTP app: SGLang's endpoints as aiohttp handlers, and the loop that serves them.

aiohttp is present wherever AReaL's client runs (areal 1.0.4 requires aiohttp >= 3.13), so
the server needs no packages beyond torch and transformers. The handlers are module-level
functions; what they serve comes from the app: ``request.app[ENGINE]``,
``request.app[SCHEDULER]`` and ``request.app[WEIGHT_LOCK]`` (one weight update at a time).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from typing import Any

from aiohttp import web

from devkit.dev_server.protocol import BadRequest, parse_generate

logger = logging.getLogger("dev_server")

ENGINE = web.AppKey("engine")
SCHEDULER = web.AppKey("scheduler")
WEIGHT_LOCK = web.AppKey("weight_lock", asyncio.Lock)
UNSUPPORTED_ENDPOINTS = (
    "/update_weights_from_distributed",
    "/update_weights_from_tensor",
    "/init_weights_update_group",
    "/load_lora_adapter",
    "/unload_lora_adapter",
)


def reply(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status)


def error(status: int, message: str, **extra) -> web.Response:
    return reply({"error": {"message": message}, "message": message, **extra}, status)


async def body(request: web.Request) -> dict:
    raw = await request.read()
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise BadRequest(f"request body is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise BadRequest("request body must be a JSON object")
    return data


@web.middleware
async def bad_requests(request: web.Request, handler) -> web.Response:
    try:
        return await handler(request)
    except BadRequest as e:
        return error(400, str(e))


# -- probes ------------------------------------------------------------------------


async def health(request: web.Request) -> web.Response:
    if not request.app[SCHEDULER].thread.is_alive():
        return error(503, "generation worker is not running")
    return reply({})


async def model_info(request: web.Request) -> web.Response:
    engine, scheduler = request.app[ENGINE], request.app[SCHEDULER]
    return reply({"model_path": engine.model_path, "tokenizer_path": engine.model_path,
                  "is_generation": True, "weight_version": scheduler.weight_version})


async def server_info(request: web.Request) -> web.Response:
    engine, scheduler = request.app[ENGINE], request.app[SCHEDULER]
    return reply({
        "pid": os.getpid(), "model_path": engine.model_path, "device": str(engine.device),
        "dtype": str(engine.dtype).replace("torch.", ""), "max_batch": scheduler.max_batch,
        "weight_version": scheduler.weight_version, "paused": scheduler.paused,
        "queued": len(scheduler.queue), "running": len(scheduler.running or []),
        "context_length": engine.context_len, "version": "dev_server",
        **{f"num_{k}": v for k, v in scheduler.stats.items()},
    })


async def weight_version(request: web.Request) -> web.Response:
    return reply({"weight_version": request.app[SCHEDULER].weight_version})


async def models(request: web.Request) -> web.Response:
    return reply({"object": "list", "data": [{"id": request.app[ENGINE].model_path, "object": "model",
                                              "owned_by": "dev_server"}]})


# -- generation and its control ----------------------------------------------------------


async def generate(request: web.Request) -> web.Response:
    """Queue one request and answer when its batch has it; at --log-level DEBUG, one line when
    it arrives and one when it is answered, to line a client's timeline up with the server's."""
    req = parse_generate(await body(request), request.app[ENGINE], asyncio.get_running_loop())
    logger.debug("request %s arrived: %d prompt tokens, at most %d new", req.rid, len(req.input_ids),
                 req.params.max_new_tokens)
    try:
        request.app[SCHEDULER].submit(req)
    except RuntimeError as e:
        return error(503, str(e))
    try:
        result = await req.future
    except Exception as e:  # the batch failed
        return error(500, f"generation failed: {e!r}")
    meta = result["meta_info"]
    logger.debug("request %s answered after %.3fs: %d tokens, %s", req.rid, meta["e2e_latency"], len(result["output_ids"]),
                 meta["finish_reason"]["type"])
    return reply(result)


async def pause_generation(request: web.Request) -> web.Response:
    scheduler = request.app[SCHEDULER]
    mode = (await body(request)).get("mode", "abort")
    n = await asyncio.to_thread(scheduler.pause, mode == "abort")
    logger.info("generation paused (mode=%s, %d running requests %s, %d queued held)", mode, n,
                "aborted" if mode == "abort" else "finished", len(scheduler.queue))
    return reply({"success": True, "message": f"paused ({mode}); {n} running requests affected"})


async def continue_generation(request: web.Request) -> web.Response:
    scheduler = request.app[SCHEDULER]
    await body(request)
    scheduler.resume()
    logger.info("generation continued (%d queued)", len(scheduler.queue))
    return reply({"success": True, "message": "generation continued"})


async def abort_request(request: web.Request) -> web.Response:
    data = await body(request)
    n = request.app[SCHEDULER].abort(rid=data.get("rid"), abort_all=bool(data.get("abort_all")))
    return reply({"success": True, "message": f"aborted {n} requests"})


async def update_weights_from_disk(request: web.Request) -> web.Response:
    engine, scheduler = request.app[ENGINE], request.app[SCHEDULER]
    data = await body(request)
    path = data.get("model_path")
    if not isinstance(path, str) or not path:
        return error(400, "'model_path' is required", success=False)
    async with request.app[WEIGHT_LOCK]:
        t0 = time.perf_counter()
        try:
            if not os.path.isdir(path):
                raise FileNotFoundError(f"no such model folder: {path}")
            model = await asyncio.to_thread(engine.load_model, path)
            engine.check_compatible(model)
        except Exception as e:
            logger.warning("update_weights_from_disk(%s) failed: %s", path, e)
            return error(400, f"failed to load weights from {path}: {e}", success=False)
        fingerprint = await asyncio.to_thread(engine.fingerprint, model)
        n = await asyncio.to_thread(
            scheduler.swap_model, model, bool(data.get("abort_all_requests", False)),
            data.get("weight_version"))
        logger.info("loaded weights from %s in %.2fs (weight_version=%s, %d running "
                    "requests affected, fingerprint=%.6f)", path, time.perf_counter() - t0,
                    scheduler.weight_version, n, fingerprint)
        return reply({"success": True, "message": f"loaded weights from {path}",
                      "num_paused_requests": n, "weight_version": scheduler.weight_version})


# -- no-ops and refusals -----------------------------------------------------------------


async def flush_cache(request: web.Request) -> web.Response:
    return reply({"success": True, "message": "no cache to flush"})


async def memory_no_op(request: web.Request) -> web.Response:
    return reply({"success": True, "message": "no-op in the dev server"})


async def unsupported(request: web.Request) -> web.Response:
    return error(400, f"{request.path} is not supported by the dev server "
                      "(use disk weight updates, no LoRA)", success=False)


ROUTES = [
    web.get("/health", health),
    web.get("/health_generate", health),
    web.get("/get_model_info", model_info),
    web.get("/get_server_info", server_info),
    web.get("/get_weight_version", weight_version),
    web.get("/v1/models", models),
    web.post("/generate", generate),
    web.post("/pause_generation", pause_generation),
    web.post("/continue_generation", continue_generation),
    web.post("/abort_request", abort_request),
    web.post("/update_weights_from_disk", update_weights_from_disk),
    web.post("/flush_cache", flush_cache),
    web.post("/release_memory_occupation", memory_no_op),
    web.post("/resume_memory_occupation", memory_no_op),
    *(web.post(endpoint, unsupported) for endpoint in UNSUPPORTED_ENDPOINTS),
]


def create_app(engine, scheduler) -> web.Application:
    app = web.Application(middlewares=[bad_requests], client_max_size=1 << 30)
    app[ENGINE], app[SCHEDULER], app[WEIGHT_LOCK] = engine, scheduler, asyncio.Lock()
    app.add_routes(ROUTES)
    return app


async def serve_http(app: web.Application, host: str, port: int, scheduler, stop_event: asyncio.Event) -> None:
    """Serve `app` until `stop_event` is set, then abort the running batch and fail queued
    requests (so open handlers return at once) before closing."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=5.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, backlog=4096, reuse_address=True)
        await site.start()
        logger.info("serving on http://%s:%d", host, port)
        await stop_event.wait()
        logger.info("shutting down")
        await asyncio.to_thread(scheduler.shutdown)
    finally:
        await runner.cleanup()
