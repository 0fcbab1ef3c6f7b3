"""One-GPU check of the verl integration: verl 0.9.1's real sync-trainer ``fit()`` through ``AgentCreditTrainer``.

For each method (default: carl-segment, grpo, ppo) it runs two training steps on one GPU with real Ray,
TransferQueue and FSDP actor / reference / critic workers, on a random two-layer Qwen2 built here (no download),
with the LLM server replaced by a scripted one (:class:`ScriptedServer`: no vLLM needed), and prints, per step, the
losses and the agentcredit metrics; it exits non-zero when a loss is missing or not finite. ``--dry-run`` builds
the model and data and composes and validates every config (verl's ``validate_config`` and agentcredit's checks)
without Ray or a GPU; ``tests/integrations/test_verl_gpu_check.py`` runs that part on CPU.

    python scripts/verl_gpu_check.py --workdir /tmp/verl-gpu-check

``scripts/verl_gpu_check.md`` says what it needs and what it checks. It has not run on a GPU yet.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ray
import torch
from verl.workers.rollout import base as rollout_base
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, RolloutReplicaRegistry, TokenOutput

# the replica control no-ops; importing the module registers the cpu platform by name and selects nothing
# (only VERL_PLATFORM=cpu does)
from agentcredit.integrations.verl.cpu import NoReplicaControl

ROOT = Path(__file__).resolve().parents[1]
#: the rollout backend this script registers in verl (its replica and its worker-side adapter)
SCRIPTED = "agentcredit_scripted"
METHODS = ("carl-segment", "grpo", "ppo")
#: metric keys whose values must be finite numbers when present; at least one per step must be present
LOSS_KEYS = re.compile(r"^(actor/(pg_loss|kl_loss|entropy_loss)|critic/vf_loss)$")
#: what the scripted model says, per protocol: a tool call (an observation follows), then an answer. The first
#: turn has two wordings; the episode answers right after the first and wrongly after the second, so groups have
#: variance. The server reads which turn it is (and the wording) from the prompt: verl gives every call a fresh
#: request id, so an id says nothing about the episode (issue 51: keyed by id, every turn was turn 0)
SCRIPTS = {
    "tags": (
        ["<search>who wrote X</search>", "<search>who wrote X, again</search>"],
        "<answer>{answer}</answer>",
    ),
    "codefence": (
        ["I compute.\n```python\nprint(6 * 7)\n```", "I compute again.\n```python\nprint(6 * 7)\n```"],
        "<context>42</context>",
        "\\boxed{{{answer}}}",
    ),
}
QUESTIONS = [("who wrote X", ["Jane Doe"]), ("who wrote Y", ["Jane Doe"])]
#: a run's batch: every question once per step (verl counts steps per epoch: --steps epochs of one step each)
BATCH = len(QUESTIONS)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--methods", default=",".join(METHODS), help="comma-separated: carl-segment, grpo, ppo"
    )
    parser.add_argument("--steps", type=int, default=2, help="training steps per method")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/agentcredit-verl-gpu-check"))
    parser.add_argument("--dry-run", action="store_true", help="build and validate only: no Ray, no GPU")
    args = parser.parse_args(argv)
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = sorted(set(args.methods) - set(METHODS))
    if unknown:
        parser.error(f"--methods: unknown {unknown}; choose from {list(METHODS)}")
    if args.steps < 1:
        parser.error("--steps must be >= 1")
    return args


# ------------------------------------------------------------------------------------------ model and data
def build_model(out: Path, seed: int = 0) -> Path:
    """A random two-layer Qwen2 and its byte tokenizer, saved as a Hugging Face model directory (the model verl's
    CPU run trains too: :func:`agentcredit.integrations.verl.tiny.build_tiny_model`)."""
    from agentcredit.integrations.verl.tiny import build_tiny_model

    return build_tiny_model(out, seed=seed)


def prompt_length(model_path: Path, data: Path) -> int:
    """The longest prompt of ``data`` in tokens, as verl's dataset measures it (the chat template with the
    generation prompt), rounded up to 64: ``data.max_prompt_length`` below it filters rows out (issue 51: the old
    256 left none of the 596- and 299-token prompts)."""
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    longest = max(
        len(
            tok(tok.apply_chat_template(list(row["prompt"]), add_generation_prompt=True, tokenize=False))[
                "input_ids"
            ]
        )
        for row in pq.read_table(data).to_pylist()
    )
    return -(-longest // 64) * 64


def write_data(out: Path, protocol: str, protocol_options: dict[str, Any]) -> Path:
    """Two questions as the agent loop reads them (:func:`agentcredit.integrations.verl.data.verl_row`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from agentcredit.integrations.verl.data import verl_row
    from agentcredit.protocols import get_protocol
    from agentcredit.tasks import Example

    proto = get_protocol(protocol, **protocol_options)
    rows = [
        verl_row(
            Example(f"q{i}", q, answers, "gpu-check", {}),
            i,
            "train",
            proto.messages(proto.new_episode(q)),
            "qa",
            protocol,
            protocol_options,
        )
        for i, (q, answers) in enumerate(QUESTIONS)
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), out)
    return out


