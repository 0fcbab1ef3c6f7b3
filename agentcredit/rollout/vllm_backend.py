"""``rollout.backend: vllm``: vLLM generates the policy segments, the native engine does the rest.

The engine (``engine.py``) keeps protocols, tool calls, trees, budgets and infrastructure-failure handling; this
backend only generates. Each policy segment (or the rest of one) is one vLLM request with the sequence's full token
prefix (``TokensPrompt``), so vLLM's automatic prefix caching reuses the system prompt, earlier turns and sibling
branches, as verl's agent loop does with the same engine. vLLM runs in this process (the offline ``LLM`` with
``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so :meth:`VLLMBackend.push_weights` can copy the trainer's weights into the
running model (``model.load_weights`` over named parameters, no disk round trip) after every update.

Sampling matches the HF engine's: temperature (0 = greedy), top-p, top-k, the segment's token budget, the engine's
stop ids (the model's own EOS is ignored unless it is one of them), the protocol's stop strings (candidates the
engine confirms) and one seed per request, so a sampled segment does not depend on what it is batched with. vLLM
returns the sampled token's log-prob (``logprobs=0``); with ``logprobs_mode="raw_logprobs"`` that is log
softmax(logits) of the unmodified model, the engine's recorded distribution at temperature 1 (the training
default) and for greedy decoding. At another temperature the backend asks for ``processed_logprobs``: log
softmax(logits / temperature), exact without top-k / top-p, but with them vLLM 0.32 renormalises over the kept
tokens (after truncation), unlike the engine's convention; ``rollout/logp_gap`` then shows the difference. The trainer's loss never reads these: it recomputes log-probs with its own forward (as verl does),
and logs the gap between the two every step (``rollout/logp_gap``), so a kernel mismatch is visible.

Start-up: vLLM is started from a directory holding only the model's config and tokenizer (``load_format=
"dummy"``), then the policy's weights are pushed in; nothing is downloaded and no weight file is written.

vLLM is optional (``pip install 'agentcredit[vllm]'`` on CPU, the CUDA build on a GPU); importing this module
does not import it.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import torch

from agentcredit.rollout.backend import SegmentBackend, SegmentOutput, SegmentRequest

#: CPU memory (GiB) vLLM reserves for its KV cache when VLLM_CPU_KVCACHE_SPACE is not set: SmolLM2-135M holds 46 KB
#: per token in fp32, so 2 GiB is ~45k tokens (64 episodes of ~700 tokens beside one cached 1,050-token prompt).
DEFAULT_KV_CACHE_GIB = 2


def vllm_available() -> bool:
    """Whether vLLM can be imported here (the optional extra)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def _quiet_environment(threads: int | None) -> None:
    """What vLLM reads from the environment, set before it is imported (values already set are kept)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process: weights reachable for push
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(DEFAULT_KV_CACHE_GIB))
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    if threads is not None:
        # vLLM's CPU worker sets its own OpenMP threads from this binding; "nobind" leaves torch's count alone
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def _tolerate_odd_module_attributes() -> None:
    """Work around a vLLM 0.32 start-up failure. Registering its CPU kernel overrides scans the attributes of every
    imported module and reads ``vars(value).get("kernel")``; a value whose ``__dict__`` is not a dict (a
    ``_lib_fn_wrapper`` of a library the kb-multihop task imports) raises AttributeError there, and vLLM does not
    start. The same scan (vLLM's ``triton_utils.dispatcher._rebind_kernels``), skipping such values."""
    import sys

    try:
        from vllm.triton_utils import dispatcher
    except ImportError:  # another vLLM layout: nothing to patch
        return
    if getattr(dispatcher._rebind_kernels, "_agentcredit", False):
        return

    def rebind(overrides: Any) -> None:
        originals = {id(original): wrapper for original, wrapper in overrides}

        def lookup(value: Any) -> Any:
            return originals.get(id(value)) if value is not None else None

        for module in list(sys.modules.values()):
            namespace = getattr(module, "__dict__", None)
            if not isinstance(namespace, dict) or not namespace:
                continue
            for attr, value in list(namespace.items()):
                wrapper = lookup(value)
                if wrapper is not None:
                    setattr(module, attr, wrapper)
                    continue
                try:
                    inner = getattr(value, "__dict__", None)
                except Exception:  # noqa: BLE001 - a lazy module that fails on attribute access
                    continue
                if not isinstance(inner, dict):
                    continue
                wrapper = lookup(inner.get("kernel"))
                if wrapper is None:
                    continue
                value.kernel = wrapper
                if not isinstance(value, type):
                    value.__dict__.pop("_kernel_arg_names", None)

    rebind._agentcredit = True  # type: ignore[attr-defined]
    dispatcher._rebind_kernels = rebind


def llm_arguments(
    model_dir: str,
    *,
    dtype: str,
    device_type: str,
    max_model_len: int,
    enable_prefix_caching: bool = True,
    seed: int = 0,
    temperature: float = 1.0,
    gpu_memory_fraction: float = 0.3,
) -> dict[str, Any]:
    """The arguments of vLLM's ``LLM`` for the policy saved (config and tokenizer only) in ``model_dir``, on the
    device type the policy lives on (``cpu`` or ``cuda``: vLLM runs where the trainer's model does, colocated)."""
    args: dict[str, Any] = {
        "model": model_dir,
        "tokenizer": model_dir,
        "dtype": dtype,
        "load_format": "dummy",  # random weights, replaced by push_weights: no weight file is written
        "enable_prefix_caching": enable_prefix_caching,
        "max_model_len": max_model_len,
        "seed": seed,
        "logprobs_mode": "raw_logprobs" if temperature in (0.0, 1.0) else "processed_logprobs",
        "max_logprobs": 1,
        "enforce_eager": True,
    }
    if device_type == "cuda":
        # one GPU shared with the trainer in this process: vLLM takes a stated share of its memory (the trainer's
        # weights, gradients and AdamW moments the rest), one worker, no tensor parallelism
        args.update(gpu_memory_utilization=gpu_memory_fraction, tensor_parallel_size=1)
    else:
        # vLLM 0.32 on CPU crashes when a seeded request's prefill is split in chunks ("CPU Generator does not use
        # offset": it rewinds the request's torch.Generator, which CPU generators cannot): never split one
        args.update(enable_chunked_prefill=False, max_num_batched_tokens=max(max_model_len, 8192))
    return args


class VLLMBackend(SegmentBackend):
    """vLLM's offline engine behind the :class:`~agentcredit.rollout.backend.SegmentBackend` interface.

    Args:
        model: the policy (a Hugging Face ``*ForCausalLM`` vLLM supports: Llama, Qwen2, SmolLM2, ...); its config
            and the tokenizer start vLLM and its weights are pushed in.
        tokenizer: the policy's tokenizer (vLLM detokenizes for stop strings with the same one).
        dtype: vLLM's dtype (default: the model's).
        max_model_len: the longest context (default: the model's, capped at 8192).
        threads: torch threads (None: leave them as they are).
        enable_prefix_caching: vLLM's automatic prefix caching (on: the point of this backend).
        temperature: the rollout temperature, to pick which log-probs vLLM returns (see the module docstring).
        gpu_memory_fraction: on a GPU (the model's device), the share of its memory vLLM may take for its weights
            and KV cache beside the trainer in this process (``rollout.vllm_gpu_memory_fraction``).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        dtype: str | None = None,
        max_model_len: int | None = None,
        threads: int | None = None,
        enable_prefix_caching: bool = True,
        temperature: float = 1.0,
        seed: int = 0,
        gpu_memory_fraction: float = 0.3,
    ):
        super().__init__()
        _quiet_environment(threads)
        start = time.perf_counter()
        _tolerate_odd_module_attributes()
        from vllm import LLM

        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self._max_positions = int(getattr(config, "max_position_embeddings", 8192))
        self._vocab = int(config.vocab_size)
        self.max_model_len = min(self._max_positions, max_model_len or 8192)
        dtype = dtype or str(next(model.parameters()).dtype).removeprefix("torch.")
        self._dir = tempfile.TemporaryDirectory(prefix="agentcredit-vllm-")
        saved = type(config).from_dict(config.to_dict())
        saved.architectures = [type(model).__name__]
        saved.save_pretrained(self._dir.name)
        tokenizer.save_pretrained(self._dir.name)
        self.device_type = next(model.parameters()).device.type
        self.llm = LLM(
            **llm_arguments(
                self._dir.name,
                dtype=dtype,
                device_type=self.device_type,
                max_model_len=self.max_model_len,
                enable_prefix_caching=enable_prefix_caching,
                seed=seed,
                temperature=temperature,
                gpu_memory_fraction=gpu_memory_fraction,
            )
        )
        self.startup_seconds = time.perf_counter() - start
        self.push_seconds: list[float] = []
        self.push_weights(model)
        self.stats.extra.update(
            {"prompt_tokens": 0.0, "cached_prompt_tokens": 0.0, "requests": 0.0, "generate_calls": 0.0}
        )

    # ------------------------------------------------------------------ properties
    @property
    def vocab_size(self) -> int:
        return self._vocab

    @property
    def max_positions(self) -> int:
        return self.max_model_len

    # ------------------------------------------------------------------ weights
    def _worker(self) -> Any:
        """vLLM's worker, in this process (its ``reload_weights`` loads weights into the running model)."""
        engine = self.llm.llm_engine
        executor = getattr(engine, "model_executor", None)
        if executor is None:  # V1 LLMEngine: engine_core (InprocClient) -> EngineCore -> model_executor
            core = getattr(engine.engine_core, "engine_core", None)
            if core is None:
                raise RuntimeError(
                    "VLLMBackend: vLLM runs in another process; set VLLM_ENABLE_V1_MULTIPROCESSING=0 before "
                    "vllm is imported so the trainer can push its weights"
                )
            executor = core.model_executor
        worker = executor.driver_worker
        return getattr(worker, "worker", worker)  # a WorkerWrapperBase around the worker

    @torch.no_grad()
    def push_weights(self, model: Any) -> float:
        """Copy ``model``'s parameters into the running engine (vLLM's in-place reload from checkpoint-format
        tensors: it renames, fuses q/k/v and gate/up, and repacks for its CPU kernels), then drop vLLM's prefix
        cache (its KV was computed with the old weights). Returns the seconds it took (also appended to
        :attr:`push_seconds`)."""
        start = time.perf_counter()
        weights = [(name, param.detach()) for name, param in model.named_parameters()]
        worker = self._worker()
        worker.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)
        # A tied LM head gets no checkpoint tensor of its own, so the in-place reload leaves the CPU kernel it
        # prepacked from the old weights (vLLM 0.32 logs "ParallelLMHead: Failed to load weights" and the logits
        # stay the old model's): pack it again from the embedding it shares.
        target = worker.model_runner.model
        head = getattr(target, "lm_head", None)
        embed = getattr(getattr(target, "model", None), "embed_tokens", None)
        tied = head is not None and embed is not None and getattr(head, "weight", None) is embed.weight
        if tied and self.device_type == "cpu":  # a CPU kernel's prepacked copy; a GPU reads the weight itself
            head.quant_method.process_weights_after_loading(head)
        self.llm.reset_prefix_cache()
        seconds = time.perf_counter() - start
        self.push_seconds.append(seconds)
        return seconds

    # ------------------------------------------------------------------ generation
    def generate(
        self, requests: Sequence[SegmentRequest], sampling: Any, stop_token_ids: Sequence[int]
    ) -> list[SegmentOutput]:
        from vllm import SamplingParams as VSampling
        from vllm.inputs import TokensPrompt

        start = time.perf_counter()
        prompts, params = [], []
        for req in requests:
            prompts.append(TokensPrompt(prompt_token_ids=list(req.prompt)))
            params.append(
                VSampling(
                    n=1,
                    temperature=float(sampling.temperature),
                    top_p=float(sampling.top_p),
                    top_k=int(sampling.top_k) if sampling.top_k > 0 else -1,
                    max_tokens=int(req.max_tokens),
                    stop_token_ids=list(stop_token_ids),
                    ignore_eos=True,  # only the engine's stop ids end a segment (they hold the EOS by default)
                    stop=list(req.stop) or None,
                    include_stop_str_in_output=True,
                    skip_special_tokens=False,
                    spaces_between_special_tokens=False,
                    seed=None if sampling.greedy else int(req.seed),
                    logprobs=0,
                )
            )
        results = self.llm.generate(prompts, params, use_tqdm=False)
        outputs: list[SegmentOutput] = []
        for result in results:
            completion = result.outputs[0]
            ids = [int(t) for t in completion.token_ids]
            entries = completion.logprobs or []
            logprobs = [float(entry[tok].logprob) for tok, entry in zip(ids, entries, strict=False)]
            outputs.append(SegmentOutput(ids, logprobs))
            self.stats.extra["prompt_tokens"] += len(result.prompt_token_ids or [])
            self.stats.extra["cached_prompt_tokens"] += float(getattr(result, "num_cached_tokens", 0) or 0)
            self.stats.tokens_fed += len(ids)
        seconds = time.perf_counter() - start
        self.stats.forward_seconds += seconds
        self.stats.extra["requests"] += len(requests)
        self.stats.extra["generate_calls"] += 1
        self.stats.forward_calls += 1
        return outputs

    def close(self) -> None:
        """Free vLLM's engine and its KV cache reservation."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            del llm
        import gc

        gc.collect()
        if getattr(self, "_dir", None) is not None:
            self._dir.cleanup()
            self._dir = None
