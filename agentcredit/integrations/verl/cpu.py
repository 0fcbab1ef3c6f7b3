"""verl 0.9.1's own loop (``python -m verl.trainer.main_ppo``) on the CPU: a platform, the FSDP engines, a rollout.

Everything verl needs to run without an accelerator, through verl's own registries; loaded in every process with
``VERL_USE_EXTERNAL_MODULES=agentcredit.integrations.verl.cpu`` (forwarded to Ray in
``ray_kwargs.ray_init.runtime_env.env_vars``, values as strings) and switched on by ``VERL_PLATFORM=cpu``. Without
that variable importing it registers the platform and the rollout name and changes nothing else.

* **platform** (``verl.plugin.platform``, ``PlatformRegistry``): ``cpu``, chosen only by name, never
  auto-detected. ``current_device()`` is the string ``"cpu"`` (verl reads an integer id as an accelerator index);
  the collective backend is gloo; the Ray resource is ``"GPU"`` (verl's single controller counts only GPU / NPU
  resources, so a run gives Ray fake slots, ``+ray_kwargs.ray_init.num_gpus=N``, that its workers take); the
  device module is ``torch.cpu`` with the ``torch.cuda`` calls verl makes on it (memory statistics 0, caches
  no-ops, the RNG state torch's).
* **engines** (``verl.workers.engine.base.EngineRegistry``): verl's FSDP engines (actor / reference with the LM
  head, critic with the value head) registered for device ``cpu`` too; they run as written (FSDP2 only: FSDP1
  hard-codes ``sync_module_states=True``, which needs an accelerator).
* **rollout** (``RolloutReplicaRegistry``, ``verl.workers.rollout.base._ROLLOUT_REGISTRY``):
  ``actor_rollout_ref.rollout.name=agentcredit_cpu``: one Ray actor per replica runs the model with
  transformers (a plain sampling loop with a KV cache) behind verl's token-in/token-out server interface
  (``generate``, ``prompt_logprobs`` for teacher scoring), and the worker side
  (:class:`CPURollout`) sends it the actor's weights at every sync.
* **three rebinds** where verl 0.9.1 has no plugin point (:func:`rebind_for_cpu`, applied only under
  ``VERL_PLATFORM=cpu``; each is written up as an upstream change in docs/scaling-out-with-verl.md).
"""

from __future__ import annotations

import contextlib
import math
import os
from types import ModuleType, SimpleNamespace
from typing import Any

import ray
import torch
from verl.plugin.platform import PlatformRegistry
from verl.plugin.platform.platform_base import PlatformBase
from verl.workers.rollout import base as rollout_base
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, RolloutReplicaRegistry, TokenOutput

__all__ = ["PLATFORM", "ROLLOUT", "CPURollout", "CPUServer", "PlatformCPU", "cpu_selected", "rebind_for_cpu"]

#: the name ``VERL_PLATFORM`` selects this platform by
PLATFORM = "cpu"


def _host_memory() -> tuple[int, int]:
    """(available, total) bytes of host memory, as ``torch.cuda.mem_get_info`` answers for a GPU."""
    try:
        import psutil

        vm = psutil.virtual_memory()
        return int(vm.available), int(vm.total)
    except ImportError:
        page, pages = os.sysconf("SC_PAGE_SIZE"), os.sysconf("SC_PHYS_PAGES")
        return int(page * os.sysconf("SC_AVPHYS_PAGES")), int(page * pages)


def _device_module() -> ModuleType:
    """``torch.cpu`` with the ``torch.cuda`` calls verl makes on its device module and ``torch.cpu`` lacks (memory
    statistics, caches, RNG state): no allocator to report on, so the statistics are 0 and the caches no-ops."""
    module = ModuleType("agentcredit_verl_cpu_device")
    for name in dir(torch.cpu):
        if not name.startswith("__"):
            setattr(module, name, getattr(torch.cpu, name))

    def zero(*args: Any, **kwargs: Any) -> int:
        return 0

    def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    for name in ("memory_reserved", "memory_allocated", "max_memory_reserved", "max_memory_allocated"):
        setattr(module, name, zero)
    for name in ("empty_cache", "reset_peak_memory_stats", "reset_accumulated_memory_stats", "ipc_collect"):
        setattr(module, name, nothing)
    module.memory_stats = lambda *args, **kwargs: {}
    module.mem_get_info = lambda *args, **kwargs: _host_memory()
    module.get_rng_state = lambda *args, **kwargs: torch.get_rng_state()
    module.set_rng_state = lambda state, *args, **kwargs: torch.set_rng_state(state)
    module.manual_seed = module.manual_seed_all = lambda seed: torch.manual_seed(seed)
    module.get_device_name = lambda *args, **kwargs: "cpu"
    module.get_device_properties = lambda *args, **kwargs: SimpleNamespace(
        name="cpu", total_memory=_host_memory()[1]
    )
    return module


