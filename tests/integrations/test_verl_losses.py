"""agentcredit's actor loss on verl: verl's ``ppo_loss`` with the entropy and KL terms weighted per token.

carl-segment.md A12: KL and entropy use the segment-mean aggregation of the policy term. With every weight 1 the
loss is verl 0.9.1's own ``ppo_loss`` (value and gradients); with weights, hand-worked numbers; the trainer writes
the weights the advantages were scaled by and installs the loss on the actor worker.
"""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("verl")

from hydra import compose, initialize_config_dir  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402
from verl.utils.config import omega_conf_to_dataclass  # noqa: E402
from verl.workers.utils.losses import ppo_loss  # noqa: E402

from agentcredit.integrations.verl import trainer as trainer_module  # noqa: E402
from agentcredit.integrations.verl.__main__ import config_dir  # noqa: E402
from agentcredit.integrations.verl.advantages import apply_to_dataproto  # noqa: E402
from agentcredit.integrations.verl.losses import (  # noqa: E402
    LOSS_WEIGHTS,
    VALUE_WEIGHTS,
    boundary_value_loss,
    trajectory_weighted_actor_loss,
)
from agentcredit.integrations.verl.trainer import AgentCreditTrainer  # noqa: E402

from .test_verl_advantages import build_batch, settings  # noqa: E402
from .test_verl_minibatch import DIRECT, TWO_CALLS, Ep  # noqa: E402
from .test_verl_trainer import MemoryTQ, Meta, _stored_rows, _tiny_model_dir  # noqa: E402

pytestmark = pytest.mark.verl

PROMPTS = [3, 2]  # prompt lengths of the two rows
TOKEN_MEAN = [
    "agentcredit.carl_segment.segment_mean_loss=false",
    "actor_rollout_ref.actor.loss_agg_mode=token-mean",
]
SEGMENT_MEAN = [
    "agentcredit.carl_segment.segment_mean_loss=true",
    "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum",
]


def _compose(name: str, *overrides: str):
    with initialize_config_dir(str(config_dir()), version_base=None):
        return compose(name, overrides=list(overrides))


@pytest.fixture(scope="module")
def model_path(tmp_path_factory, byte_tokenizer) -> str:
    """A local tiny model: building verl's critic config loads its model config (the default is a hub id)."""
    path = _tiny_model_dir(tmp_path_factory.mktemp("model"), byte_tokenizer)
    return f"actor_rollout_ref.model.path={path}"


def _actor(**fields):
    """verl's actor config (a frozen dataclass), as the worker builds it, with ``fields`` set through Hydra."""
    overrides = [f"actor_rollout_ref.actor.{name}={value}" for name, value in fields.items()]
    return omega_conf_to_dataclass(
        _compose("carl_segment", *SEGMENT_MEAN, *overrides).actor_rollout_ref.actor
    )


def _nested(rows: list[torch.Tensor]) -> torch.Tensor:
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def _batch(
    responses: dict[str, list[list[float]]], *, dp_size: int = 1, global_batch_size=None
) -> TensorDict:
    """Two rows as the actor worker sees them: nested prompts / responses and per-response-token fields."""
    lengths = [len(r) for r in responses["advantages"]]
    fields = {
        "prompts": _nested([torch.arange(p) + 1 for p in PROMPTS]),
        "responses": _nested([torch.arange(n) + 1 for n in lengths]),
        "response_mask": _nested([torch.ones(n, dtype=torch.long) for n in lengths]),
    }
    fields.update({name: _nested([torch.tensor(r) for r in rows]) for name, rows in responses.items()})
    data = TensorDict(fields, batch_size=2)
    tu.assign_non_tensor(data, dp_size=dp_size, batch_num_tokens=None, global_batch_size=global_batch_size)
    return data


