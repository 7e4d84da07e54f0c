"""Seconds per model call of a real model on real BFCL episode prompts: raw ``generate``, ``HFGenerator``
without the shared-prefix KV cache and with it, measured in the same run.

The prompts are the ones ``seal eval --policy hf:DIR`` sends: the ground-truth episodes of test
tasks played through the episode driver with the model's tokenizer (default protocol, prompt
mode and call format), so call 1 of a task is its opening prompt (tool prompt + first question)
and later calls are the conversation so far plus the next observation. The tasks share their
backends, hence their tool prompt, as many tasks of a run do. For each call, in episode order:

* raw: ``model.generate`` on the prompt ids (batch of one, the same end-of-message tokens);
* no cache: ``HFGenerator(prefix_cache_tokens=0)``, today's path;
* cache: one ``HFGenerator`` with the prefix cache (default size) kept across the calls, as in a run.

All three decode greedily at most ``--max-new-tokens``; the table says whether their tokens agree.
With ``--repeats R`` the calls are played R times (the cache starts empty each time) and each
call's fastest time is kept: on a shared machine the slower ones measure the neighbours.
The model is loaded as ``seal eval`` loads it (its configured dtype, on the CPU).

Usage: python benchmarks/bench_real_eval.py [--model DIR] [--tasks 2] [--calls 2] [--max-new-tokens 32] [--repeats 1] [--threads N]
Without --model it takes the pulled qwen2.5-coder-0.5b-instruct (``seal models pull``); when that is
not there the benchmark says so and exits 0 (it needs a model on disk).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from rich.table import Table

from seal_rl.env import BfclEnv
from seal_rl.generators import HFGenerator, ScriptedGenerator
from seal_rl.policies import OraclePolicy
from seal_rl.rollout import Budgets, Request, run_episodes
from seal_rl.tasks import TaskSet
from seal_rl.trajectory import ChatTokens

from harness import provenance_console, pulled_model, timed, times

DEFAULT_MODEL = "qwen2.5-coder-0.5b-instruct"


def same_backend_tasks(task_set: TaskSet, count: int) -> list:
    """The first ``count`` test tasks (base category) that instantiate the same backends."""
    groups: dict[tuple[str, ...], list] = {}
    for task in task_set.select("test", ["base"]):
        group = groups.setdefault(task.involved_classes, [])
        group.append(task)
        if len(group) == count:
            return group
    raise SystemExit(f"no {count} test tasks share their backends")


class Recording:
    """The oracle's answers through the episode driver, remembering every request (prompt ids)."""

    def __init__(self, agents) -> None:
        self.inner = ScriptedGenerator(agents)
        self.requests: list[Request] = []

    def generate(self, requests, seed):
        self.requests += requests
        return self.inner.generate(requests, seed)


