"""Turn-level credit (``credit: turn``, :mod:`seal_rl.credit`): the pure functions against TRL's own
group statistics and properties, then training runs whose advantages are read where TRL's loss
reads them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seal_rl.credit import NO_TURN, anchors_with_signal, token_advantages, token_turns, turn_advantages, turn_outcomes
from seal_rl.errors import SealError
from seal_rl.tasks import TaskSet
from seal_rl.train import load_recipe, train
from tests.generators import LADDER_TASK, ladder_script
from tests.test_train import _jsonl, _recipe

ROOT = Path(__file__).resolve().parents[1]


# -- the pure functions --------------------------------------------------------------------------


outcome = st.one_of(st.none(), st.sampled_from([0.0, 1.0]))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5).flatmap(lambda turns: st.lists(st.lists(outcome, min_size=turns, max_size=turns), min_size=1, max_size=8)),
       st.booleans())  # fmt: skip
def test_turn_advantages_are_trls_group_advantage_at_each_turn(group, scale):
    """Ã(g, k) is what TRL computes for a group's rewards (nan-aware mean, Bessel std, +1e-4),
    applied to the outcomes at turn k; episodes without an outcome there get 0, as does a turn
    with fewer than two outcomes."""
    from trl.trainer.utils import nanstd

    result = turn_advantages(group, scale=scale)
    for k in range(len(group[0])):
        column = torch.tensor([math.nan if o[k] is None else o[k] for o in group], dtype=torch.float64)
        present = ~torch.isnan(column)
        if present.sum() < 2:
            assert [row[k] for row in result] == [0.0] * len(group)
            continue
        centred = column - torch.nanmean(column)
        expected = centred / (nanstd(column) + 1e-4) if scale else centred
        expected = torch.where(present, expected, torch.zeros_like(expected))
        assert [row[k] for row in result] == pytest.approx(expected.tolist(), abs=1e-6)  # nanstd divides by a float32 count
        assert sum(row[k] for row in result) == pytest.approx(0.0, abs=1e-9)


def test_anchors_with_signal_count_turns_whose_outcomes_differ():
    group = [[1.0, 0.0, None], [1.0, 1.0, None], [0.0, 1.0, 1.0]]
    assert anchors_with_signal([group]) == (2, 2)  # turn 2 has one outcome: no anchor
    assert anchors_with_signal([group, [[1.0], [1.0]]]) == (2, 3)


def test_turn_outcomes_read_the_official_per_turn_checks():
    def check(turn, failure=None, scorable=True, reached=True):
        return {"turn": turn, "failure": failure, "scorable": scorable, "reached": reached}

    record = {"num_turns": 4, "end_reason": "step_budget", "verdict": {"checker_error": None, "turns": [
        check(0), check(1, "instance_state_mismatch"), check(2, scorable=False), check(3, "empty_turn_model_response", reached=False)]}}  # fmt: skip
    assert turn_outcomes(record) == [1.0, 0.0, None, None]
    assert turn_outcomes({**record, "verdict": {"checker_error": "boom", "turns": []}}) == [None] * 4
    assert turn_outcomes({**record, "end_reason": "generation_error"}) == [None] * 4


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 6), st.integers(0, 4), st.integers(0, 3)), max_size=6))
def test_token_turns_give_each_model_token_its_messages_turn(messages):
    """Messages of ``length`` model tokens each followed by ``gap`` environment tokens."""
    mask, starts, expected = [], [], []
    for length, turn, gap in messages:
        starts.append((len(mask), turn))
        mask += [1] * length + [0] * gap
        expected += [turn] * length + [NO_TURN] * gap
    assert token_turns(starts, mask) == expected


def test_token_advantages_add_the_weighted_turn_term_where_apply_to_takes_its_sign():
    turns = [NO_TURN, 0, 0, 1, NO_TURN, 2]
    assert token_advantages(0.5, [1.0, -2.0, 0.0], turns, omega=0.0, turn_weights=[2, 2, 2]) == [0.5] * 6
    assert token_advantages(0.5, [1.0, -2.0, 0.0], turns, omega=0.5) == [0.5, 1.0, 1.0, -0.5, 0.5, 0.5]
    weighted = token_advantages(0.5, [1.0, -2.0, 0.0], turns, omega=1.0, turn_weights=[2.0, 1.5, 0.6], apply_to="positive_advantage")
    assert weighted == [0.5, 2.5, 2.5, -1.5, 0.5, 0.5]  # the negative turn term keeps weight 1
    weighted = token_advantages(0.5, [1.0, -2.0, 0.0], turns, omega=1.0, turn_weights=[2.0, 1.5, 0.6], apply_to="all")
    assert weighted == [0.5, 2.5, 2.5, -2.5, 0.5, 0.5]


def test_a_negative_credit_weight_is_a_one_line_error():
    with pytest.raises(SealError, match=r"credit_weight \(ω\) must be >= 0") as error:
        load_recipe(ROOT / "configs" / "smoke-cpu.yaml", ["credit=turn", "credit_weight=-1"])
    assert "\n" not in str(error.value)


# -- training: what reaches TRL's loss ----------------------------------------------------------


@pytest.fixture
def at_the_loss():
    """Every micro-batch TRL's loss sees: advantages, completion ids and the tokens it trains on."""
    from trl import GRPOTrainer

    seen: list[dict[str, torch.Tensor]] = []
    original = GRPOTrainer._compute_loss

    def recording(self, model, inputs):
        seen.append({"advantages": inputs["advantages"].detach().clone(), "ids": inputs["completion_ids"].clone(),
                     "trained": (inputs["completion_mask"] * inputs["tool_mask"]).bool()})  # fmt: skip
        return original(self, model, inputs)

    GRPOTrainer._compute_loss = recording
    yield seen
    GRPOTrainer._compute_loss = original


