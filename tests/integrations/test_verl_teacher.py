"""TIPS's lagged teacher on verl (:mod:`agentcredit.integrations.verl.teacher`), on a local Ray instance.

Real here: the Ray actors and their naming, verl's ``GlobalRequestLoadBalancer`` and ``LLMServerClient`` (the
route every teacher request takes), the agent loop and the refresh schedule. Replaced, because they need GPUs:
the inference replica (a Ray actor that answers ``prompt_logprobs`` from the weights it was last sent) and the
checkpoint engine's transport (it sends the actor's step number instead of its tensors).
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("verl")

import ray  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from verl.trainer.ppo.v1 import PPOTrainerSync  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

import agentcredit.integrations.verl.agent_loop as agent_loop_module  # noqa: E402
import agentcredit.integrations.verl.teacher as teacher_module  # noqa: E402
from agentcredit.integrations.verl import config_dir  # noqa: E402
from agentcredit.integrations.verl.fields import RowRecord  # noqa: E402
from agentcredit.integrations.verl.settings import load_settings  # noqa: E402
from agentcredit.integrations.verl.teacher import TEACHER_ROUTER, LaggedTeacher  # noqa: E402
from agentcredit.integrations.verl.trainer import AgentCreditTrainer, check_trainer_config  # noqa: E402

from .test_verl_agent_loop import SEARCH, TIPS_TURNS, FakeServer, _run_loop  # noqa: E402

pytestmark = pytest.mark.verl

LAGGED = ["agentcredit.tips.refresh_every=2", "agentcredit.tips.teacher_replicas=2"]


@ray.remote
class TeacherServer:
    """A teacher replica's server: log p(token j) = -0.001 * j * (1 + s), s = the actor step it was last sent; it
    answers as vLLM with nothing of the sequence cached (``num_cached_tokens`` 0: every row computed)."""

    def __init__(self):
        self.step: int | None = None
        self.scored = 0

    def load(self, step: int) -> None:
        self.step = step

    def requests(self) -> int:
        return self.scored

    async def generate(self, request_id, prompt_ids, sampling_params, **kwargs):
        assert sampling_params["prompt_logprobs"] == 0 and self.step is not None
        self.scored += 1
        lp = [[-0.001 * j * (1 + self.step)] for j in range(1, len(prompt_ids))] + [[0.0]]
        return TokenOutput(token_ids=[0], extra_fields={"prompt_logprobs": lp, "num_cached_tokens": 0})


class TeacherReplica:
    """``RolloutReplica``'s constructor and ``init_standalone`` (which launches the server on GPUs of its own)."""

    def __init__(self, replica_rank, config, model_config, gpus_per_node, is_teacher_model, name_suffix):
        assert is_teacher_model and name_suffix
        self.rank = replica_rank
        self.workers: list = []

    async def init_standalone(self):
        self._server_handle = TeacherServer.remote()
        self._server_address = f"teacher-{self.rank}"


class StepTransport:
    """``CheckpointEngineManager``'s constructor and ``update_weights``: sends the step, not the tensors."""

    def __init__(self, config, actor_wg, replicas):
        assert config.backend == "nccl"  # the shipped tips config's transport
        self.replicas = replicas

    def update_weights(self, global_steps=None):
        ray.get([replica._server_handle.load.remote(global_steps) for replica in self.replicas])


@pytest.fixture
def local_ray(monkeypatch):
    monkeypatch.setattr(teacher_module, "get_rollout_replica_class", lambda name: TeacherReplica)
    monkeypatch.setattr(teacher_module, "CheckpointEngineManager", StepTransport)
    agent_loop_module._TEACHERS.clear()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="agentcredit-tests")
    try:
        yield
    finally:
        agent_loop_module._TEACHERS.clear()
        ray.shutdown()


def _config(overrides=()):
    with initialize_config_dir(str(config_dir()), version_base=None):
        return compose("tips", overrides=["data.max_response_length=400", *overrides])


def _phi(lengths, answer_tokens, scale):
    """Phi(S) = logsumexp over the aliases of the answer tokens' log-probs at the end of each scored sequence."""
    return math.log(
        sum(
            math.exp(-0.001 * scale * sum(range(n - m, n)))
            for n, m in zip(lengths, answer_tokens, strict=True)
        )
    )