def episode_prompts(tasks: list, chat: ChatTokens, calls: int) -> list[tuple[str, int, list[int]]]:
    """(task id, call number, prompt ids) of the first ``calls`` model calls of each task's oracle episode."""
    episodes = OraclePolicy().episodes(tasks, None, "hermes")
    recording = Recording({e.index: e.agent for e in episodes})
    run_episodes([(e.index, e.task, {}) for e in episodes], recording, BfclEnv, chat=chat,
                 budgets=Budgets(max_prompt_tokens=10**9, max_completion_tokens=8192), concurrency=1)  # fmt: skip
    prompts, seen = [], {}
    for request in recording.requests:
        seen[request.episode] = seen.get(request.episode, 0) + 1
        if seen[request.episode] <= calls:
            prompts.append((request.task.id, seen[request.episode], list(request.prompt_ids)))
    return prompts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help=f"a transformers model directory [default: the pulled {DEFAULT_MODEL}]")
    parser.add_argument("--tasks", type=int, default=2, help="test tasks with the same backends")
    parser.add_argument("--calls", type=int, default=2, help="model calls measured per task (its first ones)")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="tokens generated per call")
    parser.add_argument("--repeats", type=int, default=1, help="play the calls this many times, keep each call's fastest")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = parser.parse_args()
    model_dir = args.model or pulled_model(DEFAULT_MODEL)
    if model_dir is None:
        print(f"skipped: no model directory; pass --model DIR (or pull {DEFAULT_MODEL} if `seal models` exists)")
        return 0

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    from seal_rl.precision import checkpoint_dtype, resolve_dtype

    dtype, said = resolve_dtype("auto", checkpoint_dtype(model_dir))  # as `seal eval --policy hf:` loads it
    print(said)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
    model.eval()
    chat = ChatTokens(tokenizer)
    tasks = same_backend_tasks(TaskSet.load(), args.tasks)
    prompts = episode_prompts(tasks, chat, args.calls)
    eos = sorted(chat.eos_ids)

    def raw(ids: list[int]) -> list[int]:
        input_ids = torch.tensor([ids])
        with torch.no_grad():
            output = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                                    max_new_tokens=args.max_new_tokens, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id,
                                    temperature=None, top_p=None, top_k=None)  # fmt: skip
        return output[0, len(ids):].tolist()

    def ours(generator: HFGenerator, ids: list[int]) -> list[int]:
        (generation,) = generator.generate([Request(0, None, [], [], {}, ids, args.max_new_tokens)], seed=0)
        return generation.token_ids

    plain = HFGenerator(model, tokenizer, temperature=0.0, prefix_cache_tokens=0)
    raw(prompts[0][2][:64])  # first-call overheads (thread pools, kernels) out of the measurements
    seconds = [[float("inf")] * 3 for _ in prompts]  # per call: the fastest of the repeats (the machine may be shared)
    reused, same = [0] * len(prompts), [True] * len(prompts)
    for _ in range(args.repeats):
        cached = HFGenerator(model, tokenizer, temperature=0.0)  # a fresh cache: every repeat plays the calls as a run does
        if cached.prefix_cache is None:
            raise SystemExit(f"{model_dir}: this model cannot use the prefix cache (see the warning above)")
        for number, (_, _, ids) in enumerate(prompts):
            t_raw, tokens_raw = timed(lambda: raw(ids))
            t_plain, tokens_plain = timed(lambda: ours(plain, ids))
            before = cached.prefix_cache.reused
            t_cache, tokens_cache = timed(lambda: ours(cached, ids))
            reused[number] = cached.prefix_cache.reused - before
            # ours keeps the first end-of-message token and drops what follows
            same[number] &= tokens_raw[: len(tokens_plain)] == tokens_plain == tokens_cache
            seconds[number] = [min(a, b) for a, b in zip(seconds[number], (t_raw, t_plain, t_cache))]
    table = Table("call", "task", "prompt tokens", "read from cache", "raw s", "no cache s", "cache s",
                  "no cache / raw", "cache speed-up", "same tokens",
                  title=f"{model_dir.name}: seconds per model call ({torch.get_num_threads()} threads, "
                        f"{next(model.parameters()).dtype}, {args.max_new_tokens} new tokens at most, "
                        f"fastest of {args.repeats})")  # fmt: skip
    for number, ((task_id, call, ids), (t_raw, t_plain, t_cache)) in enumerate(zip(prompts, seconds)):
        table.add_row(str(number + 1), f"{task_id} #{call}", f"{len(ids):,}", f"{reused[number]:,}", f"{t_raw:.2f}",
                      f"{t_plain:.2f}", f"{t_cache:.2f}", times(t_plain, t_raw), times(t_plain, t_cache, 1),
                      "yes" if same[number] else "NO")  # fmt: skip
    console = provenance_console(width=160)
    console.print(table)
    mean = [statistics.mean(column) for column in zip(*seconds)]
    warm = [statistics.mean(column) for column in zip(*seconds[1:])] if len(seconds) > 1 else mean
    console.print(f"mean over {len(seconds)} calls: raw {mean[0]:.2f} s, no cache {mean[1]:.2f} s, cache {mean[2]:.2f} s")
    console.print(f"no cache / raw: {times(mean[1], mean[0])} (target <= 1.1x)")
    console.print(f"cache speed-up, all calls: {times(mean[1], mean[2], 1)}; after the first call (cache warm): "
                  f"{times(warm[1], warm[2], 1)} (target >= 3x per call)")  # fmt: skip
    console.print(f"prefix cache: {len(cached.prefix_cache)} entries, {cached.prefix_cache.tokens:,} tokens held; "
                  f"{cached.prefix_cache.reused:,} prompt tokens reused, {cached.prefix_cache.prefilled:,} prefilled")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