def _messages_at_the_loss(seen) -> list[tuple[tuple[int, ...], float]]:
    """(token ids, advantage) of every run of trained tokens (one model message each); a run's
    tokens must all carry the same advantage."""
    found = []
    for batch in seen:
        advantages = batch["advantages"]
        for row in range(len(batch["ids"])):
            values = advantages[row] if advantages.dim() == 2 else advantages[row].expand(len(batch["ids"][row]))
            trained = batch["trained"][row].tolist()
            position = 0
            while position < len(trained):
                if not trained[position]:
                    position += 1
                    continue
                end = position
                while end < len(trained) and trained[end]:
                    end += 1
                run = values[position:end]
                assert torch.all(run == run[0]), "one message's tokens carry different advantages"
                found.append((tuple(batch["ids"][row][position:end].tolist()), float(run[0])))
                position = end
    return sorted(found)


HALF, THIRD = 0.5 + 1e-4, math.sqrt(1 / 3) + 1e-4
LADDER_TURN_TERMS = [[0.25 / HALF, 0.25 / HALF, 0.25 / HALF, -0.75 / HALF], [0.5 / THIRD, 0.5 / THIRD, -0.5 / THIRD, -0.5 / THIRD],
                     [0.75 / HALF, -0.25 / HALF, -0.25 / HALF, -0.25 / HALF]]  # fmt: skip
"""Ã(g, k) of the ladder group by hand: row k, column g (turn outcomes 1110, 1100, 1000)"""


def _ladder_expected(tokenizer, per: int = 1, shift: int = 0) -> list[tuple[tuple[int, ...], float]]:
    """(token ids, A_g + Ã(g, k)) of every message of the ladder group (:func:`tests.generators.ladder_script`),
    by hand. ``per``: TRL samples per episode (the episode term's std is over per x [1, 0, 0, 0]);
    ``shift``: give each message the turn of the message ``shift`` later (the negative control)."""
    spread = math.sqrt(0.75 * per / (4 * per - 1)) + 1e-4  # std of per x [1, 0, 0, 0], Bessel-corrected
    episode = [0.75 / spread, -0.25 / spread, -0.25 / spread, -0.25 / spread]
    task = TaskSet.load().get(LADDER_TASK)
    values = []
    for g in range(4):
        script = ladder_script(task, g)
        for i, (message, _) in enumerate(script):
            k = script[min(i + shift, len(script) - 1)][1]
            values.append((tuple(tokenizer(message, add_special_tokens=False)["input_ids"]), episode[g] + LADDER_TURN_TERMS[k][g]))
    return sorted(values)


