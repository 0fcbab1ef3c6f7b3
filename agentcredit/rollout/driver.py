"""A training run's rollouts: built once from ``config.rollout``, asked for each step's trees with one call.

It owns what the rollout side of training needs across steps: the strategy ``rollout.strategy`` names, the model
the engine generates with (the policy, or a copy in the rollout dtype refreshed after each update), and with
``rollout.backend: vllm`` the running vLLM engine with the policy's current weights pushed in. The trainer hands
it the policy once and asks :meth:`RolloutDriver.trees` at every step, naming the environment the episodes run in.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import torch

from agentcredit.rollout.engine import EngineConfig, RolloutEngine
from agentcredit.rollout.infra import raise_on_infra_failures
from agentcredit.rollout.sampling import SamplingParams
from agentcredit.rollout.strategies import from_rollout_config

if TYPE_CHECKING:
    from agentcredit.config import RolloutConfig
    from agentcredit.models.device import Precision
    from agentcredit.rollout.tree import RolloutTree


class RolloutDriver:
    """The rollouts of one training run (see the module docstring).

    Args:
        rollout: the run's ``config.rollout``.
        policy: the trained model; updated in place by the trainer, read here at every step.
        tokenizer: the policy's tokenizer.
        precision: the policy's precision (:func:`~agentcredit.models.device.config_precision`); its ``rollout``
            dtype is what the engine generates in.
        seed: ``train.seed``; step ``s``'s engine samples with ``seed * 1_000_003 + s``.
        lora: the policy carries LoRA adapters (vLLM cannot take them).
    """

    def __init__(
        self,
        rollout: RolloutConfig,
        policy: Any,
        tokenizer: Any,
        *,
        precision: Precision,
        seed: int,
        lora: bool = False,
    ):
        self.cfg, self.policy, self.tokenizer = rollout, policy, tokenizer
        self.precision, self.seed, self.lora = precision, seed, lora
        self.strategy = from_rollout_config(rollout)
        self._copy: Any = None  # the policy in the rollout dtype, when that is not the weights' dtype
        self._copy_step = 0  # the step whose weights it holds
        self.vllm: Any = None  # rollout.backend=vllm: the running engine (vllm_backend)
        self._vllm_step = 0  # the step whose weights it holds
        self._backend_stats: dict[str, float] = {}

    def model(self, step: int) -> Any:
        """The model the engine generates with at ``step``: the policy, or its copy in the rollout dtype."""
        rollout = self.precision.rollout
        if rollout == self.precision.weights:
            return self.policy
        if self._copy is None or self._copy_step != step:
            self._copy = copy.deepcopy(self.policy).to(rollout).eval()
            self._copy_step = step
        return self._copy

    def backend(self, step: int) -> Any:
        """``rollout.backend: vllm``: the running vLLM engine (started on first use), holding the policy's weights
        of ``step``: they are pushed in after every update (no reload from disk), and the push is timed
        (``rollout/weight_push_seconds``; the start-up is ``rollout/backend_startup_seconds`` at the first step)."""
        if self.vllm is None:
            from agentcredit.rollout.vllm_backend import VLLMBackend, vllm_available

            if not vllm_available():
                raise RuntimeError(
                    "rollout.backend=vllm: vllm is not installed here (pip install 'agentcredit[vllm]', the "
                    "CPU build; on a GPU the CUDA build), or set rollout.backend=hf"
                )
            if self.lora:
                raise ValueError(
                    "rollout.backend=vllm does not push LoRA adapters (model.lora.enabled); use rollout.backend=hf"
                )
            self.vllm = VLLMBackend(
                self.model(step),
                self.tokenizer,
                threads=torch.get_num_threads(),
                temperature=self.cfg.temperature,
                seed=self.seed,
                gpu_memory_fraction=self.cfg.vllm_gpu_memory_fraction,  # colocated on model.device when a GPU
            )
            self._vllm_step = step
            self._backend_stats = {
                "rollout/backend_startup_seconds": self.vllm.startup_seconds,
                "rollout/weight_push_seconds": self.vllm.push_seconds[-1],
            }
        elif self._vllm_step != step:  # the policy was updated since the last push
            self._backend_stats = {"rollout/weight_push_seconds": self.vllm.push_weights(self.model(step))}
            self._vllm_step = step
        return self.vllm

    def engine(
        self, env: Any, step: int, *, temperature: float | None = None, seed: int | None = None
    ) -> RolloutEngine:
        """The engine for ``step``'s rollouts; ``temperature`` / ``seed`` override the run's (a precondition's
        sampling, rejection sampling). Training rollouts go to vLLM under ``rollout.backend: vllm``; with another
        temperature the engine stays on the HF model."""
        r = self.cfg
        sampling = SamplingParams(
            temperature=r.temperature if temperature is None else temperature, top_p=r.top_p, top_k=r.top_k
        )
        engine_cfg = EngineConfig(
            sampling=sampling,
            max_segment_tokens=r.max_new_tokens,
            max_episode_tokens=r.max_episode_tokens,
            max_turns=r.max_turns,
            seed=self.seed * 1_000_003 + step if seed is None else seed,
            max_batch=r.max_batch,
        )
        if r.backend == "vllm" and temperature is None:
            return RolloutEngine(self.backend(step), self.tokenizer, env.protocol, env.tools, engine_cfg)
        return RolloutEngine.for_hf_model(
            self.model(step), self.tokenizer, env.protocol, env.tools, engine_cfg
        )

    @torch.no_grad()
    def trees(self, examples: list[Any], env: Any, step: int) -> tuple[list[RolloutTree], dict[str, float]]:
        """The trees of training step ``step`` (0-based: the number of updates so far) in ``env`` (an
        :class:`~agentcredit.environment.Environment`, a layer above: its protocol, tools and reward), and the
        rollout's stats.

        An episode in which a tool could not run (``ToolResult.infra``: sandbox or corpus unavailable) stops
        training with ToolUnavailableError: its error text is not the tool's answer, and dropping its group would
        silently change the batch (the environment's preflight makes this rare)."""
        was_training = self.policy.training
        self.policy.eval()
        engine = self.engine(env, step)
        trees = engine.run(examples, self.strategy, env.reward)
        self.policy.train(was_training)
        raise_on_infra_failures(trees, f"training (step {step + 1})")
        stats = {f"rollout/{k}": float(v) for k, v in engine.stats.to_dict().items()}
        stats.update(self._backend_stats)
        self._backend_stats = {}
        return trees, stats

    def close(self) -> None:
        if self.vllm is not None:
            self.vllm.close()
            self.vllm = None
