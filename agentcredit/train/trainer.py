"""The RL training loop shared by every method: rollout -> signals -> advantages -> PPO update.

One step::

    trees   = rollouts.trees(prompts, reward, step)           # rollout (rollout.driver: strategy, engine, vLLM)
    batch   = build_batch(trees)                             # trajectories -> rows, masks, segment ids
    signals = old log-probs, entropies, critic values, reference log-probs, + the method's providers'
    adv     = compute_advantages(algorithm config, ...)      # METHODS[...].advantages(layout, settings)
    update  = epochs x minibatches of trajectories, each split into microbatches by a token budget:
              policy_loss (PPO clip, aggregated by loss_agg) + kl_coef * KL - entropy_coef * H + value_coef * L_V

Every method is a setting of ``config.algorithm`` and ``config.rollout``; nothing here branches on a method name:
what a method reads beyond the scores is computed by the signal providers its :class:`~agentcredit.credit.Needs`
name (:mod:`agentcredit.train.providers`).
Losses of a minibatch are computed with per-token weights fixed over the whole minibatch
(:func:`agentcredit.credit.aggregation_weights`), so the microbatch split never changes the gradient.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from agentcredit.config import Config, dump_config
from agentcredit.credit import aggregation_weights, policy_loss_stats
from agentcredit.environment import Environment, build_environment
from agentcredit.models.device import config_precision, model_device
from agentcredit.models.heads import initial_value_head
from agentcredit.models.loading import frozen_copy, load_policy
from agentcredit.models.scoring import TokenScores, score_tokens
from agentcredit.progress import Progress
from agentcredit.rollout.driver import RolloutDriver
from agentcredit.rollout.tree import RolloutTree
from agentcredit.tasks import Example, load_examples
from agentcredit.train.advantages import compute_advantages
from agentcredit.train.batch import TrainBatch, actions_per_question, build_batch
from agentcredit.train.checkpoint import load_checkpoint, save_checkpoint
from agentcredit.train.logging import MetricsLogger
from agentcredit.train.losses import total_loss, value_weights
from agentcredit.train.metrics import credit_by_step_kind, episode_metrics, signal_metrics, step_credits
from agentcredit.train.optim import adamw
from agentcredit.train.providers import RunContext, SignalProvider, signal_providers
from agentcredit.train.rng import PromptSampler, rng_state, seed_everything, set_rng_state
from agentcredit.train.signals import (
    Signals,
    critic_values,
    row_tokens,
    score_batch,
    trained_row_chunks,
)
from agentcredit.train.warmup import gate_metrics, require_warmup, start_gate

#: Update metrics summed over the update's optimiser steps (the rest are means): the tokens of the rows trained,
#: and the positions actually fed to the decoder, where each prefix shared within a micro-batch counts once.
_UPDATE_TOTALS = ("update/tokens_in_rows", "update/tokens_forwarded")


@dataclass
class StepResult:
    metrics: dict[str, float]
    trees: list[RolloutTree]
    batch: TrainBatch
    examples: list[Example] = field(default_factory=list)  # the step's prompts, tree i <- examples[i]


class NonFiniteLoss(RuntimeError):
    pass


# ------------------------------------------------------------------------------------------------ trainer
class Trainer:
    """Builds everything a run needs from a :class:`Config` and trains; see the module docstring."""

    def __init__(
        self,
        config: Config,
        *,
        run_dir: str | Path | None = None,
        model: Any = None,
        tokenizer: Any = None,
        environment: Environment | None = None,
        examples: list[Example] | None = None,
        log: bool = True,
    ):
        self.cfg = config
        # before anything loads: a critic whose warm-up gate failed stops here unless train.allow_failed_gate
        self.warmup_gate = start_gate(config)
        seed_everything(config.train.seed)
        # model.device: the policy and everything made from it (critic, reference, teachers, value head) live
        # there; batches stay on the host and each micro-batch goes to the device for its pass
        self.model, self.tokenizer = load_policy(config, model=model, tokenizer=tokenizer)
        self.device = model_device(self.model)
        self.precision = config_precision(config, self.device)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.value_head = initial_value_head(config, self.model.config.hidden_size)
        a = config.algorithm
        # algorithm.critic_model='separate': the value head reads its own copy of the initial model (verl's critic,
        # TIPS's "critic initialised from the same base model", tips.md §4), so the value loss never reaches the
        # policy's weights; 'shared': the head sits on the policy's backbone (carl-segment §3.4)
        self.critic_model = (
            copy.deepcopy(self.model)
            if self.value_head is not None and a.critic_model == "separate"
            else None
        )
        self.lora = config.model.lora.enabled
        # the KL reference: the initial policy (with LoRA: the same model with its adapters switched off)
        needs_ref = a.kl_coef > 0 or a.log_kl_ref
        self.ref_model = frozen_copy(self.model) if needs_ref and not self.lora else None
        self.optimizer = self._optimizer()
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            lambda s: min(1.0, (s + 1) / config.optim.warmup_steps) if config.optim.warmup_steps else 1.0,
        )
        # the rollout side, built once: strategy, the model it generates with, vLLM under rollout.backend=vllm
        self.rollouts = RolloutDriver(
            config.rollout,
            self.model,
            self.tokenizer,
            precision=self.precision,
            seed=config.train.seed,
            lora=self.lora,
        )
        self.env = environment or build_environment(config)
        # what the method reads besides rewards (agentcredit.credit.methods): a provider computes each signal its
        # needs name that the trainer's own scoring does not (agentcredit.train.providers)
        self.providers = signal_providers(
            RunContext(self.model, self.tokenizer, self.env, config),
            a.credit_method.all_needs,
            a.credit_method.settings_from(a),
        )
        self.examples = examples if examples is not None else load_examples(config)
        self.sampler = PromptSampler(self.examples, config.train.seed)
        self.step = 0
        self.nonfinite_in_row = 0
        self.ev_positive_step: int | None = None  # the first step whose critic explained variance was > 0
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.logger = (
            MetricsLogger(
                self.run_dir,
                tensorboard=config.train.tensorboard,
                wandb=config.train.wandb,
                wandb_project=config.train.wandb_project,
                config=config.model_dump(mode="json"),
            )
            if (log and self.run_dir is not None)
            else None
        )
        if self.run_dir is not None:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.yaml").write_text(dump_config(config))
            if self.warmup_gate is not None:  # what the run's critic started from; read by its reports
                (self.run_dir / "warmup_gate.json").write_text(json.dumps(self.warmup_gate, indent=2))

    # -------------------------------------------------------------- optimiser
    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def critic_parameters(self) -> list[torch.nn.Parameter]:
        """The value head's parameters, and the separate critic model's trainable ones when there is one."""
        params = list(self.value_head.parameters()) if self.value_head is not None else []
        if self.critic_model is not None:
            params += [p for p in self.critic_model.parameters() if p.requires_grad]
        return params

    def _optimizer(self) -> torch.optim.Optimizer:
        o = self.cfg.optim
        groups = [{"params": self.trainable_parameters(), "lr": o.lr, "weight_decay": o.weight_decay}]
        if self.critic_model is not None:  # the whole critic trains at the critic's LR (TIPS §4: 1e-5)
            groups.append(
                {
                    "params": [p for p in self.critic_model.parameters() if p.requires_grad],
                    "lr": o.head_lr,
                    "weight_decay": o.weight_decay,
                }
            )
        if self.value_head is not None:
            groups.append(
                {
                    "params": list(self.value_head.parameters()),
                    "lr": o.head_lr,
                    "weight_decay": o.head_weight_decay,
                }
            )
        return adamw(groups, betas=tuple(o.betas))

    # -------------------------------------------------------------- rollout
    def rollout(self, examples: list[Example]) -> tuple[list[RolloutTree], dict[str, float]]:
        """The step's trees and rollout stats (:meth:`agentcredit.rollout.driver.RolloutDriver.trees`)."""
        return self.rollouts.trees(examples, self.env, self.step)

    # -------------------------------------------------------------- signals
    @contextlib.contextmanager
    def _reference(self):
        """The KL reference model: the frozen copy, or the policy with its LoRA adapters disabled."""
        if self.ref_model is not None:
            yield self.ref_model
        else:
            with self.model.disable_adapter():
                yield self.model

    @torch.no_grad()
    def compute_signals(
        self, batch: TrainBatch, trees: list[RolloutTree], examples: list[Example]
    ) -> Signals:
        cfg, a = self.cfg, self.cfg.algorithm
        temp = cfg.rollout.temperature if cfg.rollout.temperature > 0 else 1.0
        autocast = self.precision.autocast
        self.model.eval()
        logp, entropy, values = score_batch(
            self.model,
            batch,
            value_head=self.value_head if self.critic_model is None else None,
            value_mask=batch.policy_mask,
            temperature=temp,
            autocast=autocast,
            with_entropy=True,
            max_tokens=cfg.train.micro_batch_tokens,
        )
        if self.critic_model is not None:
            self.critic_model.eval()
            values = critic_values(
                self.critic_model,
                self.value_head,
                batch,
                batch.policy_mask,
                autocast=autocast,
                max_tokens=cfg.train.micro_batch_tokens,
            )
        batch.old_logp, batch.old_entropy, batch.old_values = logp, entropy, values
        if a.kl_coef > 0 or a.log_kl_ref:  # log_kl_ref: policy/kl_ref is logged though the loss has no KL
            with self._reference() as ref:
                batch.ref_logp, _, _ = score_batch(
                    ref,
                    batch,
                    temperature=temp,
                    autocast=autocast,
                    with_entropy=False,
                    max_tokens=cfg.train.micro_batch_tokens,
                )
        signals = Signals(values=values, entropy=entropy)
        by_tree = {i: ex for i, ex in enumerate(examples)}
        for provider in self.providers:  # the signals the method's needs name beyond the scores above
            provider.fill(signals, batch, trees, by_tree, temperature=temp, autocast=autocast)
        return signals

    # -------------------------------------------------------------- update
    def update(self, batch: TrainBatch) -> dict[str, float]:
        cfg, o = self.cfg, self.cfg.optim
        self.model.train()
        temp = cfg.rollout.temperature if cfg.rollout.temperature > 0 else 1.0
        n_traj = len(batch.trajectories)
        mb_size = o.minibatch_size or n_traj
        rng = random.Random(f"{cfg.train.seed}-update-{self.step}")
        sums: dict[str, float] = {}
        counts = skipped = 0
        critic_only = self.step < cfg.train.critic_warmup
        for _ in range((cfg.train.critic_warmup_epochs or o.epochs) if critic_only else o.epochs):
            order = list(range(n_traj))
            rng.shuffle(order)
            for start in range(0, n_traj, mb_size):
                trajs = order[start : start + mb_size]
                rows = [r for j in trajs for r in batch.trajectories[j].rows]
                stats = self._minibatch_step(batch.select(rows), temp)
                if stats is None:  # non-finite loss: this optimiser step was skipped
                    skipped += 1
                    continue
                counts += 1
                for k, v in stats.items():
                    sums[k] = sums.get(k, 0.0) + v
        out = {k: v / counts for k, v in sums.items()} if counts else {}
        for k in _UPDATE_TOTALS:  # what the whole update cost, not a mean over its optimiser steps
            if k in sums:
                out[k] = sums[k]
        out["update/nonfinite_skipped"] = float(skipped)
        return out

    def _minibatch_step(self, mb: TrainBatch, temp: float) -> dict[str, float] | None:
        cfg, a = self.cfg, self.cfg.algorithm
        seg_ids = mb.segment_ids if a.loss_agg == "segment-mean" else None
        weights = aggregation_weights(
            mb.loss_mask, a.loss_agg, segment_ids=seg_ids, sequence_ids=mb.row_traj
        ).float()
        critic = a.critic != "none" and mb.value_mask is not None
        v_weights = value_weights(mb.value_mask, mb.row_traj, a.critic) if critic else None
        # verl's critic warm-up: fit V to this policy's returns before its advantages move the policy. A shared
        # head's backbone is the policy's, so it gets no gradient either (the policy stays as it is); a separate
        # critic trains whole, as verl's does.
        critic_only = self.step < cfg.train.critic_warmup
        separate = critic and self.critic_model is not None
        self.optimizer.zero_grad(set_to_none=True)
        totals = {
            "loss/policy": 0.0,
            "loss/kl": 0.0,
            "loss/entropy": 0.0,
            "loss/value": 0.0,
            "loss/total": 0.0,
            "update/tokens_in_rows": 0.0,
            "update/tokens_forwarded": 0.0,
        }
        logp_all = torch.zeros_like(mb.old_logp)
        for rows in trained_row_chunks(
            self.model, row_tokens(mb), mb.loss_mask, v_weights, max_tokens=cfg.train.micro_batch_tokens
        ):
            sub = mb.select(rows).to(self.device)  # the host batch's rows, on the model's device
            width = sub.input_ids.shape[1]
            w = weights[rows][:, :width].to(self.device)
            vmask = sub.value_mask if critic else None
            # a critic-only step of a separate critic needs no pass of the policy
            scores = (
                TokenScores(torch.zeros_like(w), None, None)
                if critic_only and separate
                else score_tokens(
                    self.model,
                    sub.input_ids,
                    sub.attention_mask,
                    torch.zeros_like(sub.loss_mask) if critic_only else sub.loss_mask,
                    value_head=self.value_head if critic and not separate else None,
                    value_mask=vmask,
                    temperature=temp,
                    with_entropy=a.entropy_coef > 0 and not critic_only,
                    autocast=self.precision.autocast,
                    backbone_grad=not critic_only,
                    share_prefixes=True,
                )
            )
            if separate:  # V from the critic's own forward pass; its whole model trains, in warm-up steps too
                judged = score_tokens(
                    self.critic_model,
                    sub.input_ids,
                    sub.attention_mask,
                    torch.zeros_like(sub.loss_mask),
                    value_head=self.value_head,
                    value_mask=vmask,
                    with_entropy=False,
                    autocast=self.precision.autocast,
                    share_prefixes=True,
                )
                scores.values = judged.values
                scores.forwarded += judged.forwarded
            if not torch.isfinite(scores.logprobs[sub.loss_mask]).all():
                return self._skip_nonfinite()  # a diverged forward pass (the inputs themselves are checked)
            loss, parts = total_loss(
                scores,
                sub,
                w,
                v_weights[rows][:, :width].to(self.device) if critic else None,
                a,
                train_policy=not critic_only,
            )
            for name, value in parts.items():
                totals[name] += value
            totals["update/tokens_in_rows"] += float(sub.attention_mask.sum())
            totals["update/tokens_forwarded"] += float(scores.forwarded)
            if not torch.isfinite(loss):
                return self._skip_nonfinite()
            loss.backward()
            totals["loss/total"] += float(loss.detach())
            logp_all[rows, :width] = scores.logprobs.detach().to(logp_all.device)
        self.nonfinite_in_row = 0
        # the policy's and the critic's gradients are clipped each on its own (optim.grad_clip), as verl's separate
        # actor and critic optimisers do: under one joint clip a large value loss set the policy's step size
        grad_norm = torch.nn.utils.clip_grad_norm_(self.trainable_parameters(), cfg.optim.grad_clip)
        critic_norm = (
            torch.nn.utils.clip_grad_norm_(self.critic_parameters(), cfg.optim.grad_clip)
            if self.value_head is not None
            else None
        )
        self.optimizer.step()
        # free the gradients now, not at the next zero_grad: they are as large as the weights (0.5 GB for
        # SmolLM2-135M) and would otherwise stay resident through the next rollout, signals and evaluation
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        out = dict(totals)
        out["update/grad_norm"] = float(grad_norm)  # the policy's (before clipping)
        if critic_norm is not None:
            out["update/critic_grad_norm"] = float(critic_norm)
        out["update/lr"] = self.scheduler.get_last_lr()[0]
        if critic_only:  # no policy ratios were computed: nothing was clipped and the policy did not move
            out["update/critic_only"] = 1.0
            return out
        stats = policy_loss_stats(logp_all, mb.old_logp, mb.advantages, mb.loss_mask, clip_eps=a.clip_eps)
        out["update/clip_fraction"] = stats["clip_fraction"]
        out["update/approx_kl"] = stats["approx_kl"]
        return out

    def _skip_nonfinite(self) -> None:
        """Drop this optimiser step; stop the run after ``train.max_nonfinite`` such steps in a row."""
        self.optimizer.zero_grad(set_to_none=True)
        self.nonfinite_in_row += 1
        if self.nonfinite_in_row >= self.cfg.train.max_nonfinite:
            raise NonFiniteLoss(
                f"step {self.step}: {self.nonfinite_in_row} non-finite losses in a row (train.max_nonfinite)"
            )
        return None

    # -------------------------------------------------------------- one step
    def train_step(self) -> StepResult:
        """One step: sample the step's prompts, roll them out, then :meth:`learn` from the trees."""
        t0 = time.perf_counter()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        examples = self.sampler.next(self.cfg.rollout.prompts_per_step)
        trees, rollout_stats = self.rollout(examples)
        rollout_time = time.perf_counter() - t0
        result = self.learn(trees, examples)
        kept = (
            "rollout/generated_tokens",
            "rollout/tokens_per_second",
            "rollout/backend_startup_seconds",
            "rollout/weight_push_seconds",
        )
        result.metrics.update({k: v for k, v in rollout_stats.items() if k in kept})
        result.metrics.update(gate_metrics(self.warmup_gate))  # the critic's start, on every step
        result.metrics["time/rollout"] = rollout_time
        if (
            self.device.type == "cuda"
        ):  # the step's peak on the GPU (on the CPU, RSS is the run's; see runtime)
            result.metrics["memory/gpu_peak_gib"] = torch.cuda.max_memory_allocated(self.device) / 1024**3
        # rollout + signals + update, as before learn() was split out (not the metric bookkeeping after them)
        result.metrics["time/step"] = (
            rollout_time + result.metrics["time/signals"] + result.metrics["time/update"]
        )
        return result

    def learn(self, trees: list[RolloutTree], examples: list[Example]) -> StepResult:
        """Everything a step does after its rollout: signals -> advantages -> update (tree ``i`` answers
        ``examples[i]``). Deterministic given the trees, so tests can pin it on stored trees."""
        timings: dict[str, float] = {}
        t1 = time.perf_counter()
        batch = build_batch(trees, pad_id=self.pad_id)
        signals = self.compute_signals(batch, trees, examples)
        adv = compute_advantages(self.cfg.algorithm, batch, trees, signals)
        batch.advantages, batch.loss_mask = adv.advantages, adv.loss_mask
        batch.advantage_parts = torch.stack(adv.parts, dim=-1) if adv.parts is not None else None
        batch.returns, batch.value_mask = adv.returns, adv.value_mask
        timings["time/signals"] = time.perf_counter() - t1
        t2 = time.perf_counter()
        update_stats = self.update(batch)
        timings["time/update"] = time.perf_counter() - t2
        self.step += 1
        metrics = {
            **episode_metrics(trees, examples),
            **adv.stats,
            "update/actions_per_question": actions_per_question(batch, batch.policy_mask),
            "update/actions_updated_per_question": actions_per_question(batch, batch.loss_mask),
            **credit_by_step_kind(step_credits(trees, examples, batch)),
            **signal_metrics(batch, signals, self.cfg.algorithm.credit_method.parts),
            **update_stats,
            **timings,
        }
        ev = metrics.get("critic/explained_variance", math.nan)
        if self.ev_positive_step is None and ev > 0:  # NaN (undefined EV) is not > 0
            self.ev_positive_step = self.step
        if self.ev_positive_step is not None:
            # logged at every step from then on: a critic with EV <= 0 is one baseline for the batch, and PPO's or
            # TIPS's advantages are whitened REINFORCE until this step
            metrics["critic/ev_first_positive_step"] = float(self.ev_positive_step)
        for provider in self.providers:
            provider.after_step(self.step)
        return StepResult(metrics, trees, batch, examples)

    def frozen_models(self) -> list[torch.nn.Module]:
        """The models the update never trains: the KL reference and the signal providers' (a lagged teacher)."""
        own = [self.ref_model] if self.ref_model is not None else []
        return own + [m for provider in self.providers for m in provider.frozen_models()]

    def signal_provider(self, signal: str) -> SignalProvider:
        """The provider that computes ``signal`` for this run's method."""
        try:
            return next(p for p in self.providers if signal in p.provides)
        except StopIteration:
            raise ValueError(f"this run's method needs no provider for {signal!r}") from None

    # -------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        if self.lora:
            from peft import get_peft_model_state_dict

            model_state = get_peft_model_state_dict(self.model)
        else:
            model_state = self.model.state_dict()
        return {
            "step": self.step,
            "model": model_state,
            "value_head": self.value_head.state_dict() if self.value_head is not None else None,
            "critic_model": self.critic_model.state_dict() if self.critic_model is not None else None,
            **{key: value for provider in self.providers for key, value in provider.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "sampler": self.sampler.state_dict(),
            "rng": rng_state(),
            "nonfinite_in_row": self.nonfinite_in_row,
            "ev_positive_step": self.ev_positive_step,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.lora:
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(self.model, state["model"])
        else:
            self.model.load_state_dict(state["model"])
        if self.value_head is not None:
            self.value_head.load_state_dict(state["value_head"])
        if self.critic_model is not None:
            if state.get("critic_model") is None:
                raise ValueError(
                    "this checkpoint has no separate critic model but algorithm.critic_model='separate'"
                )
            self.critic_model.load_state_dict(state["critic_model"])
        for provider in self.providers:
            provider.load_state_dict(state)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.sampler.load_state_dict(state["sampler"])
        set_rng_state(state["rng"])
        self.step = state["step"]
        self.nonfinite_in_row = state.get("nonfinite_in_row", 0)
        self.ev_positive_step = state.get("ev_positive_step")

    def save(self) -> Path:
        if self.run_dir is None:
            raise ValueError("this trainer has no run directory to save checkpoints in")
        return save_checkpoint(
            self.run_dir,
            self.step,
            self.state_dict(),
            config_yaml=dump_config(self.cfg),
            keep=self.cfg.train.keep_checkpoints,
        )

    def resume(self, path: str | Path) -> None:
        self.load_state_dict(load_checkpoint(path))
        if self.logger is not None:  # steps logged after that checkpoint are redone: never count them twice
            self.logger.drop_after(self.step)

    def save_model(self, directory: str | Path) -> Path:
        """The policy as a Hugging Face model directory (LoRA merged), loadable as ``model.name``."""
        directory = Path(directory)
        model = self.model.merge_and_unload() if self.lora else self.model
        model.save_pretrained(directory, safe_serialization=True)
        self.tokenizer.save_pretrained(directory)
        if self.critic_model is not None:  # the head reads the critic's own model: saved together, apart
            critic_dir = directory / "critic"
            critic = self.critic_model.merge_and_unload() if self.lora else self.critic_model
            critic.save_pretrained(critic_dir, safe_serialization=True)
            torch.save(self.value_head.state_dict(), critic_dir / "value_head.pt")
        elif self.value_head is not None:
            torch.save(self.value_head.state_dict(), directory / "value_head.pt")
        return directory

    # -------------------------------------------------------------- loop
    def train(self, *, progress: bool = True, on_step=None) -> list[dict[str, float]]:
        cfg = self.cfg.train
        require_warmup(
            self.warmup_gate, self.cfg
        )  # RL starts here: not with a never-warmed critic unless asked
        history = []
        # a line per step on a pipe (`make demo | tee log`, CI): a step takes seconds to minutes
        with Progress(
            self.cfg.method, total=cfg.steps, unit="steps", every=0, initial=self.step, enabled=progress
        ) as bar:
            while self.step < cfg.steps:
                result = self.train_step()
                history.append(result.metrics)
                if self.logger is not None:
                    self.logger.log(self.step, result.metrics)
                m = result.metrics
                info = (
                    f"reward {m.get('reward/mean', math.nan):.3f} "
                    f"acc {m.get('accuracy', math.nan):.3f} {m.get('time/step', 0):.0f}s/step"
                )
                bar.advance(self.step - bar.done, info=info)
                if on_step is not None:
                    on_step(self, result)
                if (
                    self.run_dir is not None
                    and cfg.dump_episodes_every
                    and self.step % cfg.dump_episodes_every == 0
                ):
                    # per-token advantages of this step, for `agentcredit view`
                    from agentcredit.train.credit_records import write_credit_episodes

                    write_credit_episodes(
                        self.run_dir / "episodes" / f"step-{self.step:06d}.jsonl",
                        result,
                        self.tokenizer,
                        step=self.step,
                        method=self.cfg.method,
                    )
                if self.run_dir is not None and cfg.save_every and self.step % cfg.save_every == 0:
                    self.save()
        if self.run_dir is not None:
            self.save()
        return history

    def close(self) -> None:
        if self.logger is not None:
            self.logger.close()
        self.rollouts.close()
        self.env.close()
