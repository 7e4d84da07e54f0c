"""seal_rl.budgets: ground truths within a recipe's token budgets, against lengths computed here
independently (the oracle's transcript played through the environment, the whole conversation
rendered by the chat template and tokenised at once)."""

from __future__ import annotations

from collections import Counter

import pytest
from transformers import AutoTokenizer

from seal_rl.budgets import BudgetCount, CategoryCount, count_within_budgets, summary_line
from seal_rl.env import BfclEnv, EnvConfig
from seal_rl.faults import oracle_transcript
from seal_rl.rollout import Budgets
from seal_rl.tools import get_format
from seal_rl.verify import ground_truth_calls

ENV = EnvConfig(max_model_calls=100)  # no environment limit gets in the way of the token budgets
ROOMY = Budgets(max_prompt_tokens=10**6, max_completion_tokens=10**6, max_new_tokens=10**6)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def long_context(task_set):
    return task_set.select("train", ["long_context"], None)


@pytest.fixture(scope="module")
def lengths(long_context, tokenizer):
    """Per task, measured without the driver: (prompt tokens, completion tokens, longest message
    with its end-of-message token)."""
    fmt = get_format("hermes")
    out = {}
    for task in long_context:
        env = BfclEnv(ENV)
        opening, _ = env.reset(task)
        messages, _ = oracle_transcript(task, ground_truth_calls(task), fmt)
        for message in messages:
            env.step(message)
        assert env.end_reason == "completed"
        prompt = tokenizer.apply_chat_template(opening, add_generation_prompt=True, tokenize=False)
        whole = tokenizer.apply_chat_template(env.messages, tokenize=False)
        assert whole.startswith(prompt)
        completion = len(tokenizer(whole, add_special_tokens=False)["input_ids"]) - len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        longest = max(len(tokenizer(m, add_special_tokens=False)["input_ids"]) + 1 for m in messages)
        out[task.id] = (len(tokenizer(prompt, add_special_tokens=False)["input_ids"]), completion, longest)
    return out


def _cut_between(values: list[int], margin: int = 8) -> int:
    """A budget near the middle of ``values`` with no value within ``margin`` of it (the driver's
    and this file's tokenisations may differ by a token or two at message boundaries)."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    for i in sorted(range(1, len(ordered)), key=lambda i: abs(i - middle)):
        low, high = ordered[i - 1], ordered[i]
        if high - low > 2 * margin:
            return (low + high) // 2
    raise AssertionError("no gap in the lengths")


def test_everything_fits_roomy_budgets(long_context, task_set, tokenizer):
    count = count_within_budgets(long_context, task_set, tokenizer, ENV, ROOMY)
    assert (count.tasks, count.within, dict(count.ended_by)) == (len(long_context), len(long_context), {})


def test_a_shrunk_completion_budget_leaves_out_exactly_the_longer_ground_truths(long_context, task_set, tokenizer, lengths):
    budget = _cut_between([completion for _, completion, _ in lengths.values()])
    expected = sum(completion <= budget for _, completion, _ in lengths.values())
    assert 0 < expected < len(long_context)
    count = count_within_budgets(long_context, task_set, tokenizer, ENV, Budgets(10**6, budget, 10**6))
    c = count.categories["long_context"]
    assert (c.tasks, c.within) == (len(long_context), expected)
    assert c.ended_by == Counter({"completion_budget": len(long_context) - expected})


def test_a_shrunk_message_budget_leaves_out_the_ground_truths_with_a_longer_message(long_context, task_set, tokenizer, lengths):
    budget = _cut_between([longest for _, _, longest in lengths.values()], margin=1)
    expected = sum(longest <= budget for _, _, longest in lengths.values())
    assert 0 < expected < len(long_context)
    count = count_within_budgets(long_context, task_set, tokenizer, ENV, Budgets(10**6, 10**6, budget))
    assert count.within == expected and count.ended_by == Counter({"max_new_tokens": len(long_context) - expected})


def test_a_shrunk_prompt_budget_and_the_environments_call_limit_end_episodes_too(long_context, task_set, tokenizer, lengths):
    budget = _cut_between([prompt for prompt, _, _ in lengths.values()])
    expected = sum(prompt <= budget for prompt, _, _ in lengths.values())
    count = count_within_budgets(long_context, task_set, tokenizer, ENV, Budgets(budget, 10**6, 10**6))
    assert count.within == expected and count.ended_by == Counter({"prompt_budget": len(long_context) - expected})
    assert count.categories["long_context"].longest_prompt == max(prompt for prompt, _, _ in lengths.values())
    two_calls = count_within_budgets(long_context[:5], task_set, tokenizer, EnvConfig(max_model_calls=2), ROOMY)
    assert two_calls.within == 0 and set(two_calls.ended_by) == {"max_model_calls"}


def test_the_summary_line_counts_per_category_and_names_what_ended_the_rest():
    count = BudgetCount({"base": CategoryCount(100, 100), "long_context": CategoryCount(100, 60, Counter(completion_budget=35, max_new_tokens=5))}, 1.25)
    assert summary_line(count) == (
        "ground truths within budgets: base 100/100, long_context 60/100 — 35 end with completion_budget, 5 with max_new_tokens "
        "(200 tasks played with the recipe's tokenizer in 1.2 s)"
    )
