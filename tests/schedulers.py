"""Playing the same episodes under both rollout schedulers, and comparing what they generated."""

from seal_rl.env import BfclEnv
from seal_rl.generators import HFGenerator
from seal_rl.rollout import Budgets, run_episodes
from seal_rl.trajectory import ChatTokens

TASKS = ("multi_turn_base_0", "multi_turn_base_105", "multi_turn_miss_param_105", "multi_turn_base_6",
         "multi_turn_long_context_3", "multi_turn_miss_func_12", "multi_turn_base_38", "multi_turn_base_100")  # fmt: skip
BUDGETS = Budgets(max_prompt_tokens=20000, max_completion_tokens=300, max_new_tokens=40)
NEAR_TIE = 1e-3
"""largest top-2 logit gap (float32) at which a different batch composition may pick the other token"""


def play(model, tokenizer, task_set, scheduler, *, tasks=TASKS, temperature=0.0, seed=3, max_batch=4, concurrency=8,
         generator=None, budgets=BUDGETS, stats=None):  # fmt: skip
    generator = generator or HFGenerator(model, tokenizer, temperature=temperature, max_batch=max_batch)
    episodes = [(i, task_set.get(t), {}) for i, t in enumerate(tasks)]
    return run_episodes(episodes, generator, BfclEnv, chat=ChatTokens(tokenizer), budgets=budgets, concurrency=concurrency,
                        seed=seed, scheduler=scheduler, stats=stats)  # fmt: skip


def differences(model, expected, got) -> list[str]:
    """Episodes whose samples differ, except where the first different token is a near-tie of the
    model's logits (the two tokens' logits within ``NEAR_TIE`` of each other, read from one
    unbatched forward pass over the expected sample up to that token)."""
    import torch

    out = []
    for a, b in zip(expected, got, strict=True):
        x, y = a.trajectory.ids, b.trajectory.ids
        if x == y and a.record["messages"] == b.record["messages"] and a.record["end_reason"] == b.record["end_reason"]:
            continue
        at = next((k for k, (i, j) in enumerate(zip(x, y)) if i != j), min(len(x), len(y)))
        if at < len(a.trajectory.prompt_ids) or at >= min(len(x), len(y)):
            out.append(f"episode {a.index}: the samples differ outside a model token (position {at})")
            continue
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([x[:at]])).logits[0, -1]
        gap = abs(float(logits[x[at]] - logits[y[at]]))
        if gap > NEAR_TIE:
            out.append(f"episode {a.index}: token {at} is {x[at]} vs {y[at]}, logit gap {gap:.2e} (not a near-tie)")
        else:
            print(f"episode {a.index}: token {at} differs at a near-tie, logit gap {gap:.2e}")
    return out