# ------------------------------------------------------------------------------------- the scripted server
class ScriptedModel(NoReplicaControl):
    """verl's token-in/token-out server interface, answering from :data:`SCRIPTS` (no model runs here: the
    trainer's FSDP workers compute every log-prob it trains on). The turn is read from the prompt (how many of the
    script's turns it already holds), so each episode makes its tool call and then answers; episodes alternate
    the first turn's two wordings, and the second wording's episode answers wrongly, so groups have variance."""

    def __init__(self, model_path: str, protocol: str):
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(model_path)
        self.first, *self.rest = SCRIPTS[protocol]
        self.episodes = 0
        self.turns: list[int] = []  # the turn of every policy call (the check reads them)

    def reply(self, prompt: str) -> str:
        """The scripted reply after ``prompt`` (the episode so far)."""
        wording = next((i for i in (0, 1) if self.first[i] in prompt), None)
        if wording is None:  # turn 0: a new episode
            self.turns.append(0)
            self.episodes += 1
            return self.first[(self.episodes - 1) % 2]
        turn = 1 + sum(1 for t in self.rest[:-1] if t in prompt)
        self.turns.append(turn)
        if turn < len(self.rest):
            return self.rest[turn - 1]
        return self.rest[-1].format(answer="Jane Doe" if wording == 0 else "nobody")

    async def generate(self, prompt_ids, sampling_params, request_id, **kwargs) -> TokenOutput:
        if "prompt_logprobs" in sampling_params:  # a teacher scoring request (not used by these methods)
            lp = [[-1.0] for _ in range(len(prompt_ids) - 1)] + [[0.0]]
            return TokenOutput(token_ids=[self.tok.eos_token_id], extra_fields={"prompt_logprobs": lp})
        text = self.reply(self.tok.decode(prompt_ids))
        budget = int(sampling_params.get("max_new_tokens", sampling_params.get("max_tokens", 256)))
        ids = (self.tok.encode(text, add_special_tokens=False) + [self.tok.eos_token_id])[:budget]
        log_probs = [-0.5] * len(ids) if sampling_params.get("logprobs") else None
        return TokenOutput(token_ids=ids, log_probs=log_probs, stop_reason="completed")


#: the Ray actor verl's load balancer and agent loops call
ScriptedServer = ray.remote(ScriptedModel)


class ScriptedReplica(RolloutReplica):
    """A rollout replica whose server is :class:`ScriptedServer` (one CPU actor; no GPU, no engine)."""

    async def launch_servers(self):
        protocol = os.environ.get("AGENTCREDIT_GPU_CHECK_PROTOCOL", "tags")
        name = f"agentcredit_scripted_server_{self.replica_rank}{self.name_suffix}"
        path = getattr(self.model_config, "local_path", None) or self.model_config.path
        self._server_handle = ScriptedServer.options(name=name, max_concurrency=1000).remote(path, protocol)
        self._server_address = name
        self.servers = [self._server_handle]

    def rollout_worker_use_gpu(self) -> bool:
        return False


class ScriptedRollout(BaseRollout):
    """The worker side of the scripted backend (verl builds it in the hybrid actor): nothing to hold or sync, so
    the weights the checkpoint engine sends are consumed and dropped."""

    async def resume(self, tags: list[str]):
        return None

    async def update_weights(self, weights, wire_format: str = "named_tensors", **kwargs):
        for _ in weights:
            pass

    async def release(self):
        return None