_DEVICE_MODULE = _device_module()


@PlatformRegistry.register(platform=PLATFORM)
class PlatformCPU(PlatformBase):
    """verl's platform interface answered for the host CPU (one "device" per process)."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return _DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # never auto-detected: a machine without a GPU keeps verl's own fallback unless the user asks for the CPU
        return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM

    def current_device(self) -> str:  # type: ignore[override]  # verl reads an int as an accelerator index
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "AGENTCREDIT_VERL_CPU_VISIBLE_DEVICES"  # nothing to hide: no process owns a device

    @contextlib.contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None


#: ``actor_rollout_ref.rollout.name`` of the CPU rollout
ROLLOUT = "agentcredit_cpu"


def cpu_selected() -> bool:
    """Whether this process runs verl on the CPU (``VERL_PLATFORM=cpu``)."""
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM


# ------------------------------------------------------------------------------------------------- engines
def register_engines() -> None:
    """verl's FSDP engines for device ``cpu`` in its engine registry (registered for cuda / npu only). verl looks the
    engine up by ``get_device_name()``, which the platform answers ``cpu``."""
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

    for model_type, engine in (
        ("language_model", FSDPEngineWithLMHead),
        ("value_model", FSDPEngineWithValueHead),
    ):
        backends = EngineRegistry._engines.get(model_type, {})
        missing = [b for b in ("fsdp", "fsdp2") if PLATFORM not in backends.get(b, {})]
        if missing:  # verl's register asserts on a key registered twice
            EngineRegistry.register(model_type=model_type, backend=missing, device=PLATFORM)(engine)


# ------------------------------------------------------------------------------------------------- rebinds
class _UnpinnedCPUOffloadPolicy:
    """``CPUOffloadPolicy`` with ``pin_memory=False`` whatever the caller asks (pinned memory needs an accelerator)."""


def rebind_for_cpu() -> None:
    """The three places verl 0.9.1 gives no plugin point for, rebound in this process (upstream changes in
    docs/scaling-out-with-verl.md, "verl's own loop on the CPU"). Each keeps verl's function and changes one value.
    """
    import verl.utils.distributed as distributed
    import verl.utils.model as model_utils
    import verl.workers.engine.fsdp.transformer_impl as fsdp_impl

    # 1. verl/utils/distributed.py, initialize_global_process_group_ray: the default backend is
    #    f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}", which is "cpu:gloo,cpu:gloo" here (torch refuses a
    #    device named twice); the platform's backend alone is what a CPU needs. verl/workers/engine_workers.py
    #    imports the function by name, so its copy is rebound too when it is already imported.
    original_init = getattr(distributed.initialize_global_process_group_ray, "__wrapped__", None) or (
        distributed.initialize_global_process_group_ray
    )

    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return original_init(timeout_second=timeout_second, backend=backend or "gloo")

    initialize_global_process_group_ray.__wrapped__ = original_init
    distributed.initialize_global_process_group_ray = initialize_global_process_group_ray
    import sys

    workers = sys.modules.get("verl.workers.engine_workers")
    if workers is not None:
        workers.initialize_global_process_group_ray = initialize_global_process_group_ray

    # 2. verl/workers/engine/fsdp/transformer_impl.py, FSDPEngine._build_fsdp_module: the reference model (forward
    #    only) gets CPUOffloadPolicy(pin_memory=True); pinning needs an accelerator.
    policy = fsdp_impl.CPUOffloadPolicy
    if policy is not None and not issubclass(policy, _UnpinnedCPUOffloadPolicy):

        class UnpinnedCPUOffloadPolicy(policy, _UnpinnedCPUOffloadPolicy):
            def __init__(self, pin_memory: bool = False):
                super().__init__(pin_memory=False)

        fsdp_impl.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy

    # 3. verl/utils/model.py, load_valuehead_model (the critic's model): from_pretrained with
    #    attn_implementation="flash_attention_2" hard-coded, whatever the model config asks; flash-attn is a CUDA
    #    package. Here the critic is loaded as verl's first branch loads it, with the config's attention
    #    (override_config.attn_implementation, which verl has already put on the config).
    if not getattr(model_utils.load_valuehead_model, "_agentcredit_cpu", False):

        def load_valuehead_model(local_path, torch_dtype, model_config, trust_remote_code):
            from transformers import AutoModelForTokenClassification

            return AutoModelForTokenClassification.from_pretrained(
                pretrained_model_name_or_path=local_path,
                torch_dtype=torch_dtype,
                config=model_config,
                attn_implementation=getattr(model_config, "_attn_implementation", None) or "sdpa",
                trust_remote_code=trust_remote_code,
            )

        load_valuehead_model._agentcredit_cpu = True
        model_utils.load_valuehead_model = load_valuehead_model


# ------------------------------------------------------------------------------------------------- rollout
class NoReplicaControl:
    """verl's replica control calls (wake up, sleep, abort, the KV cache, profiling) as no-ops: a server with
    nothing to free or resume (this CPU server; the GPU check's scripted server)."""

    async def wake_up(self):
        return None

    async def sleep(self):
        return None

    async def abort_all_requests(self, reject_request: bool = False):
        return None

    async def resume_generation(self):
        return None

    async def clear_kv_cache(self):
        return None

    async def release_kv_cache(self):
        return None

    async def resume_kv_cache(self):
        return None

    async def start_profile(self, **kwargs):
        return None

    async def stop_profile(self):
        return None


class CPUServer(NoReplicaControl):
    """verl's token-in/token-out server interface on the CPU: the policy in transformers, one request at a time.

    ``generate`` samples with a KV cache (temperature, top-k, top-p, a per-request ``seed``), stops at the
    tokenizer's / generation config's end-of-sequence ids or after ``max_tokens``, and returns the sampled tokens'
    log-probs when asked (``logprobs``) and vLLM's ``prompt_logprobs`` layout (one ``[logprob]`` row per prompt token
    after the first, then a padding row, as verl's ``extract_prompt_logprobs`` writes it) for teacher scoring.
    :meth:`load_weights` takes the actor's weights (sent by :class:`CPURollout` at every sync)."""

    def __init__(self, model_path: str, max_model_len: int | None = None):
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        torch.set_num_threads(1)
        self.model = AutoModelForCausalLM.from_pretrained(
            model_path, dtype=torch.float32, attn_implementation="sdpa"
        )
        self.model.eval()
        tok = AutoTokenizer.from_pretrained(model_path)
        eos = {tok.eos_token_id} if tok.eos_token_id is not None else set()
        try:
            gen_eos = GenerationConfig.from_pretrained(model_path).eos_token_id
        except OSError:
            gen_eos = None
        eos |= set(gen_eos if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else [])
        self.eos = eos
        self.max_model_len = max_model_len or int(getattr(self.model.config, "max_position_embeddings", 4096))
        self.global_steps: int | None = None
        self.weight_syncs = 0

    def load_weights(self, weights: dict[str, torch.Tensor], global_steps: int | None = None) -> int:
        """Copy the actor's weights in (verl's HF names); a name the model lacks is an error, tied weights may be
        absent. Returns how many tensors were loaded."""
        own = self.model.state_dict()
        unknown = sorted(set(weights) - set(own))
        if unknown:
            raise KeyError(f"CPU rollout: weights the model does not have: {unknown[:5]}")
        with torch.no_grad():
            for name, tensor in weights.items():
                own[name].copy_(tensor.to(own[name].dtype))
        self.weight_syncs += 1
        if global_steps is not None:
            self.global_steps = global_steps
        # one line per sync in the run's log (Ray forwards actor output to the driver): the CPU test reads it
        print(f"agentcredit cpu rollout: loaded {len(weights)} tensors, sync {self.weight_syncs}", flush=True)
        return len(weights)

    def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    def stats(self) -> dict[str, Any]:
        return {"weight_syncs": self.weight_syncs, "global_steps": self.global_steps}

    @torch.no_grad()
    def _prompt_logprobs(self, ids: list[int]) -> list[list[float]]:
        logits = self.model(torch.tensor([ids])).logits[0, :-1].float()
        lp = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(ids[1:]).unsqueeze(1))[:, 0]
        return [[float(v)] for v in lp] + [[0.0]]

    @torch.no_grad()
    def _sample(
        self, ids: list[int], max_tokens: int, params: dict[str, Any]
    ) -> tuple[list[int], list[float], str]:
        temperature = float(params.get("temperature", 1.0) or 0.0)
        top_k = int(params.get("top_k", -1) or -1)
        top_p = float(params.get("top_p", 1.0) or 1.0)
        seed = params.get("seed")
        generator = torch.Generator().manual_seed(int(seed)) if seed is not None else None
        out: list[int] = []
        log_probs: list[float] = []
        past = None
        step_input = torch.tensor([ids])
        for _ in range(max_tokens):
            result = self.model(step_input, past_key_values=past, use_cache=True)
            past = result.past_key_values
            logits = result.logits[0, -1].float()
            raw = torch.log_softmax(logits, dim=-1)
            if temperature <= 0:
                token = int(torch.argmax(logits))
            else:
                scaled = logits / temperature
                if 0 < top_k < scaled.numel():
                    kth = torch.topk(scaled, top_k).values[-1]
                    scaled = scaled.masked_fill(scaled < kth, -math.inf)
                probs = torch.softmax(scaled, dim=-1)
                if top_p < 1.0:
                    sorted_p, order = torch.sort(probs, descending=True)
                    drop = torch.cumsum(sorted_p, 0) - sorted_p > top_p
                    probs = probs.scatter(0, order, sorted_p.masked_fill(drop, 0.0))
                    probs = probs / probs.sum()
                token = int(torch.multinomial(probs, 1, generator=generator))
            out.append(token)
            log_probs.append(float(raw[token]))  # the model's log-prob, as vLLM's default (raw) logprobs
            if token in self.eos and not params.get("ignore_eos", False):
                return out, log_probs, "completed"
            step_input = torch.tensor([[token]])
        return out, log_probs, "completed"

    async def generate(
        self, prompt_ids, sampling_params: dict[str, Any], request_id: str, **kwargs
    ) -> TokenOutput:
        ids = [int(t) for t in prompt_ids]
        params = dict(sampling_params)
        room = self.max_model_len - len(ids)
        if room < 1:
            raise ValueError(
                f"prompt of {len(ids)} tokens leaves no room within max_model_len {self.max_model_len}"
            )
        max_tokens = int(params.pop("max_tokens", params.pop("max_new_tokens", room)))
        max_tokens = max(1, min(max_tokens, room))
        extra: dict[str, Any] = {"global_steps": self.global_steps, "num_cached_tokens": 0}
        if params.get("prompt_logprobs") is not None:
            extra["prompt_logprobs"] = self._prompt_logprobs(ids)
        tokens, log_probs, stop = self._sample(ids, max_tokens, params)
        return TokenOutput(
            token_ids=tokens,
            log_probs=log_probs if params.get("logprobs") else None,
            stop_reason=stop,
            extra_fields=extra,
        )


