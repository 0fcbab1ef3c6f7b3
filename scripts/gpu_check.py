"""The native path on one GPU (issue 50): SFT, one step of every method, an evaluation, and one step's numbers
against the CPU's, each a printed line ``CHECK <name>: ok|FAIL ...``; the last line ``OK: ...`` or ``FAILED: ...``.

Runs on a tiny random Llama (2 layers, hidden 64) on the embedded model's tokenizer, so nothing is downloaded and
only the tokenizer's files travel (``--tokenizer``: a directory holding ``config.json`` and the tokenizer files,
default the embedded model's). What it checks, on ``--device`` (default ``cuda``):

* ``device``: ``model.device`` resolves to that device and the precision ``auto`` picks there;
* ``sft``: the tiny model fitted on scripted arith-tools demonstrations on the device (the loss must fall), so
  its rollouts hold both correct and wrong episodes and every method gets non-zero advantages;
* ``step <method>``: one ``Trainer.train_step`` (HF engine rollouts on the device, signals, credit, update) of every
  built-in method's arith-tools preset with ``model.device`` set and the device's ``auto`` precision; every metric
  must be finite and the policy's weights must move;
* ``eval``: a greedy evaluation of the fitted model on the device;
* ``<device> vs cpu``: one learning step on the same stored trees (GRPO and PPO: the policy loss, and a critic) in
  fp32 (no autocast, TF32 off) on the CPU and on the device; every logged number must agree within
  ``--rtol`` / ``--atol`` (1e-3 relative / 1e-4 absolute: the pinned step's tolerance for the teacher methods, whose
  fp32 sums two CPUs round differently; a GPU's reduction order differs the same way);
* ``memory``: the GPU's peak allocation (``torch.cuda.max_memory_allocated``) and the peak RSS.

``--device cpu`` is the dry run ``tests/test_gpu_check.py`` runs in ``make test`` (the comparison is then CPU
against CPU and must be exact up to the same tolerance). On one H200 the whole run is sized to take well under 8
minutes; see ``scripts/gpu_check.md`` for how to run it there.
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as `python scripts/gpu_check.py` from a checkout
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from agentcredit.config import load_config  # noqa: E402
from agentcredit.credit.methods import BUILT_IN  # noqa: E402
from agentcredit.environment import build_environment  # noqa: E402
from agentcredit.models.device import (  # noqa: E402
    config_precision,
    peak_gpu_memory_gib,
    resolve_device,
)
from agentcredit.models.embedded import load_tokenizer  # noqa: E402
from agentcredit.models.tiny import tiny_llama  # noqa: E402
from agentcredit.runtime import peak_rss_gib  # noqa: E402
from agentcredit.tasks import Example  # noqa: E402

EXAMPLES = [
    Example("q-hard", "What is 17*23?", ["391"], "arith-tools", {"tier": "hard", "expression": "17*23", "metric": "numeric"}),
    Example("q-easy", "What is 3+4?", ["7"], "arith-tools", {"tier": "easy", "expression": "3+4", "metric": "numeric"}),
]  # fmt: skip

# CPU-sized settings (as the trainer tests'): 2 prompts x 3 episodes, short segments, one epoch, no checkpoints
SMALL = [
    "model.name=tiny",
    "rollout.prompts_per_step=2",
    "rollout.n=3",
    "rollout.n0=1",
    "rollout.max_new_tokens=40",
    "rollout.max_episode_tokens=96",
    "rollout.temperature=1.0",
    "optim.minibatch_size=0",
    "optim.epochs=1",
    "train.tensorboard=false",
    "train.save_every=0",
    "train.critic_warmup=0",
]
# --protocol chat (the default): the model's own tool calls to the tool suite's calculator, in-process, so the check
# needs no sandbox (bubblewrap) on the GPU machine; the presets' own protocols (code fences run in the sandbox, JSON
# calls) with --protocol preset
CHAT = [
    "protocol.name=chat",
    "protocol.options={max_segments: 3}",
    "rollout.max_turns=3",
    "tools.suite_tools=[math_calculation]",
]
PROTOCOL: list[str] = list(CHAT)
# what a method's preset needs beyond SMALL to have something to learn from on the tiny model (as the tests')
OVERRIDES = {
    "carl-critical": ["rollout.n=4"],
    "portool": ["rollout.t_max=3", "algorithm.portool.root_is_fork=true"],
}
# the numbers compared between the CPU and the device (time/* and the rollout's own logp gap are not the step's)
SKIPPED = ("time/", "rollout/", "memory/")


class Checks:
    """Prints one line per check and remembers the failures."""

    def __init__(self) -> None:
        self.failed: list[str] = []
        self.passed = 0

    def report(self, name: str, ok: bool, detail: str, seconds: float) -> None:
        print(f"CHECK {name}: {'ok' if ok else 'FAIL'} {detail} ({seconds:.1f} s)", flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed.append(name)

    def run(self, name: str, fn, *args) -> Any:
        start = time.perf_counter()
        try:
            ok, detail, value = fn(*args)
        except Exception as exc:  # noqa: BLE001 - one line per check, whatever broke
            ok, detail, value = False, f"{type(exc).__name__}: {exc}", None
        self.report(name, ok, detail, time.perf_counter() - start)
        return value


def preset_config(method: str, device: str, extra: list[str] = ()) -> Any:
    overrides = [*SMALL, *PROTOCOL, *OVERRIDES.get(method, []), f"model.device={device}", *extra]
    return load_config(f"{method}-arith-tools", overrides)


def check_device(device: str):
    resolved = resolve_device(device)
    precision = config_precision(preset_config("grpo", device), resolved)
    name = torch.cuda.get_device_name(resolved) if resolved.type == "cuda" else "CPU"
    return (
        True,
        f"model.device={device} -> {resolved} ({name}); auto precision: {precision.describe()}",
        resolved,
    )


def check_sft(device: str, tokenizer: Any, protocol_preset: str, epochs: int):
    from agentcredit.train.sft import demonstrations, sft

    torch.manual_seed(0)
    config = preset_config(protocol_preset, device)
    model, _ = tiny_llama(seed=0, tokenizer=tokenizer, max_positions=8192)
    model.to(resolve_device(device))
    env = build_environment(config)
    try:
        trees = demonstrations(env, tokenizer, EXAMPLES, config.protocol.name)
    finally:
        env.close()
    result = sft(
        model,
        trees,
        pad_id=tokenizer.pad_token_id,
        epochs=epochs,
        batch_trajectories=2,
        lr=3e-3,
        autocast=config_precision(config).autocast,
    )
    first, last = result.losses[0], result.losses[-1]
    ok = math.isfinite(last) and last < first
    return (
        ok,
        f"{config.protocol.name}: loss {first:.3f} -> {last:.3f} over {len(result.losses)} steps",
        model,
    )


def check_step(method: str, device: str, fitted: Any, tokenizer: Any):
    from agentcredit.train.trainer import Trainer

    config = preset_config(method, device)
    trainer = Trainer(
        config, model=copy.deepcopy(fitted), tokenizer=tokenizer, examples=list(EXAMPLES), log=False
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    try:
        metrics = trainer.train_step().metrics
    finally:
        trainer.close()
    bad = sorted(k for k, v in metrics.items() if not math.isfinite(v))
    moved = any(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())
    where = {str(p.device) for p in trainer.model.parameters()}
    ok = not bad and moved and where == {str(trainer.device)}
    detail = (
        f"loss/total {metrics.get('loss/total', math.nan):.4f}, reward {metrics.get('reward/mean', math.nan):.2f}, "
        f"adv nonzero {metrics.get('adv/nonzero_frac', math.nan):.2f}, weights on {sorted(where)}, "
        f"{'moved' if moved else 'DID NOT MOVE'}" + (f", non-finite {bad}" if bad else "")
    )
    return ok, detail, metrics


def check_eval(device: str, fitted: Any, tokenizer: Any):
    from agentcredit.eval.evaluate import evaluate

    config = preset_config("grpo", device)
    env = build_environment(config)
    try:
        summary, records = evaluate(
            fitted, tokenizer, env, EXAMPLES, samples=1, temperature=0.0, max_new_tokens=40, seed=0
        )
    finally:
        env.close()
    ok = len(records) == len(EXAMPLES) and math.isfinite(summary.get("accuracy", math.nan))
    return ok, f"{len(records)} episodes, accuracy {summary.get('accuracy', math.nan):.2f}", summary


def _learn(method: str, device: str, base: Any, tokenizer: Any, trees: list[Any]) -> dict[str, float]:
    from agentcredit.train.trainer import Trainer

    fp32 = ["model.autocast_bf16=false", "model.rollout_dtype=float32"]
    config = preset_config(method, device, fp32)
    by_id = {e.id: e for e in EXAMPLES}
    trainer = Trainer(
        config, model=copy.deepcopy(base), tokenizer=tokenizer, examples=list(EXAMPLES), log=False
    )
    try:
        metrics = trainer.learn(copy.deepcopy(trees), [by_id[t.prompt_id] for t in trees]).metrics
    finally:
        trainer.close()
    return {k: v for k, v in metrics.items() if not k.startswith(SKIPPED)}


def check_against_cpu(method: str, device: str, fitted: Any, tokenizer: Any, rtol: float, atol: float):
    """The same learning step on the same trees (sampled once, on the CPU) with the same starting weights, in fp32
    on the CPU and on ``device``: every logged number within the tolerance."""
    from agentcredit.train.trainer import Trainer

    base = copy.deepcopy(fitted).to("cpu")
    sampler = Trainer(preset_config(method, "cpu"), model=copy.deepcopy(base), tokenizer=tokenizer,
                      examples=list(EXAMPLES), log=False)  # fmt: skip
    try:
        examples = sampler.sampler.next(sampler.cfg.rollout.prompts_per_step)
        trees, _ = sampler.rollout(examples)
    finally:
        sampler.close()
    for tree, example in zip(trees, examples, strict=True):
        tree.prompt_id = example.id
    cpu = _learn(method, "cpu", base, tokenizer, trees)
    dev = _learn(method, device, base, tokenizer, trees)
    off = {
        k: (cpu[k], dev.get(k))
        for k in cpu
        if k not in dev or not math.isclose(cpu[k], dev[k], rel_tol=rtol, abs_tol=atol)
        if not (math.isnan(cpu[k]) and math.isnan(dev.get(k, 0.0)))
    }
    worst = max(
        (abs(cpu[k] - dev[k]) for k in cpu if k in dev and math.isfinite(cpu[k]) and math.isfinite(dev[k])),
        default=0.0,
    )
    detail = (
        f"{len(cpu)} numbers, largest difference {worst:.2e} (tolerance {rtol:g} rel / {atol:g} abs); "
        f"loss/total cpu {cpu.get('loss/total', math.nan):.6f} {device} {dev.get('loss/total', math.nan):.6f}"
        + (f"; off: {off}" if off else "")
    )
    return not off, detail, None


def check_memory(device: torch.device):
    gpu = peak_gpu_memory_gib(device)
    detail = f"peak RSS {peak_rss_gib():.2f} GiB" + (f", GPU peak {gpu:.3f} GiB" if gpu is not None else "")
    return device.type != "cuda" or gpu is not None, detail, None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="model.device to check (default cuda; cpu: dry run)")
    parser.add_argument("--methods", default="all", help="comma-separated built-in methods (default all)")
    parser.add_argument("--compare", default="grpo,ppo", help="methods whose step is compared with the CPU's")
    parser.add_argument(
        "--tokenizer", default="embedded", help="a model directory with the tokenizer's files"
    )
    parser.add_argument(
        "--sft-epochs", type=int, default=35, help="SFT epochs of the tiny model (default 35)"
    )
    parser.add_argument("--rtol", type=float, default=1e-3)
    parser.add_argument("--atol", type=float, default=1e-4)
    parser.add_argument(
        "--protocol",
        choices=("chat", "preset"),
        default="chat",
        help="chat: the suite's calculator, no sandbox (default); preset: each preset's own protocol and tools",
    )
    args = parser.parse_args(argv)
    PROTOCOL[:] = CHAT if args.protocol == "chat" else []

    # fp32 means fp32 in the comparison: no TF32 matmuls (PyTorch's default, set here so a site setting cannot
    # change it)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    began = time.perf_counter()
    checks = Checks()
    device = checks.run("device", check_device, args.device)
    if device is None:
        print(f"FAILED: {', '.join(checks.failed)}")
        return 1
    tokenizer = load_tokenizer(args.tokenizer)
    methods = sorted(BUILT_IN) if args.methods == "all" else [m for m in args.methods.split(",") if m]
    # one fitted model per protocol: the chat one for every method, or with --protocol preset the code-fence one
    # and (for PORTool's presets) the JSON-call one
    own = args.protocol == "preset"
    fitted = {
        "main": checks.run(
            f"sft {'codefence' if own else 'chat'}",
            check_sft,
            args.device,
            tokenizer,
            "grpo",
            args.sft_epochs,
        ),
        "jsoncall": checks.run("sft jsoncall", check_sft, args.device, tokenizer, "portool", args.sft_epochs)
        if own and any(m.startswith("portool") for m in methods)
        else None,
    }
    for method in methods:
        model = fitted["jsoncall" if own and method.startswith("portool") else "main"]
        if model is None:
            checks.report(f"step {method}", False, "no fitted model (its SFT failed)", 0.0)
            continue
        checks.run(f"step {method}", check_step, method, args.device, model, tokenizer)
    if fitted["main"] is not None:
        checks.run("eval", check_eval, args.device, fitted["main"], tokenizer)
        for method in [m for m in args.compare.split(",") if m]:
            checks.run(
                f"{device.type} vs cpu {method}",
                check_against_cpu,
                method,
                args.device,
                fitted["main"],
                tokenizer,
                args.rtol,
                args.atol,
            )
    checks.run("memory", check_memory, device)
    minutes = (time.perf_counter() - began) / 60
    if checks.failed:
        print(f"FAILED: {', '.join(checks.failed)} ({checks.passed} passed, {minutes:.1f} min)")
        return 1
    print(f"OK: {checks.passed} checks on {device} in {minutes:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