def register() -> None:
    """Make ``actor_rollout_ref.rollout.name=agentcredit_scripted`` a verl rollout backend (every process)."""
    RolloutReplicaRegistry.register(SCRIPTED, lambda: ScriptedReplica)
    rollout_base._ROLLOUT_REGISTRY[(SCRIPTED, "async")] = f"{__name__}.ScriptedRollout"


register()  # at import: VERL_USE_EXTERNAL_MODULES lists this module, so every Ray process runs it


# ---------------------------------------------------------------------------------------------- configs
def overrides(method: str, model: Path, data: Path, workdir: Path, steps: int) -> list[str]:
    """The shipped config of ``method`` scaled down to one GPU, two prompts and short sequences."""
    out = [
        f"actor_rollout_ref.model.path={model}",
        f"critic.model.path={model}",
        f"data.train_files={data}",
        f"data.val_files={data}",
        f"data.train_batch_size={BATCH}",
        f"data.max_prompt_length={prompt_length(model, data)}",
        "data.max_response_length=512",
        "agentcredit.max_segment_tokens=64",
        "actor_rollout_ref.rollout.name=" + SCRIPTED,
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=naive",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
        "critic.ppo_mini_batch_size=2",
        "critic.ppo_micro_batch_size_per_gpu=2",
        # no flash-attn on the check's machine: sdpa, and verl's padding-free path (which needs it) off
        "actor_rollout_ref.model.use_remove_padding=false",
        "critic.model.use_remove_padding=false",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "+critic.model.override_config.attn_implementation=sdpa",
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=1",
        # one step per epoch (the batch is every question): --steps epochs, so --steps 2 runs 2 steps
        f"trainer.total_epochs={steps}",
        f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=[console]",
        f"trainer.default_local_dir={workdir / 'checkpoints' / method}",
        # this module registers the scripted backend; agentcredit's own module too, for a checkout that is not
        # installed (no verl.plugins entry point then; importing it twice is harmless)
        f"+ray_kwargs.ray_init.runtime_env.env_vars.VERL_USE_EXTERNAL_MODULES='{EXTERNAL_MODULES}'",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.PYTHONPATH='{python_path()}'",
        f"+ray_kwargs.ray_init.runtime_env.env_vars.AGENTCREDIT_GPU_CHECK_PROTOCOL={protocol_of(method)[0]}",
    ]
    if method == "carl-segment":
        # the python tool is off (no sandbox set-up on the check's node): the code fence gets an "unknown tool"
        # observation, still transient, so replacement mode still renders each episode as two rows
        out += [
            "agentcredit.tools.python=false",
            "trainer.critic_warmup=2",
        ]  # step 1 critic only, step 2 both
    else:
        out += ["agentcredit.tools.search_url=null"]
    return out


def protocol_of(method: str) -> tuple[str, dict[str, Any]]:
    """The protocol (and options) the method's shipped config parses with: the data is rendered with it."""
    from agentcredit.integrations.verl.data import method_protocol

    return method_protocol(method)


#: the modules every process imports at `import verl` (the check's child processes and Ray workers)
EXTERNAL_MODULES = "agentcredit.integrations.verl.register,verl_gpu_check"


