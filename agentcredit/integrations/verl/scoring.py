"""Teacher scoring on verl's inference servers: the log-probs of a token continuation after a context, computed
from the scored span on, with the shared prefix served from the engine's prefix cache.

TIPS scores ``log p(answer | S_k)`` at every boundary context S_k and gold alias, GEAR ``log p(a_t | s*, a_<t)``
of every response token after its teacher prompt: each is a *continuation* (answer or response ids) after a
*context* the server has usually just seen (S_k is a prefix of the episode's own turns; the teacher prompt is the
same for every row of a question). What verl 0.9.1 offers, and what each engine does with it:

* ``prompt_logprobs`` (verl's distillation teacher's call, ``teacher_loop/teacher_manager.py``; the old path,
  :func:`full_params`): vLLM 0.24 (the version verl 0.9.1's ``vllm`` extra pins) then defaults to
  ``skip_reading_prefix_cache=True`` (``vllm/sampling_params.py``, ``SamplingParams.__post_init__``: "the output
  of prompt logprobs may less than n_prompt_tokens, we need to skip reading cache"), so every call is a full
  prefill with full-vocabulary log-probs at every prompt position; verl's SGLang server turns it into
  ``logprob_start_len=0`` (``sglang_rollout/async_sglang_server.py``, ``generate``: ``request["logprob_start_len"]
  = 0``), which caps SGLang's radix-cache match at 0 tokens (SGLang 0.5.12 ``managers/schedule_batch.py``,
  ``Req._compute_max_prefix_len``: ``min(max_prefix_len, self.logprob_start_len)``): the same full prefill.
* **vLLM, cached** (:func:`vllm_cached_params`): the same request with ``skip_reading_prefix_cache=False``, which a
  request may set (vLLM ``v1/request.py``, ``Request.get_skip_reading_prefix_cache``: the sampling params' value
  wins when it is not None). The scheduler then serves the cached prefix, and the model runner computes logits
  and log-probs only for the rows it runs: ``start_idx = request.num_computed_tokens`` in
  ``v1/worker/gpu_model_runner.py`` ``_get_prompt_logprobs_dict`` (``compute_logits`` on the scheduled hidden
  states only); the rows of the cached prefix are left unwritten (``LogprobsTensors.empty_cpu``). verl's vLLM
  server reports the hit as ``extra_fields["num_cached_tokens"]`` (``vllm_async_server.py``, ``generate``), so
  :func:`rows_computed` checks that every row the continuation needs was computed; when the cache reached into
  the continuation (an identical earlier sequence, or a context whose last block was cached whole), or the hit
  is not reported, that one call is sent again on the old path. ``detokenize=False`` is required here: the
  unwritten rows hold arbitrary ids, which must not be decoded.
* **SGLang** (:func:`sglang_request`): SGLang's own ``/generate`` endpoint, which verl's SGLang server serves on
  the replica's address (``launch_server``: ``run_uvicorn(app, ...)`` with SGLang's ``http_server.app``; the load
  balancer's server id is that address), with ``return_logprob`` and ``logprob_start_len = len(context) - 1``:
  the radix cache serves the context up to there, and input log-probs are computed from there on
  (``Req._compute_max_prefix_len`` above). verl's ``generate`` cannot send it: it hard-codes 0 and passes other
  keys to ``SamplingParams``, which refuses unknown ones. SGLang answers ``input_token_logprobs`` for the tokens
  from ``logprob_start_len`` on, the first one ``None`` (``scheduler_output_processor_mixin.py``,
  ``_process_input_token_logprobs``: ``[None] + input_token_logprobs[:-1]``, ids ``origin_input_ids[
  logprob_start_len:]``), so the continuation's log-probs are entries 1 onwards (:func:`sglang_logprobs`).

Both cached paths give the same numbers as the old one (the same forward over the same ids, with the prefix's keys
and values read instead of recomputed; bitwise equality is not guaranteed, as for any change of batch shape).
What each saves was read from the engines' sources, not measured on a GPU (none in the session that wrote this).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from uuid import uuid4

from agentcredit.integrations.verl.episode import continuation_logprobs

__all__ = [
    "ContinuationScoreFn",
    "TeacherScorer",
    "full_params",
    "prompt_rows",
    "routed_generate",
    "rows_computed",
    "sglang_logprobs",
    "sglang_request",
    "vllm_cached_params",
]

#: ``score(context_ids, continuation_ids) -> [log p(continuation[i] | context + continuation[:i])]``.
ContinuationScoreFn = Callable[[list[int], list[int]], Awaitable[list[float]]]
#: ``post(url, json_payload) -> json_answer`` (an HTTP POST; replaced by a scripted server in tests).
PostFn = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


def full_params(engine: str) -> dict[str, Any]:
    """Sampling parameters of a whole-sequence prompt-logprob request (the old path, and the fallback).

    Both verl servers read vLLM's ``prompt_logprobs``; ``detokenize`` is a field of vLLM's ``SamplingParams``
    only: verl's SGLang server passes the remaining keys to SGLang's ``SamplingParams``, which has no such field
    and raises, so it is sent to vLLM alone."""
    params: dict[str, Any] = {"max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 0}
    if engine == "vllm":
        params["detokenize"] = False  # the scored ids are never turned back into text
    return params


def vllm_cached_params() -> dict[str, Any]:
    """vLLM's prompt-logprob request that reads the prefix cache (module docstring); ``detokenize=False`` keeps
    vLLM from decoding the ids of the rows it did not compute."""
    return {**full_params("vllm"), "skip_reading_prefix_cache": False}


def rows_computed(num_cached_tokens: Any, context_length: int) -> bool:
    """Whether vLLM computed every prompt-logprob row a continuation after ``context_length`` tokens needs.

    Row ``j`` (``log p(ids[j + 1] | ids[: j + 1])``) is computed iff ``j >= num_cached_tokens``; the continuation's
    first row is ``context_length - 1``. An unreported hit (None) is no proof."""
    if num_cached_tokens is None or isinstance(num_cached_tokens, bool):
        return False
    return int(num_cached_tokens) <= context_length - 1


def sglang_request(
    ids: Sequence[int], context_length: int, rid: str, lora_path: str | None = None
) -> dict[str, Any]:
    """SGLang's ``/generate`` payload (``GenerateReqInput``) scoring ``ids[context_length:]``; ``lora_path``: the
    adapter verl's SGLang server serves the actor's LoRA as (its ``generate`` sets it on every request), without
    which the base model would score."""
    if not 1 <= context_length < len(ids):
        raise ValueError(
            f"sglang_request: need a context of at least one token and a continuation, got {context_length} of "
            f"{len(ids)} tokens"
        )
    return {
        "rid": rid,
        "input_ids": list(ids),
        "sampling_params": {"max_new_tokens": 1, "temperature": 1.0},
        "return_logprob": True,
        "logprob_start_len": context_length - 1,
        "return_text_in_logprobs": False,
        "stream": False,
        **({"lora_path": lora_path} if lora_path else {}),
    }


def sglang_logprobs(answer: dict[str, Any], ids: Sequence[int], context_length: int) -> list[float]:
    """The continuation's log-probs from SGLang's answer to :func:`sglang_request` (entries ``[logprob, id, text]``
    for the tokens from ``context_length - 1`` on, the first without a log-prob). Checks the ids it echoes."""
    entries = (answer.get("meta_info") or {}).get("input_token_logprobs")
    want = len(ids) - context_length + 1
    if not isinstance(entries, list) or len(entries) != want:
        got = len(entries) if isinstance(entries, list) else entries
        raise ValueError(
            f"SGLang answered {got!r} input log-probs for logprob_start_len={context_length - 1} over {len(ids)} "
            f"tokens, expected {want}: {str(answer)[:300]}"
        )
    echoed = [int(e[1]) for e in entries]
    if echoed != list(ids[context_length - 1 :]):
        raise ValueError("SGLang's input log-probs are for other token ids than the ones sent")
    out = [float(e[0]) for e in entries[1:]]
    if not all(math.isfinite(x) for x in out):
        raise ValueError(f"SGLang answered a non-finite input log-prob: {out}")
    return out


async def routed_generate(
    client: Any, routing_id: str, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any]
) -> Any:
    """verl's ``generate`` on the replica that ``routing_id`` is routed to, with ``request_id`` as the engine's id.

    verl's ``LLMServerClient.generate`` uses one id for both: the load balancer's sticky session and, under
    ``rollout.full_determinism``, vLLM's own request id (which concurrent requests must not share). An episode's
    concurrent calls (a tree's branches, its teacher scores) then need ids of their own, and routing by them would
    scatter the episode over replicas, away from the prefix cache that holds it. With two ids this does what
    ``generate`` does (``llm_server.py``: acquire, the server actor's ``generate``, the weight-step fields,
    release) with the routing id for the balancer and the call's id for the engine; with one it is verl's call."""
    if request_id == routing_id:
        return await client.generate(
            request_id=request_id, prompt_ids=prompt_ids, sampling_params=sampling_params
        )
    server_id, server = await client._acquire_server(
        routing_id, prompt_ids=prompt_ids, sampling_params=sampling_params
    )
    try:
        out = await server.generate.remote(
            request_id=request_id, prompt_ids=prompt_ids, sampling_params=sampling_params
        )
        steps = out.extra_fields.get("global_steps")
        out.extra_fields.setdefault("min_global_steps", steps)
        out.extra_fields.setdefault("max_global_steps", steps)
        return out
    finally:
        client._release_server(server_id, request_id=routing_id)


_SESSIONS: dict[int, Any] = {}  # one HTTP session per event loop of a worker process (connections reused)


async def _http_post(url: str, payload: dict[str, Any]) -> dict[str, Any]:
    import asyncio

    import aiohttp  # verl's dependency; only the SGLang path needs it

    key = id(asyncio.get_running_loop())
    session = _SESSIONS.get(key)
    if session is None or session.closed:
        session = _SESSIONS[key] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600))
    async with session.post(url, json=payload) as response:
        body = await response.json(content_type=None)
        if response.status != 200:
            raise RuntimeError(f"SGLang {url} answered HTTP {response.status}: {str(body)[:300]}")
        return body


class TeacherScorer:
    """Scores continuations on one verl server pool (the rollout's, or the lagged teacher's): a
    :data:`ContinuationScoreFn`.

    ``client`` is verl's ``LLMServerClient`` (``generate``; ``_acquire_server`` / ``_release_server`` for SGLang's
    endpoint, as its ``generate`` uses them), ``engine`` the rollout's (``vllm``, ``sglang``; others take the old
    path), ``request_id()`` the id of the next call, ``routing()`` the load balancer's key (the episode's id, so
    every call lands on the replica whose cache holds the episode, :func:`routed_generate`; default: the call's
    id), ``rid(request_id)`` SGLang's own request id (unique among running requests; default a fresh uuid).
    ``cached=False`` keeps the old path. Counts its calls in
    :attr:`stats` (``requests``, ``resent``: vLLM calls whose cache hit reached the continuation).
    """

    def __init__(
        self,
        client: Any,
        engine: str,
        request_id: Callable[[], str],
        *,
        rid: Callable[[str], str] | None = None,
        cached: bool = True,
        post: PostFn | None = None,
        routing: Callable[[], str] | None = None,
        lora_path: str | None = None,
    ):
        self.lora_path = lora_path  # SGLang: the adapter name of the actor's LoRA (None: no adapter served)
        self.client, self.engine, self.request_id = client, engine, request_id
        # the load balancer's key (the episode's id): every call lands on the episode's replica, whatever its own id
        self.routing = routing
        self.rid = rid or (lambda routing: uuid4().hex)
        self.cached = cached
        self.post = post or _http_post
        self.stats = {"requests": 0, "resent": 0}

    async def __call__(self, context: list[int], continuation: list[int]) -> list[float]:
        if not continuation:
            return []
        if not context:
            raise ValueError("teacher scoring: the context must hold at least one token")
        ids = list(context) + list(continuation)
        if self.cached and self.engine == "sglang":
            return await self._sglang(ids, len(context))
        if self.cached and self.engine == "vllm":
            out = await self._generate(ids, vllm_cached_params())
            if rows_computed(out.extra_fields.get("num_cached_tokens"), len(context)):
                return _continuation(out, ids, len(context))
            self.stats["resent"] += 1  # the cache reached into the scored rows: score them afresh
        return _continuation(await self._generate(ids, full_params(self.engine)), ids, len(context))

    async def _generate(self, ids: list[int], params: dict[str, Any]) -> Any:
        self.stats["requests"] += 1
        request_id = self.request_id()
        routing = self.routing() if self.routing is not None else request_id
        return await routed_generate(self.client, routing, request_id, ids, params)

    async def _sglang(self, ids: list[int], context_length: int) -> list[float]:
        self.stats["requests"] += 1
        request_id = self.request_id()
        routing = self.routing() if self.routing is not None else request_id
        # the load balancer's server id is the replica's HTTP address (verl's get_router_handle /
        # LLMServerManager: servers=dict(zip(server_addresses, server_handles)))
        server_id, _ = await self.client._acquire_server(routing)
        try:
            answer = await self.post(
                f"http://{server_id}/generate",
                sglang_request(ids, context_length, self.rid(request_id), self.lora_path),
            )
        finally:
            self.client._release_server(server_id, request_id=routing)
        return sglang_logprobs(answer, ids, context_length)


def prompt_rows(extra_fields: dict[str, Any], ids: Sequence[int]) -> tuple[int, list[float]]:
    """The prompt-logprob rows verl's vLLM server answered for ``ids``, as ``(first, rows)``: ``rows[k]`` is row
    ``first + k``, i.e. ``log p(ids[first + k + 1] | ids[: first + k + 1])``.

    verl (``extract_prompt_logprobs``) turns vLLM's ``prompt_logprobs`` into one ``[logprob]`` row per prompt token
    after the first, then appends a padding row. How many rows vLLM 0.24 gives depends on its model runner:

    * the V1 runner (``v1/worker/gpu_model_runner.py``, e.g. Qwen2): all ``len(ids) - 1`` rows, those of
      prefix-cached positions left unwritten (``first = 0``);
    * the V2 runner (``v1/worker/gpu/``, the default for Llama, Qwen3, Mistral): only the rows it computed, the last
      ``len(ids) - 1 - num_cached_tokens`` (``first = num_cached_tokens``).

    Both come out the same here: the layout is read off the row count. When verl also sent ``prompt_ids`` (the
    token of each row), the computed rows must name ``ids[first + k + 1]``; a mismatch means another layout, and
    raises rather than scores the wrong positions.
    """
    raw = extra_fields.get("prompt_logprobs")
    if not raw:
        raise ValueError("the server returned no prompt_logprobs; teacher scoring needs vLLM or SGLang")
    rows = [float(row[0]) for row in raw[:-1]]  # verl's padding row last
    first = len(ids) - 1 - len(rows)
    if first < 0:
        raise ValueError(f"the server returned {len(rows)} prompt log-prob rows for {len(ids)} prompt tokens")
    cached = extra_fields.get("num_cached_tokens")
    computed_from = (
        max(first, int(cached)) if isinstance(cached, int) and not isinstance(cached, bool) else first
    )
    named = extra_fields.get("prompt_ids")
    if named:
        for k in range(computed_from - first, len(rows)):
            if int(named[k][0]) != int(ids[first + k + 1]):
                raise ValueError(
                    f"prompt log-prob row {first + k} is for token {named[k][0]}, not {ids[first + k + 1]}: an "
                    f"unknown row layout ({len(rows)} rows for {len(ids)} tokens, {cached} cached)"
                )
    return first, rows


def _continuation(out: Any, ids: list[int], context_length: int) -> list[float]:
    """The continuation's log-probs from verl's ``prompt_logprobs`` extra field (:func:`prompt_rows`)."""
    first, rows = prompt_rows(out.extra_fields, ids)
    if first > context_length - 1:  # the engine computed none of the continuation's first rows
        raise ValueError(
            f"the server returned prompt log-probs from row {first} on; the continuation after {context_length} "
            f"context tokens needs them from row {context_length - 1}"
        )
    lp = [math.nan] * first + rows
    return continuation_logprobs(lp, context_length, len(ids) - context_length)
