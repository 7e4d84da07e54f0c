"""Hostile inputs from issue 14 against the environment, with and without the resource caps.

Each attack runs through the path that hit it (``evaluate()`` on a replay file for the replay line,
``BfclEnv`` + the verifier for single messages), in a fresh process so peak RSS belongs to it
alone. The unguarded path is the same code with the caps lifted (``EnvConfig`` limits set beyond
reach; the old exponent-only resource guard; the old regexes), measured in the same run at a size
that finishes in bounded time; the table says which size.

Usage: python benchmarks/bench_attacks_env.py   (under a minute)
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from pathlib import Path

from rich.table import Table

from harness import in_fresh_process, peak_mib, provenance_console, rss_mib

TASK = "multi_turn_base_0"  # GorillaFileSystem: touch + echo make the 99 KB file the attack reads
FILE_CHARS = 99_000
CATS_PER_MESSAGE = 1_500  # one 112 KB hermes message
UNGUARDED = {"max_calls_per_message": 10**9, "max_result_chars": 10**12, "observation_budget_chars": 10**15,
             "step_timeout_s": 10.0**9, "max_message_chars": 10**9}  # fmt: skip
BIG_BASE = int("7" * 4_000)
OLD_MAX_INTEGER_EXPONENT = 10_000


def _hermes(calls) -> str:
    from seal_rl.tools import ToolCall, get_format

    return get_format("hermes").render([ToolCall(name, args) for name, args in calls])


def _write_file_message() -> str:
    return _hermes([("touch", {"file_name": "big.txt"}), ("echo", {"content": "x" * FILE_CHARS, "file_name": "big.txt"})])


def _cat_message(count: int) -> str:
    return _hermes([("cat", {"file_name": "big.txt"})] * count)


def _old_guard(class_name, method, arguments):
    """resource_guard before issue 14: the exponent alone was checked."""
    if class_name == "MathAPI" and method == "power":
        base, exponent = arguments.get("base"), arguments.get("exponent")
        if isinstance(base, int) and isinstance(exponent, int) and abs(base) > 1 and abs(exponent) > OLD_MAX_INTEGER_EXPONENT:
            return "too large"
    return None


def attack_message(messages: list[str], guarded: bool) -> dict:
    """One episode of ``messages`` through BfclEnv, then the verifier; peak RSS above the start."""
    from seal_rl.env import BfclEnv, EnvConfig
    from seal_rl.tasks import TaskSet

    task = TaskSet.load().get(TASK)
    env = BfclEnv(EnvConfig(max_message_chars=200_000) if guarded else EnvConfig(**UNGUARDED))
    env.reset(task)
    env.step(messages[0])
    base = rss_mib()
    started = time.perf_counter()
    for message in messages[1:]:
        if env.done:
            break
        env.step(message)
    env.truncate("policy_exhausted")
    record = json.dumps(env.record())
    return {"seconds": time.perf_counter() - started, "peak": peak_mib() - base, "end": env.end_reason,
            "observation": env.observation_chars, "record": len(record)}  # fmt: skip


def attack_replay(lines: list[dict], guarded: bool) -> dict:
    """``evaluate()`` on a replay file, as ``seal eval --policy replay:FILE`` plays it."""
    from seal_rl.env import EnvConfig
    from seal_rl.evaluate import evaluate
    from seal_rl.policies import ReplayPolicy
    from seal_rl.tasks import TaskSet

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "replay.jsonl"
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        policy = ReplayPolicy(path)
        episodes = policy.episodes([], TaskSet.load(), "hermes")
        base = rss_mib()
        started = time.perf_counter()
        evaluate(episodes, EnvConfig() if guarded else EnvConfig(**UNGUARDED), Path(tmp) / "run", policy=policy)
        seconds = time.perf_counter() - started
        record = json.loads((Path(tmp) / "run" / "results.jsonl").read_text().splitlines()[0])
    return {"seconds": seconds, "peak": peak_mib() - base, "end": record["end_reason"],
            "observation": record.get("observation_chars")}  # fmt: skip


def attack_power(exponent: int, guarded: bool) -> dict:
    """One ``power`` call with a 4,000-digit base: the step, then the verifier's re-execution."""
    import seal_rl.backends
    from seal_rl.env import BfclEnv
    from seal_rl.tasks import TaskSet

    if not guarded:
        seal_rl.backends.resource_guard = _old_guard
    task = next(t for t in TaskSet.load() if "MathAPI" in t.involved_classes)
    env = BfclEnv()
    env.reset(task)
    started = time.perf_counter()
    env.step(_hermes([("power", {"base": BIG_BASE, "exponent": exponent})]))
    env.truncate("policy_exhausted")
    return {"seconds": time.perf_counter() - started, "end": env.end_reason, "result": env.trace[-1].result[:60]}


