"""What ``agentcredit eval --model`` accepts, loaded for evaluation: policy, tokenizer and (if any) critic.

* ``embedded`` (SmolLM2-135M-Instruct) or ``tiny`` (the random test model): no critic.
* a Hugging Face model directory (``config.json``), e.g. an SFT or warm-up output or ``Trainer.save_model``; a
  ``value_head.pt`` beside the weights is the critic (its kind is read from the state-dict keys).
* a run directory (``config.yaml`` + ``checkpoints/``): its saved model in ``<run>/model`` when there is one,
  otherwise its latest checkpoint, rebuilt on the run's own config (base model, LoRA adapters merged, value
  head of ``algorithm.critic``).
* one checkpoint directory (``<run>/checkpoints/step-000042``, with ``state.pt`` and ``config.yaml``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentcredit.config import Config, load_config

BUILTIN_MODELS = ("embedded", "tiny")


@dataclass
class LoadedPolicy:
    model: Any
    tokenizer: Any
    value_head: torch.nn.Module | None
    run_config: Config | None  # the config of the run the weights come from (None for a bare model)
    source: str  # what was loaded, for logs and summary.json
    critic_model: Any = None  # the model the value head reads when the critic is a separate model

    def to(self, device: torch.device) -> LoadedPolicy:
        """Everything loaded, on ``device`` (the evaluation's ``model.device``); returns itself."""
        for name in ("model", "value_head", "critic_model"):
            part = getattr(self, name)
            if part is not None:
                setattr(self, name, part.to(device))
        return self


def value_head_from_state(state: dict[str, torch.Tensor], hidden_size: int, *, where: str) -> torch.nn.Module:
    """A value head rebuilt from its state dict; the kind (boundary MLP or token linear) is read from the keys."""
    from agentcredit.models.heads import make_value_head

    keys = set(state)
    if {"fc1.weight", "fc2.weight"} <= keys:
        kind = "boundary"
    elif "proj.weight" in keys:
        kind = "token"
    else:
        raise ValueError(f"{where}: not a value head state dict (keys {sorted(keys)[:6]})")
    head = make_value_head(kind, hidden_size)
    try:
        head.load_state_dict(state)
    except RuntimeError as exc:
        raise ValueError(
            f"{where}: does not fit a {kind!r} value head of width {hidden_size} ({exc})"
        ) from None
    head.eval()
    return head


def _hf_dir(path: Path, dtype: str, run_config: Config | None, source: str) -> LoadedPolicy:
    from agentcredit.models.loading import load_base_model

    model, tokenizer = load_base_model(str(path), dtype)
    head = critic = None
    saved = path / "value_head.pt"
    if (path / "critic" / "value_head.pt").is_file():  # a separate critic model (Trainer.save_model)
        saved = path / "critic" / "value_head.pt"
        critic, _ = load_base_model(str(path / "critic"), dtype)
        critic.eval()
    if saved.is_file():
        state = torch.load(saved, map_location="cpu", weights_only=True)
        head = value_head_from_state(state, model.config.hidden_size, where=str(saved))
    return LoadedPolicy(model, tokenizer, head, run_config, source, critic)


def _checkpoint_config(ckpt: Path) -> Path:
    """The checkpoint's own config.yaml, or its run's (``<run>/checkpoints/step-N`` -> ``<run>/config.yaml``)."""
    candidates = [ckpt / "config.yaml", ckpt.parent.parent / "config.yaml"]
    for candidate in candidates:
        if candidate.is_file() and candidate.read_text().strip():
            return candidate
    raise FileNotFoundError(
        f"{ckpt}: checkpoint without a config (looked for {', '.join(map(str, candidates))})"
    )


def _checkpoint(ckpt: Path) -> LoadedPolicy:
    from agentcredit.models.heads import make_value_head
    from agentcredit.models.loading import load_policy
    from agentcredit.train.checkpoint import load_checkpoint

    cfg = load_config(_checkpoint_config(ckpt))
    state = load_checkpoint(ckpt)
    # loaded on the host: the evaluation's own model.device places it (the run may have trained elsewhere)
    model, tokenizer = load_policy(cfg, device="cpu")
    if cfg.model.lora.enabled:
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, state["model"])
        model = model.merge_and_unload()  # plain weights: faster decoding, same outputs
    else:
        model.load_state_dict(state["model"])
    head = critic = None
    if state.get("value_head") is not None:
        head = make_value_head(cfg.algorithm.critic, model.config.hidden_size)
        if head is None:
            raise ValueError(
                f"{ckpt}: holds a value head but its method ({cfg.algorithm.method}) has no critic"
            )
        head.load_state_dict(state["value_head"])
        head.eval()
    if state.get("critic_model") is not None:  # the head reads a separate critic model
        critic, _ = load_policy(cfg, device="cpu")
        critic.load_state_dict(state["critic_model"])
        if cfg.model.lora.enabled:
            critic = critic.merge_and_unload()
        critic.eval()
    model.eval()
    source = f"checkpoint {ckpt} (step {state.get('step')})"
    return LoadedPolicy(model, tokenizer, head, cfg, source, critic)


def load_for_eval(spec: str | Path, *, dtype: str = "float32", seed: int = 0) -> LoadedPolicy:
    """Load ``spec`` (see the module docstring); a clear error names what was expected."""
    from agentcredit.train.checkpoint import latest_checkpoint

    if str(spec) in BUILTIN_MODELS:
        from agentcredit.models.loading import load_base_model

        model, tokenizer = load_base_model(str(spec), dtype, seed=seed)
        model.eval()
        return LoadedPolicy(model, tokenizer, None, None, str(spec))
    path = Path(spec)
    if not path.exists():
        raise FileNotFoundError(
            f"--model {spec}: no such file or directory (give 'embedded', a model directory, a run directory "
            "or a checkpoint directory)"
        )
    if (path / "state.pt").is_file():  # one checkpoint
        return _checkpoint(path)
    if (path / "config.yaml").is_file() and ((path / "checkpoints").is_dir() or (path / "model").is_dir()):
        run_config = load_config(path / "config.yaml")
        if (path / "model" / "config.json").is_file():
            return _hf_dir(path / "model", dtype, run_config, f"saved model of run {path}")
        ckpt = latest_checkpoint(path)
        if ckpt is None:
            raise FileNotFoundError(f"{path}: run directory without a complete checkpoint or saved model")
        return _checkpoint(ckpt)
    if (path / "config.json").is_file():
        return _hf_dir(path, dtype, None, f"model directory {path}")
    raise ValueError(
        f"--model {spec}: not a model directory (no config.json), run directory (config.yaml + checkpoints/) "
        "or checkpoint directory (state.pt)"
    )