@pytest.mark.parametrize("layout", ["episode", "turn"])
def test_each_token_of_user_turn_k_gets_its_episode_advantage_plus_the_turns(tiny_model_dir, tmp_path, at_the_loss, layout, capsys):
    """A hand-worked group of 4 on a 3-turn task: the episodes pass their first 3, 2, 1 and 0 user
    turns (binary rewards 1, 0, 0, 0). By hand, with TRL's group advantage (r − mean) / (std + 1e-4):

        A      = [ .75, −.25, −.25, −.25] / (1/2 + 1e-4)   episode (binary reward)
        Ã(·,0) = [ .25,  .25,  .25, −.75] / (1/2 + 1e-4)   turn 0 outcomes 1 1 1 0
        Ã(·,1) = [ .5,   .5,  −.5,  −.5 ] / (√(1/3) + 1e-4) turn 1 outcomes 1 1 0 0
        Ã(·,2) = [ .75, −.25, −.25, −.25] / (1/2 + 1e-4)   turn 2 outcomes 1 0 0 0

    Every token of a model message of turn k in episode g must reach the loss at A_g + Ã(g, k), in
    both layouts. The ``turn`` layout takes 6 samples of every episode (all its messages, then masked
    copies), so TRL's group is 24 samples and the episode term's std is theirs: √(0.75·6/23) where
    the episode layout's is √(0.75/3) = 1/2; Ã stays over the 4 episodes. The negative control
    moves each message's turn boundary by one message: those values must not be what TRL saw."""
    from transformers import AutoTokenizer

    out = tmp_path / layout
    samples = {"layout": layout, "turn_samples": 6, "grpo.per_device_train_batch_size": 12} if layout == "turn" else {}
    train(_recipe(tiny_model_dir, **{
        "data.task_ids": f"[{LADDER_TASK}]", "grpo.num_generations": 4, "grpo.tasks_per_step": 1, "grpo.tasks_per_update": 1,
        "grpo.per_device_train_batch_size": 4, "grpo.max_steps": 1, "credit": "turn", "apatch.enabled": False,
        "generator": "tests.generators:turn_ladder", **samples}), out)  # fmt: skip

    said = capsys.readouterr().err
    assert "reward binary; credit turn (each user turn's tokens also get omega 1 x" in said and "turn anchors varied 100%" in said
    rows = _jsonl(out / "trajectories.jsonl")
    assert sorted(r["turn_outcomes"] for r in rows) == [[0.0] * 3, [1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0] * 3]
    tokenizer = AutoTokenizer.from_pretrained(out / "model")
    seen = _messages_at_the_loss(at_the_loss)
    per = 6 if layout == "turn" else 1
    truth, shifted = _ladder_expected(tokenizer, per), _ladder_expected(tokenizer, per, shift=1)
    assert [ids for ids, _ in seen] == [ids for ids, _ in truth]  # every message of every episode, once
    assert [v for _, v in seen] == pytest.approx([v for _, v in truth], abs=1e-5)
    assert [v for _, v in seen] != pytest.approx([v for _, v in shifted], abs=1e-3)  # negative control
    metrics = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["rollout/credit"] == "turn" and metrics["rollout/turn_anchors_varied"] == 1.0
    by_outcomes = {tuple(r["turn_outcomes"]): r["turn_advantages"] for r in rows}
    assert by_outcomes[(1.0, 1.0, 0.0)] == pytest.approx([v[1] for v in LADDER_TURN_TERMS], abs=1e-9)