def slowest_admitted_calls() -> list[tuple[str, float, str]]:
    """The costliest MathAPI calls the resource guard still lets run (each a single C operation a
    signal cannot interrupt): their time is the slack past ``step_timeout_s``."""
    from seal_rl.backends import MAX_INTEGER_DIGITS, MAX_PRECISION, Backends
    from seal_rl.tasks import TaskSet
    from seal_rl.tools import ToolCall

    backends = Backends(next(t for t in TaskSet.load() if "MathAPI" in t.involved_classes))
    widest = 10**MAX_INTEGER_DIGITS - 1
    calls = [
        ("power", {"base": widest, "exponent": 23}),
        ("power", {"base": 7, "exponent": 118_000}),
        ("logarithm", {"value": widest, "base": 3, "precision": MAX_PRECISION}),
        ("square_root", {"number": widest, "precision": MAX_PRECISION}),
        ("round_number", {"number": widest, "decimal_places": -MAX_PRECISION}),
        ("multiply", {"a": widest, "b": widest}),
        ("mean", {"numbers": [widest] * 23}),  # 23 such numbers fill a 100 KB message
    ]
    rows = []
    for name, arguments in calls:
        started = time.perf_counter()
        outcome = backends.execute(ToolCall(name, arguments))
        rows.append((name, time.perf_counter() - started, outcome.output[:50]))
    return rows


_OLD_FENCE = re.compile(r"```[A-Za-z0-9_-]*\s*\n?(.*?)\n?```", flags=re.DOTALL)
_OLD_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def _old_strip_fence(text: str) -> str:
    match = _OLD_FENCE.fullmatch(text)
    return match.group(1).strip() if match else text


def _backtick_message(chars: int) -> str:
    """The issue's shape: an opening fence, then letters and no closing fence."""
    return "```" + "a" * (chars - 4) + "`"