def test_the_lagged_teacher_scores_the_potentials_and_follows_the_actor_every_n_updates(
    local_ray, byte_tokenizer
):
    cfg = _config(LAGGED)
    settings = check_trainer_config(cfg)
    with pytest.raises(RuntimeError, match=f"no actor named '{TEACHER_ROUTER}' is running"):
        teacher_module.teacher_client(cfg)

    teacher = LaggedTeacher.launch(cfg, actor_wg=None, settings=settings)
    assert len(teacher.replicas) == 2 and ray.get_actor(TEACHER_ROUTER) is not None
    teacher.refresh(0)  # the trainer's on_init_end: the initial policy

    def episode():
        server = FakeServer(byte_tokenizer, list(TIPS_TURNS))
        out = _run_loop(byte_tokenizer, "tips", server, overrides=LAGGED, tools=SEARCH)
        assert server.scored == []  # the rollout server (the current policy) scored nothing
        record = RowRecord.model_validate(out.extra_fields["agentcredit"])
        return record.potentials

    answer_tokens = [
        len(byte_tokenizer.encode(a, add_special_tokens=False))  # answer_only: the tag is context (Eq. 15-16)
        for a in ("Jane Doe", "J. Doe")
    ]
    # the boundary contexts S_0 and S_1 plus each alias, as the rollout-server test counts them
    server = FakeServer(byte_tokenizer, list(TIPS_TURNS))
    _run_loop(byte_tokenizer, "tips", server, overrides=["agentcredit.tips.refresh_every=1"], tools=SEARCH)
    lengths = [len(ids) for ids in server.scored]

    def expected(step):
        return [_phi(lengths[:2], answer_tokens, 1 + step), _phi(lengths[2:], answer_tokens, 1 + step)]

    assert episode() == pytest.approx(expected(0), rel=1e-9)
    assert [teacher.after_update(step) is not None for step in (1, 2, 3)] == [False, True, False]
    assert teacher.weights_step == 2
    assert episode() == pytest.approx(expected(2), rel=1e-9)  # theta_2 scores steps 3 and 4
    served = ray.get([replica._server_handle.requests.remote() for replica in teacher.replicas])
    assert sum(served) == 8  # 2 episodes x 2 boundaries x 2 aliases, all on the teacher's replicas


def test_the_lagged_teacher_needs_a_transport_to_its_replicas():
    with pytest.raises(ValueError, match=r"checkpoint_engine\.backend=nccl"):
        check_trainer_config(_config(["actor_rollout_ref.rollout.checkpoint_engine.backend=naive"]))
    # refresh_every = 1 scores on the rollout server: no replicas of its own, so any backend
    cfg = _config(
        ["actor_rollout_ref.rollout.checkpoint_engine.backend=naive", "agentcredit.tips.refresh_every=1"]
    )
    assert not teacher_module.wants_lagged_teacher(check_trainer_config(cfg))
    assert teacher_module.wants_lagged_teacher(
        load_settings(_config().agentcredit)
    )  # the shipped config: N = 200


def test_the_teacher_is_refused_where_it_cannot_run():
    with pytest.raises(ValueError, match=r"rollout\.name=vllm"):
        check_trainer_config(_config(["actor_rollout_ref.rollout.name=trtllm"]))
    cfg = _config()  # one node of 8 GPUs for the trainer, one teacher replica of tensor parallel size 1
    settings = load_settings(cfg.agentcredit)
    assert teacher_module.teacher_gpus(cfg, settings) == 1
    with pytest.raises(ValueError, match=r"needs 1 GPUs of its own .* beside the trainer's 8 .* has 8"):
        teacher_module.check_teacher_gpus(cfg, settings, cluster_gpus=8)
    teacher_module.check_teacher_gpus(cfg, settings, cluster_gpus=9)
    wide = _config(
        ["actor_rollout_ref.rollout.tensor_model_parallel_size=2", "agentcredit.tips.teacher_replicas=2"]
    )
    assert teacher_module.teacher_gpus(wide, load_settings(wide.agentcredit)) == 4
    current = _config(["agentcredit.tips.refresh_every=1"])
    assert teacher_module.teacher_gpus(current, load_settings(current.agentcredit)) == 0
    teacher_module.check_teacher_gpus(current, load_settings(current.agentcredit), cluster_gpus=0)


def test_the_teacher_is_refreshed_before_the_rollout_wakes(monkeypatch):
    """verl's sync trainer wakes the colocated rollout in on_step_end; the teacher's transfer goes first, while it
    sleeps, and its sync metrics reach the step's log."""
    order = []
    monkeypatch.setattr(PPOTrainerSync, "on_step_end", lambda self: order.append("rollout"))

    class Teacher:
        def after_update(self, step):
            order.append(f"teacher {step}")
            return {"sync_seconds": 1.5}

    trainer = object.__new__(AgentCreditTrainer)  # only the hook: no workers
    trainer._teacher, trainer.timing_raw, trainer.global_steps = Teacher(), {}, 200
    trainer.on_step_end()
    assert order == ["teacher 200", "rollout"]
    assert trainer._pending_sync_metrics == {"agentcredit/teacher_sync/sync_seconds": 1.5}
    assert "agentcredit_teacher_refresh" in trainer.timing_raw


def test_tips_layout_that_fills_one_8_gpu_node():
    """issue 36: the documented layout (4 training GPUs + agentcredit.tips.teacher_replicas=4) fits one 8-GPU
    node exactly; one more replica does not, and the check names the keys."""
    layout = ["trainer.n_gpus_per_node=4", "agentcredit.tips.teacher_replicas=4"]
    with initialize_config_dir(str(config_dir()), version_base=None):
        cfg = compose("tips", overrides=layout)
        over = compose("tips", overrides=[layout[0], "agentcredit.tips.teacher_replicas=5"])
    settings = load_settings(cfg.agentcredit)
    assert teacher_module.teacher_gpus(cfg, settings) == 4
    teacher_module.check_teacher_gpus(cfg, settings, cluster_gpus=8)
    with pytest.raises(ValueError, match="teacher_replicas=5"):
        teacher_module.check_teacher_gpus(over, load_settings(over.agentcredit), cluster_gpus=8)