def test_omega_zero_trains_exactly_as_episode_credit_and_omega_one_does_not(tiny_model_dir, tmp_path, at_the_loss):
    """``credit: turn`` with ω = 0: the same advantages, A-Patch weights and weights after one TRL
    step as ``credit: episode``, bit for bit. With ω = 1 the weights move elsewhere."""
    from safetensors.torch import load_file

    runs = {}
    for name, extra in {"episode": {}, "omega0": {"credit": "turn", "credit_weight": 0.0},
                        "omega1": {"credit": "turn", "credit_weight": 1.0}}.items():  # fmt: skip
        at_the_loss.clear()
        train(_recipe(tiny_model_dir, **{"grpo.max_steps": 1, **extra}), tmp_path / name)
        rows = _jsonl(tmp_path / name / "trajectories.jsonl")
        runs[name] = (load_file(tmp_path / name / "model" / "model.safetensors"), _messages_at_the_loss(at_the_loss),
                      [(r["task_id"], r["advantage_before"], r["advantage_after"], r["apatch_weight"]) for r in rows])  # fmt: skip
    episode, zero, one = runs["episode"], runs["omega0"], runs["omega1"]
    assert any(a != 0 for _, a, _, _ in episode[2])  # the groups carry advantages
    assert zero[2] == episode[2] and zero[1] == episode[1]
    assert all(torch.equal(zero[0][k], episode[0][k]) for k in episode[0])
    assert one[1] != episode[1]  # the turn term reaches the loss
    assert any(not torch.equal(one[0][k], episode[0][k]) for k in episode[0])


# -- TRL's own GRPOTrainer through BfclRollout ---------------------------------------------------


def test_trls_trainer_from_bfcl_trainer_class_trains_turn_credit_and_a_plain_one_is_refused(tiny_model_dir, tmp_path, at_the_loss):
    """The TRL ``rollout_func`` path: a recipe with ``credit: turn`` needs per-token advantages, so
    TRL's plain GRPOTrainer is refused with a one-line error; the trainer
    :func:`~seal_rl.integrations.trl.bfcl_trainer_class` builds hands its loss the ladder group's
    hand-worked values, as ``seal train`` does."""
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from seal_rl.integrations.trl import BfclRollout, bfcl_dataset, bfcl_reward, bfcl_trainer_class
    from tests.generators import TurnLadder

    class LadderRollout(BfclRollout):
        def _generator(self, trainer):
            return TurnLadder()

    config = GRPOConfig(output_dir=str(tmp_path / "checkpoints"), num_generations=4, per_device_train_batch_size=4,
                        max_steps=1, learning_rate=1e-3, beta=0.0, save_strategy="no", report_to="none",
                        remove_unused_columns=False, use_cpu=True, logging_steps=1, max_completion_length=24)  # fmt: skip
    dataset = bfcl_dataset(tasks=[LADDER_TASK])
    rollout = LadderRollout("vanilla-grpo", overrides=["credit=turn", "budgets.max_completion_tokens=2048"], out=tmp_path / "plain")
    plain = GRPOTrainer(model=str(tiny_model_dir), reward_funcs=[bfcl_reward], args=config, train_dataset=dataset,
                        rollout_func=rollout)  # fmt: skip
    with pytest.raises(SealError, match="bfcl_trainer_class") as error:
        plain.train()
    assert "\n" not in str(error.value)

    rollout = LadderRollout("vanilla-grpo", overrides=["credit=turn", "budgets.max_completion_tokens=2048"], out=tmp_path / "seal")
    trainer = bfcl_trainer_class()(model=str(tiny_model_dir), reward_funcs=[bfcl_reward], args=config, train_dataset=dataset,
                                   rollout_func=rollout)  # fmt: skip
    at_the_loss.clear()
    trainer.train()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    seen, truth = _messages_at_the_loss(at_the_loss), _ladder_expected(tokenizer)
    assert [ids for ids, _ in seen] == [ids for ids, _ in truth]
    assert [v for _, v in seen] == pytest.approx([v for _, v in truth], abs=1e-5)
    rows = _jsonl(tmp_path / "seal" / "trajectories.jsonl")
    assert sorted(r["progress"] for r in rows) == pytest.approx([0, 1 / 3, 2 / 3, 1])
    metrics = json.loads((tmp_path / "seal" / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["rollout/credit"] == "turn" and metrics["rollout/turn_anchors_varied"] == 1.0