def _sequence_output(responses: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """A whole-sequence model output (prompt + response, flat, as verl's no-padding engine gives it) with the
    response values where ``no_padding_2_padding`` reads them: token t of the response at position prompt + t - 1.
    Returns the nested tensor and its flat leaf (for gradients)."""
    rows = []
    for p, resp in zip(PROMPTS, responses, strict=True):
        row = torch.zeros(p + len(resp))
        row[p - 1 : p - 1 + len(resp)] = torch.tensor(resp)
        rows.append(row)
    flat = torch.cat(rows).requires_grad_(True)
    offsets = torch.tensor([0, len(rows[0]), len(rows[0]) + len(rows[1])])
    return torch.nested.nested_tensor_from_jagged(flat, offsets), flat


def _model_output(log_probs: list[list[float]], entropy: list[list[float]]):
    (lp, lp_flat), (ent, ent_flat) = _sequence_output(log_probs), _sequence_output(entropy)
    return {"log_probs": lp, "entropy": ent}, [lp_flat, ent_flat]


def _random_batch(weights: list[list[float]], **global_info):
    g = torch.Generator().manual_seed(0)
    lengths = [len(w) for w in weights]

    def rand(scale: float = 1.0) -> list[list[float]]:
        return [(torch.randn(n, generator=g) * scale).tolist() for n in lengths]

    old = [[-abs(x) for x in row] for row in rand()]
    data = _batch(
        {
            "old_log_probs": old,
            "advantages": rand(),
            "ref_log_prob": [[-abs(x) for x in row] for row in rand()],
            LOSS_WEIGHTS: weights,
        },
        **global_info,
    )
    new = [
        [o + d for o, d in zip(row, delta, strict=True)] for row, delta in zip(old, rand(0.1), strict=True)
    ]
    return data, new, [[abs(x) for x in row] for row in rand()]


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
@pytest.mark.parametrize("global_info", [{}, {"dp_size": 2, "global_batch_size": 6}])
def test_with_unit_weights_it_is_verls_ppo_loss(mode, global_info):
    """Also with the global batch verl hands a micro-batch (2 of a mini-batch's 6 rows, 2 data-parallel ranks)."""
    if mode == "token-mean" and global_info:
        global_info = {
            **global_info,
            "dp_size": 1,
        }  # token-mean over ranks needs batch_num_tokens: dp = 1 here
    data, log_probs, entropy = _random_batch([[1.0] * 4, [1.0] * 2], **global_info)
    losses, grads = [], []
    for fn in (ppo_loss, trajectory_weighted_actor_loss):
        config = _actor(loss_agg_mode=mode, entropy_coeff=0.01, use_kl_loss=True, kl_loss_coef=0.1)
        out, flats = _model_output(log_probs, entropy)
        loss, metrics = fn(config, out, data)
        loss.backward()
        losses.append((float(loss), {k: float(getattr(v, "values", [v])[0]) for k, v in metrics.items()}))
        grads.append([f.grad.clone() for f in flats])
    assert losses[0] == losses[1]
    for ours, verls in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(ours, verls, rtol=0, atol=0)


def test_entropy_and_kl_weighted_by_hand():
    """seq-mean-token-sum over 2 rows, zero advantages (no policy term), k1 KL = log p - log p_ref:
    entropy: row 0 sum(1 x [0.5, 0.5, 2, 2]) = 5, row 1 sum(2 x [1, 1]) = 4, mean over rows 4.5 (unweighted 4);
    KL: row 0 sum(0.2 x w) = 1.0, row 1 0.1 + 0.3 = 0.4, mean 0.7 (unweighted 0.6);
    loss = -0.5 x 4.5 + 0.25 x 0.7 = -2.075."""
    weights = [[0.5, 0.5, 2.0, 2.0], [1.0, 1.0]]
    data = _batch(
        {
            "old_log_probs": [[-1.0] * 4, [-1.0] * 2],
            "advantages": [[0.0] * 4, [0.0] * 2],
            "ref_log_prob": [[-1.2] * 4, [-1.1, -1.3]],
            LOSS_WEIGHTS: weights,
        }
    )
    config = _actor(
        loss_agg_mode="seq-mean-token-sum",
        entropy_coeff=0.5,
        use_kl_loss=True,
        kl_loss_coef=0.25,
        kl_loss_type="kl",
    )
    out, _ = _model_output([[-1.0] * 4, [-1.0] * 2], [[1.0] * 4, [2.0] * 2])
    loss, metrics = trajectory_weighted_actor_loss(config, out, data)
    assert float(metrics["actor/entropy_loss"].values[0]) == pytest.approx(4.5)
    assert float(metrics["kl_loss"].values[0]) == pytest.approx(0.7)
    assert float(loss) == pytest.approx(-2.075)
    _, verls = ppo_loss(config, out, data)  # verl's own: the same terms on the 0/1 mask
    assert float(verls["actor/entropy_loss"].values[0]) == pytest.approx(4.0)
    assert float(verls["kl_loss"].values[0]) == pytest.approx(0.6)


def test_a_batch_without_weights_is_refused():
    data, log_probs, entropy = _random_batch([[1.0] * 4, [1.0] * 2])
    del data[LOSS_WEIGHTS]
    out, _ = _model_output(log_probs, entropy)
    with pytest.raises(ValueError, match=LOSS_WEIGHTS):
        trajectory_weighted_actor_loss(_actor(), out, data)


class _Recorder:
    def __init__(self):
        self.calls = []

    def set_loss_fn(self, loss_fn):
        self.calls.append(loss_fn)

    def update_weights(self, step):  # the sync trainer's on_init_end pushes the weights to the rollout
        self.calls.append(("update_weights", step))


@pytest.mark.parametrize(
    ("config_name", "overrides", "actor_loss"),
    [("carl_segment", SEGMENT_MEAN, True), ("carl_segment", TOKEN_MEAN, False), ("grpo", [], False)],
)
def test_the_trainer_writes_the_weights_and_installs_the_losses(
    monkeypatch, model_path, config_name, overrides, actor_loss
):
    cfg = _compose(config_name, model_path, *overrides)
    eps = [Ep("p0", TWO_CALLS, 1.0), Ep("p0", DIRECT, 0.0)]
    rows = _stored_rows(build_batch(eps, seed=7))
    monkeypatch.setattr(trainer_module, "tq", MemoryTQ(rows))
    trainer = AgentCreditTrainer(cfg)
    trainer._compute_advantage(Meta(list(rows), tags=[{} for _ in rows]), {})
    segment = config_name == "carl_segment"
    assert all((LOSS_WEIGHTS in row) == actor_loss for row in rows.values())
    assert all((VALUE_WEIGHTS in row) == segment for row in rows.values())
    if actor_loss:  # the weights are the factor the advantages were scaled by: plain segment advantages x w
        plain = build_batch(eps, seed=7)
        apply_to_dataproto(plain.proto, settings("carl-segment"))
        for r, row in enumerate(rows.values()):
            n = row["response_mask"].shape[0]
            expected = plain.proto.batch["advantages"][r, :n] * row[LOSS_WEIGHTS]
            torch.testing.assert_close(row["advantages"], expected)
            assert bool((row[LOSS_WEIGHTS][row["response_mask"].bool()] > 0).all())
    if segment:  # 5 + 1 boundaries, each episode's summing to rows/episodes = 4/2
        assert sum(float(row[VALUE_WEIGHTS].sum()) for row in rows.values()) == pytest.approx(4.0)
        assert sum(int((row[VALUE_WEIGHTS] > 0).sum()) for row in rows.values()) == 6

    trainer.actor_rollout_wg, trainer.critic_wg = _Recorder(), _Recorder()
    trainer.checkpoint_manager = trainer.actor_rollout_wg
    trainer.global_steps = 0  # set by init() before on_init_end
    trainer.on_init_end()
    actor = [c for c in trainer.actor_rollout_wg.calls if isinstance(c, partial)]
    critic = [c for c in trainer.critic_wg.calls if isinstance(c, partial)]
    assert [c.func for c in actor] == ([trajectory_weighted_actor_loss] if actor_loss else [])
    assert [c.func for c in critic] == ([boundary_value_loss] if segment else [])
    if actor_loss:
        assert actor[0].keywords["config"].loss_agg_mode == "seq-mean-token-sum"


def test_boundary_value_loss_by_hand_and_as_agentcredits_trainer(model_path):
    """Row 0 (one episode, boundaries at tokens 0 and 2, R = 1): sigmoid(0) = 0.5, sigmoid(log 3) = 0.75; row 1 (one
    episode, one boundary, R = 0): sigmoid(-log 3) = 0.25. Weights rows/episodes / boundaries = 1/2, 1/2 and 1.
    verl's seq-mean-token-sum over 2 rows: (0.5 (0.25 x 0.5 + 0.0625 x 0.5) + 0.5 (0.0625 x 1)) / 2 = 0.0546875,
    which is agentcredit's own critic loss (value_weights 'boundary': mean over boundaries, then episodes)."""
    from agentcredit.train.losses import token_value_loss, value_weights

    log3 = float(torch.log(torch.tensor(3.0)))
    logits = [[0.0, 5.0, log3, 5.0], [-log3, 5.0]]  # 5.0: not a boundary, must not count
    data = _batch(
        {
            "old_log_probs": [[-1.0] * 4, [-1.0] * 2],
            "advantages": [[0.0] * 4, [0.0] * 2],
            "returns": [[1.0] * 4, [0.0] * 2],
            VALUE_WEIGHTS: [[0.5, 0.0, 0.5, 0.0], [1.0, 0.0]],
        }
    )
    values, flat = _sequence_output(logits)
    critic = omega_conf_to_dataclass(_compose("carl_segment", model_path).critic)
    loss, _ = boundary_value_loss(critic, {"values": values}, data)
    assert float(loss) == pytest.approx(0.0546875)
    boundary = torch.tensor([[True, False, True, False], [True, False, False, False]])
    native = token_value_loss(
        torch.sigmoid(torch.tensor([[0.0, 5.0, log3, 5.0], [-log3, 5.0, 0.0, 0.0]])),
        torch.tensor([[1.0] * 4, [0.0] * 4]),
        value_weights(boundary, torch.tensor([0, 1]), "boundary"),
    )
    assert float(native) == pytest.approx(float(loss))
    loss.backward()
    assert int((flat.grad != 0).sum()) == 3  # only the three boundary positions are trained
    del data[VALUE_WEIGHTS]
    with pytest.raises(ValueError, match=VALUE_WEIGHTS):
        boundary_value_loss(critic, {"values": values}, data)


def test_boundary_value_loss_over_a_global_mini_batch():
    """verl hands each micro-batch the mini-batch's row count (and multiplies by the ranks, whose gradients it then
    averages): the same two rows as one micro-batch of a 4-row mini-batch on 2 ranks weigh 2 x 1/4 of their sum."""
    log3 = float(torch.log(torch.tensor(3.0)))
    fields = {
        "old_log_probs": [[-1.0] * 4, [-1.0] * 2],
        "advantages": [[0.0] * 4, [0.0] * 2],
        "returns": [[1.0] * 4, [0.0] * 2],
        VALUE_WEIGHTS: [[0.5, 0.0, 0.5, 0.0], [1.0, 0.0]],
    }
    values, _ = _sequence_output([[0.0, 5.0, log3, 5.0], [-log3, 5.0]])
    critic = SimpleNamespace(loss_scale_factor=None)
    loss, _ = boundary_value_loss(critic, {"values": values}, _batch(fields, dp_size=2, global_batch_size=4))
    assert float(loss) == pytest.approx(2 * (0.078125 + 0.03125) / 4)
