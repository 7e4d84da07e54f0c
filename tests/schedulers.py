"""Playing the same episodes under both rollout schedulers, and comparing what they generated."""

from seal_rl.env import BfclEnv
from seal_rl.generators import HFGenerator
from seal_rl.generators.decode_batch import divergence
from seal_rl.rollout import Budgets, run_episodes
from seal_rl.trajectory import ChatTokens

TASKS = ("multi_turn_base_0", "multi_turn_base_105", "multi_turn_miss_param_105", "multi_turn_base_6",
         "multi_turn_long_context_3", "multi_turn_miss_func_12", "multi_turn_base_38", "multi_turn_base_100")  # fmt: skip
BUDGETS = Budgets(max_prompt_tokens=20000, max_completion_tokens=300, max_new_tokens=40)


def play(model, tokenizer, task_set, scheduler, *, tasks=TASKS, temperature=0.0, seed=3, max_batch=4, concurrency=8,
         generator=None, budgets=BUDGETS, stats=None):  # fmt: skip
    generator = generator or HFGenerator(model, tokenizer, temperature=temperature, max_batch=max_batch)
    episodes = [(i, task_set.get(t), {}) for i, t in enumerate(tasks)]
    return run_episodes(episodes, generator, BfclEnv, chat=ChatTokens(tokenizer), budgets=budgets, concurrency=concurrency,
                        seed=seed, scheduler=scheduler, stats=stats)  # fmt: skip


def differences(model, expected, got) -> list[str]:
    """Episodes whose samples differ, except where the first different token is a near-tie of the
    model's logits (:func:`~seal_rl.generators.decode_batch.divergence`: the two tokens' logits
    within two units in the last place of the model's dtype, at least 1e-3, read from one unbatched
    forward pass over the expected sample up to that token)."""
    out = []
    for a, b in zip(expected, got, strict=True):
        if a.record["messages"] != b.record["messages"] or a.record["end_reason"] != b.record["end_reason"]:
            if a.trajectory.ids == b.trajectory.ids:
                out.append(f"episode {a.index}: the same tokens gave different records")
                continue
        found = divergence(model, a.trajectory.ids, b.trajectory.ids)
        if found is None:
            continue
        if found.position < len(a.trajectory.prompt_ids) or not found.near_tie:
            out.append(f"episode {a.index}: token {found.position} is {found.tokens[0]} vs {found.tokens[1]}, "
                       f"logit gap {found.gap:.2e} above {found.tolerance:.2e} (not a near-tie)")  # fmt: skip
        else:
            print(f"episode {a.index}: token {found.position} differs at a near-tie, logit gap {found.gap:.2e}")
    return out