def server_name(replica_rank: int, suffix: str = "") -> str:
    """The Ray name of a replica's :class:`CPUServer` (the worker side finds it by this name)."""
    return f"agentcredit_cpu_server_{replica_rank}{suffix}"


class CPUReplica(RolloutReplica):
    """A rollout replica served by one :class:`CPUServer` Ray actor."""

    async def launch_servers(self):
        path = getattr(self.model_config, "local_path", None) or self.model_config.path
        name = server_name(self.replica_rank, self.name_suffix)
        max_len = getattr(self.config, "max_model_len", None)
        self._server_handle = (
            ray.remote(CPUServer)
            .options(name=name, max_concurrency=self.max_concurrency, num_cpus=0)
            .remote(str(path), int(max_len) if max_len else None)
        )
        self._server_address = name
        self.servers = [self._server_handle]

    def rollout_worker_use_gpu(self) -> bool:
        return False


class CPURollout(BaseRollout):
    """The worker side of the CPU rollout, in verl's hybrid actor process: at every weight sync it gathers the
    actor's full tensors (every rank takes part: FSDP's ``full_tensor`` is a collective) and the replica's first
    rank sends them to its :class:`CPUServer`."""

    def __init__(self, config, model_config, device_mesh, *args, **kwargs):
        super().__init__(config, model_config, device_mesh)
        world = (
            self.config.tensor_model_parallel_size
            * self.config.data_parallel_size
            * self.config.pipeline_model_parallel_size
        )
        rank = int(os.environ.get("RANK", 0))
        self.replica_rank, self.rollout_rank = divmod(rank, world)

    async def resume(self, tags: list[str]):
        return None

    async def release(self):
        return None

    async def update_weights(self, weights, wire_format: str = "named_tensors", global_steps=None, **kwargs):
        if wire_format != "named_tensors":
            raise ValueError(f"the CPU rollout takes full tensors, not {wire_format!r}")
        if kwargs.get("peft_config") is not None:
            raise ValueError(
                "the CPU rollout does not serve LoRA adapters: set actor_rollout_ref.model.lora.merge=true"
            )
        state = {name: tensor.detach().to("cpu", copy=True) for name, tensor in weights}
        if self.rollout_rank == 0:
            server = ray.get_actor(server_name(self.replica_rank))
            await server.load_weights.remote(state, global_steps)


def register_rollout() -> None:
    """``actor_rollout_ref.rollout.name=agentcredit_cpu`` as a verl rollout backend (replica and worker side)."""
    RolloutReplicaRegistry.register(ROLLOUT, lambda: CPUReplica)
    rollout_base._ROLLOUT_REGISTRY[(ROLLOUT, "async")] = f"{__name__}.CPURollout"


register_rollout()
if cpu_selected():
    register_engines()
    rebind_for_cpu()
