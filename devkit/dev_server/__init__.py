"""Development inference server speaking the part of SGLang's HTTP protocol that AReaL uses.

    python3 -m devkit.dev_server --model PATH [--host 127.0.0.1] [--port 30000]
        [--device cpu|cuda] [--dtype float32|bfloat16] [--max-batch 64] [--seed 0]
        [--decoder auto|hf|static] [--batching continuous|static] [--static-max-len 1024]

This is a development server for CPU demos and tests (and small single-GPU experiments),
NOT a replacement for SGLang: one process, one device, a plain Hugging Face
``transformers`` model, continuous batching only with its static decoder (no paged
attention, no prefix cache, no tensor parallelism, no LoRA, no NCCL weight sync). It
exists so that AReaL's production client, ``areal.engine.RemoteSGLangEngine``, runs
unchanged against a model on a machine without SGLang. It needs only torch,
transformers and aiohttp (aiohttp rather than FastAPI/uvicorn: AReaL's client needs
aiohttp anyway, and the GPU image has it but not FastAPI).

Modules, by role:

- `protocol`: SGLang's wire format (a /generate payload parsed and checked, the response built).
- `engine`: the transformers model and the batched sampler; `static_decode`: its CUDA-graph
  decoder for Qwen2 and Llama on a GPU; `continuous`: continuous batching on that decoder.
- `scheduler`: the request queue and the worker thread that batches it (pause, abort, weight swap).
- `app`: the aiohttp handlers and the serving loop; `__main__`: the server process and its flags.
- `client`: start, stop and call a server from scripts and tests (imports no torch).
- `sglang_seam/` and `sglang_launch_server`: the dev server in SGLang's place in the
  processes AReaL starts (see sglang_seam/sitecustomize.py).

Speed: on CPU it uses one torch thread unless ``--threads`` says otherwise (tiny models
get slower with more threads, and much slower when the cores are shared). On a GPU,
Qwen2 and Llama models decode through devkit/dev_server/static_decode.py (a preallocated KV cache, each decode
step replayed as one CUDA graph); other models, and ``--decoder hf``, through transformers'
own forward, which is bound by Python and kernel launches; both give the same greedy
completions (experiments/bench/gpu/decode.py; its table is in docs/results/throughput.md, attempt 5).

Endpoints (the ones ``RemoteSGLangEngine`` calls, plus a few SGLang probes):
  GET  /health, /health_generate, /get_model_info, /get_server_info,
       /get_weight_version, /v1/models
  POST /generate                      one request per call (``input_ids`` or ``text``)
  POST /pause_generation, /continue_generation
  POST /update_weights_from_disk      {"model_path", "abort_all_requests"?, "weight_version"?}
  POST /abort_request                 {"rid"?, "abort_all"?}
  POST /flush_cache, /release_memory_occupation, /resume_memory_occupation  (no-ops)
  POST /update_weights_from_distributed, /init_weights_update_group,
       /load_lora_adapter, /unload_lora_adapter  -> 400 "not supported"

Protocol decisions (the AReaL client in areal/infra/remote_inf_engine.py is the authority):

* Batching: a worker thread takes the oldest queued request and every other queued
  request with the same sampling key (temperature, top_p, top_k, min_p, frequency and
  presence penalty), up to ``--max-batch``; max_new_tokens, stop ids and stop strings
  may differ inside a batch. Before starting a batch the worker waits up to
  ``--batch-wait-ms`` (ending early once no request arrived for 20 ms) so that a burst
  of concurrent requests shares one batch. Prompts are left-padded; position ids come from the
  attention mask, so padding does not change results beyond float noise (greedy
  output equals an unbatched ``model.generate`` greedy decode). With the static decoder
  (``--batching continuous``, the default) a request arriving while a batch runs joins
  it at the next decode step if it has the batch's sampling key and fits its cache
  slots, and each request is answered as soon as it finishes; otherwise (and always
  with ``--decoder hf``, or ``--batching static``) the batch runs until every row has
  finished and requests arriving meanwhile wait for the next batch.
* Log-probs (``meta_info.output_token_logprobs``, ``[[logprob, token_id, None], ...]``):
  ``log_softmax(logits / temperature)`` of the sampled token for temperature > 0 and
  ``log_softmax(logits)`` for greedy (temperature 0). This is what AReaL's actor computes
  (``gather_logprobs(logits, labels, temperature=actor.temperature)``), so set the
  actor temperature equal to the rollout temperature. They are taken before top-k /
  top-p / min-p filtering and before frequency / presence penalties (the actor knows
  none of those), so they are the unfiltered distribution's log-probs.
* Stopping: a row stops when it produces a token in ``stop_token_ids`` or an EOS id
  (generation_config + tokenizer), or when a ``stop`` string appears in its decoded text.
  As in SGLang, the stop token IS included in ``output_ids`` / ``output_token_logprobs``
  (AReaL appends it to the sequence and trains on it), and ``ignore_eos`` disables all
  token-id stops (SGLang does the same), not just EOS. ``finish_reason`` is
  ``{"type": "stop", "matched": <id or str>}``, ``{"type": "length", "length": n}`` or
  ``{"type": "abort", "message": ...}``.
* Pause: ``/pause_generation`` (SGLang's default mode "abort") aborts the in-flight batch
  at the next decode step and returns once it has stopped: each unfinished row answers
  with the tokens generated so far and finish_reason ``abort``. AReaL's ``agenerate``
  resubmits such requests with ``input_ids + output`` and the remaining token budget,
  and the resubmission (like every request that arrives or is queued while paused) is
  HELD, not rejected, until ``/continue_generation``. ``{"mode": "in_place"}`` (or any
  mode other than "abort") lets the in-flight batch finish instead.
* ``/update_weights_from_disk`` loads the new model completely (off the worker thread),
  then swaps it in between batches. With ``abort_all_requests`` (AReaL always sends
  true) the in-flight batch is aborted as for a pause; without it the batch finishes on
  the old weights. Either way the call answers only when no batch is running on the old
  weights any more: 200 ``{"success": true, "message", "num_paused_requests"}``. A bad
  path or an incompatible model answers 400 ``{"success": false, "message"}`` (the
  client's ``raise_for_status`` turns that into an error) and the old weights stay.
  ``weight_version`` counts successful loads (or takes the ``weight_version`` given in
  the payload) and is reported in every response's ``meta_info``.
* Sampling is reproducible for a fixed ``--seed`` and a fixed request order when
  requests are served one at a time; concurrent batches depend on arrival timing.
* Shutdown: SIGTERM / SIGINT abort the running batch, answer queued requests with
  ``abort`` and exit with status 0. ``--step-delay-ms`` (a testing aid) slows every decode
  step so that tests can pause or abort a request mid-flight.
"""