def python_path() -> str:
    """The repository and ``scripts/`` before whatever ``PYTHONPATH`` the caller has (kept, not overwritten)."""
    parts = [str(ROOT), str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH", "")]
    return os.pathsep.join(p for p in parts if p)


def compose_config(method: str, model: Path, data: Path, workdir: Path, steps: int):
    """verl's config tree with agentcredit's config for ``method`` and :func:`overrides`, validated as verl's
    ``main_ppo`` and agentcredit's trainer validate it."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    from agentcredit.integrations.verl import GENERIC_CONFIG, config_dir, config_name
    from agentcredit.integrations.verl.trainer import check_trainer_config

    name = config_name(
        method
    )  # the method's recipe, else the generic config with agentcredit.method=<method>
    generic = [f"agentcredit.method={method}"] if name == GENERIC_CONFIG else []
    with initialize_config_dir(str(config_dir()), version_base=None):
        cfg = compose(name, overrides=[*generic, *overrides(method, model, data, workdir, steps)])
    OmegaConf.resolve(cfg)
    check_trainer_config(cfg)
    validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    return cfg


def check_dataset(cfg) -> int:
    """verl's own dataset on the composed config: every question survives its overlong-prompt filter (and the
    protocol check), or the run would train on nothing."""
    from transformers import AutoTokenizer
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from agentcredit.integrations.verl.data import check_data_files

    check_data_files(
        cfg.data.train_files, cfg.agentcredit.protocol, dict(cfg.agentcredit.protocol_options or {})
    )
    tok = AutoTokenizer.from_pretrained(cfg.actor_rollout_ref.model.path)
    n = len(RLHFDataset(cfg.data.train_files, tok, cfg.data))
    if n != len(QUESTIONS):
        raise RuntimeError(f"verl's dataset kept {n} of {len(QUESTIONS)} prompts (data.max_prompt_length?)")
    return n


# ------------------------------------------------------------------------------------------- the check
def check_step(method: str, step: int, data: dict[str, Any]) -> list[str]:
    """The losses and agentcredit metrics of one logged step, as printed lines; raises if a loss is missing or
    not finite."""
    losses = {k: float(v) for k, v in data.items() if LOSS_KEYS.match(k)}
    if not losses:
        raise RuntimeError(f"{method} step {step}: no loss in the logged metrics ({sorted(data)[:40]})")
    bad = {k: v for k, v in losses.items() if not math.isfinite(v)}
    if bad:
        raise RuntimeError(f"{method} step {step}: losses not finite: {bad}")
    fields = {k: float(v) for k, v in data.items() if k.startswith("agentcredit/")}
    lines = [f"CHECK {method} step {step} {k} = {v:.6g}" for k, v in sorted(losses.items())]
    return lines + [f"CHECK {method} step {step} {k} = {v:.6g}" for k, v in sorted(fields.items())]


def _install_step_printer(method: str) -> None:
    """Print (and check) every step's metrics where verl's trainer logs them (the TaskRunner process)."""
    from verl.utils import tracking

    original = tracking.Tracking.log

    def log(self, data, step, backend=None):
        if any(LOSS_KEYS.match(k) for k in data) or any(k.startswith("agentcredit/") for k in data):
            for line in check_step(method, step, data):
                print(line, flush=True)
        return original(self, data, step, backend)

    tracking.Tracking.log = log


if os.environ.get("AGENTCREDIT_GPU_CHECK_METHOD"):  # in the TaskRunner (and every other) process
    _install_step_printer(os.environ["AGENTCREDIT_GPU_CHECK_METHOD"])


def run_method(method: str, args: argparse.Namespace, model: Path) -> None:
    """One method in a fresh process (one Ray cluster per method, as a user's launch)."""
    from verl.trainer.main_ppo import TaskRunnerV1, run_ppo

    workdir = args.workdir
    data = write_data(workdir / f"{method}.parquet", *protocol_of(method))
    cfg = compose_config(method, model, data, workdir, args.steps)
    from omegaconf import open_dict

    with open_dict(cfg):
        cfg.ray_kwargs.ray_init.runtime_env.env_vars.AGENTCREDIT_GPU_CHECK_METHOD = method
    run_ppo(cfg, task_runner_class=TaskRunnerV1)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    model = build_model(args.workdir / "tiny-qwen2")
    if args.dry_run:
        for method in args.methods:
            data = write_data(args.workdir / f"{method}.parquet", *protocol_of(method))
            cfg = compose_config(method, model, data, args.workdir, args.steps)
            n = check_dataset(cfg)
            print(
                f"DRY-RUN {method}: config composed and validated; {n} prompts of <= "
                f"{cfg.data.max_prompt_length} tokens kept; {cfg.trainer.total_training_steps} steps"
            )
        return 0
    if not torch.cuda.is_available():
        print("no GPU visible: run with --dry-run on a CPU machine", file=sys.stderr)
        return 2
    failed = []
    for method in args.methods:  # a fresh interpreter per method: Ray and TransferQueue are per process
        env = dict(os.environ, PYTHONPATH=python_path(), VERL_USE_EXTERNAL_MODULES=EXTERNAL_MODULES)
        code = (
            "import sys, verl_gpu_check as c; a = c.parse_args(sys.argv[1:]); "
            f"c.run_method({method!r}, a, a.workdir / 'tiny-qwen2')"
        )
        argv_child = ["--workdir", str(args.workdir), "--steps", str(args.steps), "--methods", method]
        print(f"=== {method}", flush=True)
        rc = subprocess.call([sys.executable, "-c", code, *argv_child], env=env)
        if rc:
            failed.append(method)
    print("FAILED: " + ", ".join(failed) if failed else f"OK: {', '.join(args.methods)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