def _message(shape: str, chars: int) -> tuple[str, str]:
    """(format, message) of about ``chars`` characters for each hostile shape."""
    if shape == "fence + letters (pythonic)":
        return "pythonic", _backtick_message(chars)
    if shape == "fenced call, long argument (json)":
        return "json", '```json\n{"name": "cat", "parameters": {"file_name": "' + "a" * (chars - 60) + '"}}\n```'
    closes = "</tool_call>" * (chars // 46)
    return "hermes", closes + "<tool_call>" * (chars // 46) + "x" * (chars - 2 * len(closes))


def attack_parser(shape: str, chars: int, guarded: bool, repeats: int = 3) -> float:
    """Best-of seconds per parse of a ``chars``-long message of ``shape``."""
    import seal_rl.tools
    from seal_rl.tools import get_format

    if not guarded:
        seal_rl.tools._strip_fence = _old_strip_fence
        seal_rl.tools._hermes_blocks = lambda text: [m.span() for m in _OLD_HERMES.finditer(text)]
    name, message = _message(shape, chars)
    fmt = get_format(name)
    best = float("inf")
    for _ in range(repeats):
        loops = 1 if not guarded else 50
        started = time.perf_counter()
        for _ in range(loops):
            fmt.parse(message)
        best = min(best, (time.perf_counter() - started) / loops)
    return best


def parse_series(shape: str, lengths: tuple[int, ...], guarded: bool) -> list[float]:
    """attack_parser at each length, in one process (best of 5)."""
    return [attack_parser(shape, chars, guarded, repeats=5) for chars in lengths]


def main() -> None:
    console = provenance_console(width=140)
    write = _write_file_message()
    flood = _cat_message(CATS_PER_MESSAGE)
    replay_messages = [write] + [_cat_message(1_270)] * 22  # 95 KB each: under max_message_chars
    replay_line = {"task_id": TASK, "assistant": replay_messages}
    line_mb = len(json.dumps(replay_line)) / 1e6

    table = Table(title="Issue 14 attacks: guarded (defaults) vs unguarded (caps lifted), same run, fresh process each")
    for column in ("attack", "path", "input", "end / outcome", "time s", "peak RSS MiB", "ratio"):
        table.add_column(column, justify="left" if column in ("attack", "path", "input", "end / outcome") else "right")

    guarded = in_fresh_process(attack_message, [write, flood], True)
    unguarded = in_fresh_process(attack_message, [write, flood], False)
    table.add_row("cat amplification", "BfclEnv + verify", f"{len(flood) / 1e3:.0f} KB, {CATS_PER_MESSAGE:,} cats",
                  f"guarded: {guarded['end']}, {guarded['observation']:,} chars shown", f"{guarded['seconds']:.2f}",
                  f"{guarded['peak']:.0f}", "")  # fmt: skip
    table.add_row("", "", "", f"unguarded: {unguarded['observation'] / 2**20:.0f} MiB shown", f"{unguarded['seconds']:.2f}",
                  f"{unguarded['peak']:.0f}", f"{unguarded['peak'] / max(guarded['peak'], 1):.0f}x memory")  # fmt: skip

    at_cap = in_fresh_process(attack_message, [write] + [_cat_message(64)] * 19, True)
    table.add_row("", "", "19 messages of 64 cats (at the call cap)", f"guarded: {at_cap['end']}, {at_cap['observation']:,} chars",
                  f"{at_cap['seconds']:.2f}", f"{at_cap['peak']:.0f}", "")  # fmt: skip

    guarded = in_fresh_process(attack_replay, [replay_line], True)
    unguarded = in_fresh_process(attack_replay, [{"task_id": TASK, "assistant": replay_messages[:2]}], False)
    table.add_row("replay line", "evaluate() (seal eval)", f"{line_mb:.1f} MB line, 22 x 1,270 cats",
                  f"guarded: {guarded['end']}", f"{guarded['seconds']:.2f}", f"{guarded['peak']:.0f}", "")  # fmt: skip
    table.add_row("", "", "unguarded: first cat message only", f"unguarded: {unguarded['end']}", f"{unguarded['seconds']:.2f}",
                  f"{unguarded['peak']:.0f}", f"{unguarded['peak'] / max(guarded['peak'], 1):.0f}x memory for 1/22 of it")  # fmt: skip

    guarded = in_fresh_process(attack_power, 10_000, True)
    unguarded = in_fresh_process(attack_power, 400, False)
    table.add_row("4,000-digit power", "BfclEnv + verify", "base 4,000 digits ** 10,000", "guarded: refused (too large)",
                  f"{guarded['seconds']:.4f}", "", "")  # fmt: skip
    table.add_row("", "", "unguarded: ** 400 (1/25 of the exponent)", "unguarded: computed twice (step + verifier)",
                  f"{unguarded['seconds']:.2f}", "", f"{unguarded['seconds'] / guarded['seconds']:.0f}x time at 1/25")  # fmt: skip

    shape = "fence + letters (pythonic)"
    new = in_fresh_process(attack_parser, shape, 100_000, True)
    old = in_fresh_process(attack_parser, shape, 5_000, False)
    table.add_row("backtick message", "pythonic/json parse", "100 KB fence + letters", "guarded: not a call, plain text",
                  f"{new:.6f}", "", "")  # fmt: skip
    table.add_row("", "", "unguarded: 5 KB (1/20 of it)", "unguarded: regex backtracking", f"{old:.4f}", "",
                  f"{old / new:,.0f}x time at 1/20 size")  # fmt: skip
    console.print(table)

    slack = Table(title="Slowest calls the guard admits (one uninterruptible C operation each = the slack past step_timeout_s)")
    for column in ("call", "seconds", "output"):
        slack.add_column(column, justify="right" if column == "seconds" else "left")
    for name, seconds, output in in_fresh_process(slowest_admitted_calls):
        slack.add_row(name, f"{seconds:.3f}", output)
    console.print(slack)
    console.print(_growth_table(in_fresh_process))
    console.print("One larger step near 128 KB is the allocator moving big strings to mmap (a constant factor); "
                  "the doublings after it are x2 again.")  # fmt: skip


def _growth_table(fresh) -> Table:
    """Parse time per message length: linear (x2 per doubling) after the fix, quadratic (x4) before."""
    growth = Table(title="Parse time (s) per message length (doubling), fresh process each; x = ratio to the previous "
                         "length: x2 is linear, x4 quadratic")  # fmt: skip
    growth.add_column("shape")
    growth.add_column("path")
    lengths = (2_500, 5_000, 10_000, 20_000, 40_000, 80_000, 160_000, 320_000)
    for chars in lengths:
        growth.add_column(f"{chars / 1000:g}K", justify="right")
    for shape in ("fence + letters (pythonic)", "fenced call, long argument (json)", "unmatched tags (hermes)"):
        for guarded in (True, False):
            measured = lengths if guarded else lengths[:3]  # quadratic: 100 KB would take minutes
            times = fresh(parse_series, shape, measured, guarded)
            cells = [f"{t:.2g}" + (f" x{t / times[i - 1]:.1f}" if i else "") for i, t in enumerate(times)]
            growth.add_row(shape if guarded else "", "guarded" if guarded else "old regex", *cells, *["-"] * (len(lengths) - len(times)))
    return growth


if __name__ == "__main__":
    main()
