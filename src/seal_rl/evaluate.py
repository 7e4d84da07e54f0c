"""Strict-protocol evaluation: play episodes, score them, write a run directory.

A run directory holds:

* ``results.jsonl`` — one line per episode, in input order, written and flushed as each episode
  ends: ``index`` (1-based input position; the line number for replay files), ``task_id``,
  ``category``, ``reward``, ``end_reason``, ``turns_reached``, ``num_turns``, ``model_calls``,
  ``messages`` (the transcript), ``trace`` (every call with its result and error kind),
  ``verdict`` (per-turn checks), ``diagnosis`` (one label per ground-truth turn with its evidence,
  and progress), ``reference_labels`` (the released SEAL code's labels) and policy extras
  (``faults`` for the oracle, ``input`` for replay).
* ``summary.json`` — success per category with Wilson 95% intervals, their average (the paper's
  metric) with an interval, pass@k when tasks were sampled several times, generation errors.
* ``config.json`` — the policy, environment and model settings, episodes and versions: re-running
  the same command into the same directory resumes it (episodes that ended in a generation error
  are played again); a different run there is refused.

Evaluation uses the base interface. ``seal eval`` plays the ``bfcl`` protocol by default (the
official ``bfcl generate`` loop, so numbers line up with the leaderboard); ``--protocol seal``
plays the released SEAL code's (see :mod:`seal_rl.protocol`). ``summary.json`` states the
protocol, the split and the number of tasks behind every number.
"""

from __future__ import annotations

import json
import platform
import sys
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import MISSING, asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from seal_rl import __version__
from seal_rl.bfcl import BFCL_VERSION
from seal_rl.diagnose import add_diagnosis
from seal_rl.env import BfclEnv, EnvConfig
from seal_rl import jsonl
from seal_rl.errors import SealError, SealWarning
from seal_rl.policies import BfclResultPolicy, Episode, ModelPolicy, OraclePolicy, Policy, ReplayPolicy, ServerPolicy, VLLMPolicy, parse_policy
from seal_rl.generators import HFGenerator, OpenAIGenerator, ScriptedGenerator, ServerSettings, VLLMEngineGenerator
from seal_rl.generators.prefix_cache import DEFAULT_MAX_TOKENS as DEFAULT_PREFIX_CACHE_TOKENS
from seal_rl.runlock import run_lock
from seal_rl.rollout import SCHEDULERS, Budgets, Generator, resolve_scheduler, run_episodes
from seal_rl.stats import mean_interval, pass_at_k, wilson
from seal_rl.tasks import CATEGORIES
from seal_rl.tools import ToolCatalog
from seal_rl.trajectory import ChatTokens

SCRIPTED = (OraclePolicy, ReplayPolicy, BfclResultPolicy)
"""Policies whose messages are scripted (no model settings, no token budgets)."""
RESULTS_FILE = "results.jsonl"
SUMMARY_FILE = "summary.json"
CONFIG_FILE = "config.json"


def play(env: BfclEnv, episode: Episode) -> dict[str, Any]:
    """Play one scripted episode to its end and return its result line."""
    generator = ScriptedGenerator({episode.index: episode.agent})
    (rollout,) = run_episodes([(episode.index, episode.task, episode.extra)], generator, lambda: env)
    add_diagnosis(rollout.record)
    return rollout.record


PASSING_LABELS = frozenset({"pass", "correct_abstention"})


def episode_counts(record: dict[str, Any]) -> dict[str, Any]:
    """What one finished episode did, turn by turn and message by message, as counts that pool over
    episodes (:func:`turn_measures`): its ground-truth turns and those Ψ labels ``pass`` or
    ``correct_abstention``; its model messages and those that were accepted calls (at least one call
    read in the required syntax and executed: a trace entry with ``accepted``); Ψ's label of each turn
    that did not pass. The record needs its ``diagnosis`` (:func:`~seal_rl.diagnose.add_diagnosis`)."""
    labels = [t["label"] for t in record["diagnosis"]["labels"]]
    return {
        "turns": len(labels),
        "passed": sum(label in PASSING_LABELS for label in labels),
        "messages": sum(m["role"] == "assistant" for m in record["messages"]),
        "calls": len({entry["step"] for entry in record["trace"] if entry["accepted"]}),
        "labels": [label for label in labels if label not in PASSING_LABELS],
    }


def turn_measures(counts: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Pooled :func:`episode_counts`: the turn pass rate (passed / ground-truth turns), the share of
    model messages that were accepted calls, and the label counts of the turns that did not pass."""
    totals: Counter[str] = Counter()
    labels: Counter[str] = Counter()
    for c in counts:
        totals.update({key: c[key] for key in ("turns", "passed", "messages", "calls")})
        labels.update(c["labels"])
    turns, messages = totals["turns"], totals["messages"]
    return {"turn_pass_rate": totals["passed"] / turns if turns else 0.0, "call_share": totals["calls"] / messages if messages else 0.0,
            "turns": turns, "messages": messages, "labels": dict(labels.most_common())}  # fmt: skip


def summarize(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Success per category with Wilson 95% intervals, their unweighted average (the paper's metric,
    with an adjusted Wald interval), the overall rate, pass@k over samples and generation errors.

    Episodes that ended in a generation error are counted under ``errors`` and left out of every
    rate: a server that failed is not a model that failed.
    """
    counts = {category: [0, 0, 0] for category in CATEGORIES}  # BFCL's order; other families' categories as they come
    by_task: dict[str, list[bool]] = {}
    categories_of: dict[str, str] = {}
    for record in records:
        row = counts.setdefault(record["category"], [0, 0, 0])
        if record.get("error"):
            row[2] += 1
            continue
        row[0] += record["reward"] == 1.0
        row[1] += 1
        by_task.setdefault(record["task_id"], []).append(record["reward"] == 1.0)
        categories_of[record["task_id"]] = record["category"]
    categories = {}
    for category, (ok, n, errors) in counts.items():
        if n or errors:
            low, high = wilson(ok, n)
            categories[category] = {"episodes": n, "successes": ok, "success_rate": ok / n if n else 0.0,
                                    "ci95": [low, high], "errors": errors}  # fmt: skip
    scored = {k: v for k, v in categories.items() if v["episodes"]}
    episodes = sum(c["episodes"] for c in scored.values())
    successes = sum(c["successes"] for c in scored.values())
    average, low, high = mean_interval([(c["successes"], c["episodes"]) for c in scored.values()])
    summary = {
        "episodes": episodes,
        "successes": successes,
        "errors": sum(c["errors"] for c in categories.values()),
        "categories": categories,
        "average": average,
        "average_ci95": [low, high],
        "overall": successes / episodes if episodes else 0.0,
    }
    samples = min((len(v) for v in by_task.values()), default=1)
    if samples > 1:
        summary["samples_per_task"] = samples
        summary["pass_at_k"] = {
            str(k): {
                category: _mean([pass_at_k(len(v), sum(v), k) for t, v in by_task.items() if categories_of[t] == category])
                for category in scored
            }
            for k in range(1, samples + 1)
        }
    return summary


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


HF_DTYPES = ("float32", "bfloat16", "float16")
"""the dtypes ``hf:`` policies can load their weights in (``--dtype``; ``auto``: the checkpoint's)"""


@dataclass(frozen=True)
class ModelSettings:
    """How model policies (``hf:``, ``vllm:``, ``openai:``) generate; greedy by default (strict protocol)."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 1024
    """longest model message, in tokens"""
    max_completion_tokens: int = 8192
    """all tokens after the opening prompt (token-level policies)"""
    max_thinking_tokens: int = 0
    """longest reasoning of one message (token-level policies; 0: no cap; see ``Budgets``)"""
    concurrency: int = 8
    """episodes played at once"""
    prefix_cache_tokens: int = DEFAULT_PREFIX_CACHE_TOKENS
    """hf: tokens of prompt KV states kept for reuse by later calls (shared-prefix cache; 0: off)"""
    rollout_scheduler: str = "auto"
    """``continuous`` (each episode asks as soon as it has stepped), ``lockstep`` (ticks) or ``auto``
    (continuous where the generator can; :mod:`seal_rl.rollout`)"""
    dtype: str = "auto"
    """hf: and vllm: the dtype the weights are loaded in: ``auto`` (the checkpoint's where the device
    computes it natively, float32 for a bfloat16 checkpoint on a CPU without AMX-BF16 or AVX512-BF16:
    :func:`seal_rl.precision.resolve_dtype`; recorded in ``config.json`` as ``precision`` and kept on
    resume), or one of :data:`HF_DTYPES`, which always wins"""
    seed: int = 0
    timeout: float = 120.0
    """openai: seconds per request before a retry"""
    max_retries: int = 4
    """openai: retries of a failed request before the episode is recorded as a generation error"""
    api_key_env: str = "OPENAI_API_KEY"
    requests_per_minute: float = 0.0
    retry_backoff: float = 1.0
    """openai: seconds before the first retry (doubling, with jitter)"""

    def __post_init__(self) -> None:
        if self.max_thinking_tokens < 0:
            raise SealError(f"--max-thinking-tokens must be >= 0 (0: no cap), got {self.max_thinking_tokens}.")
        if self.rollout_scheduler not in (*SCHEDULERS, "auto"):
            raise SealError(f"Unknown --rollout-scheduler {self.rollout_scheduler!r}; choose one of: {', '.join(SCHEDULERS)}, auto.")
        if self.dtype not in ("auto", *HF_DTYPES):
            raise SealError(f"Unknown --dtype {self.dtype!r}; choose one of: auto, {', '.join(HF_DTYPES)}.")


def _defaults(cls: type) -> dict[str, Any]:
    return {f.name: f.default if f.default is not MISSING else f.default_factory() for f in fields(cls)
            if f.default is not MISSING or f.default_factory is not MISSING}  # fmt: skip


_DEFAULTS = {"env": _defaults(EnvConfig), "model_settings": _defaults(ModelSettings)}
"""the settings a ``config.json`` records, by section, at their defaults (see :func:`config_differences`)"""


def make_generator(policy: Policy, settings: ModelSettings, env_config: EnvConfig, episodes: Sequence[Episode]):
    """The generator that plays ``policy``, its chat tokenizer (token-level policies) and budgets."""
    if isinstance(policy, SCRIPTED):
        return ScriptedGenerator({e.index: e.agent for e in episodes}), None, Budgets()
    budgets = Budgets(max_prompt_tokens=10**9, max_completion_tokens=settings.max_completion_tokens,
                      max_new_tokens=settings.max_new_tokens, max_thinking_tokens=settings.max_thinking_tokens)  # fmt: skip
    if isinstance(policy, ServerPolicy):
        server = ServerSettings(
            model=policy.model, base_url=policy.url, api_key_env=settings.api_key_env, timeout=settings.timeout,
            max_retries=settings.max_retries, backoff=settings.retry_backoff, concurrency=settings.concurrency,
            requests_per_minute=settings.requests_per_minute, temperature=settings.temperature, top_p=settings.top_p,
            max_tokens=settings.max_new_tokens, seed=settings.seed,
        )  # fmt: skip
        return OpenAIGenerator(server, env_config.call_format), None, budgets
    if isinstance(policy, VLLMPolicy):
        generator = VLLMEngineGenerator(str(policy.path), temperature=settings.temperature, top_p=settings.top_p,
                                        seed=settings.seed, **({} if settings.dtype == "auto" else {"dtype": settings.dtype}))  # fmt: skip
        chat = ChatTokens.for_episodes(generator.tokenizer, env_config.prompt_mode, env_config.call_format)
        return generator, chat.for_inference(), budgets
    if isinstance(policy, ModelPolicy):
        if settings.prefix_cache_tokens < 0:
            raise SealError(f"--prefix-cache-tokens must be >= 0 (0 turns the cache off); got {settings.prefix_cache_tokens}.")
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(policy.path)
        chat = ChatTokens.for_episodes(tokenizer, env_config.prompt_mode, env_config.call_format)  # refuses an unusable template before the weights load
        from seal_rl.precision import checkpoint_dtype, resolve_dtype

        dtype, _ = resolve_dtype(settings.dtype, checkpoint_dtype(policy.path))
        model = AutoModelForCausalLM.from_pretrained(policy.path, dtype=dtype)
        model.eval()
        generator = HFGenerator(model, tokenizer, temperature=settings.temperature, top_p=settings.top_p,
                                prefix_cache_tokens=settings.prefix_cache_tokens)  # fmt: skip
        return generator, chat.for_inference(), budgets
    raise SealError(f"Policy {policy.name!r} cannot be evaluated.")


@dataclass(frozen=True)
class Precision:
    """The dtype a model policy's weights load in (:func:`run_precision`)."""

    dtype: str
    why: str
    """the line the run prints about it"""
    record: dict[str, str] | None
    """``config.json``'s ``precision``: None for a resumed run that began before seal-rl recorded it"""


def run_precision(policy: Policy | str, settings: ModelSettings, out: Path, overwrite: bool, *,
                  key: str = "precision") -> Precision | None:  # fmt: skip
    """The dtype a model policy's weights load in, or None for policies without local weights.
    ``--dtype auto`` follows :func:`seal_rl.precision.resolve_dtype`, except on resume, which keeps the
    dtype the run started with (a run that recorded none loaded the checkpoint's dtype). ``key``:
    where ``config.json`` records it (a τ² run's user simulator: ``user_precision``)."""
    if not isinstance(policy, (ModelPolicy, VLLMPolicy)):
        return None
    from seal_rl.precision import checkpoint_dtype, resolve_dtype

    checkpoint = checkpoint_dtype(policy.path)
    if settings.dtype == "auto" and not overwrite and (Path(out) / RESULTS_FILE).exists():
        try:
            previous = json.loads((Path(out) / CONFIG_FILE).read_text())
        except (OSError, ValueError):
            previous = None
        if isinstance(previous, dict) and isinstance(previous.get("model_settings"), dict):
            recorded = previous.get(key)
            if isinstance(recorded, dict) and recorded.get("dtype") in HF_DTYPES:
                return Precision(recorded["dtype"], f"--dtype auto: {recorded['dtype']}, as this run started", recorded)
            return Precision(checkpoint, f"--dtype auto: {checkpoint}, the checkpoint's, as this run started", None)
    dtype, why = resolve_dtype(settings.dtype, checkpoint)
    return Precision(dtype, why, {"dtype": dtype, "why": why})


def _read_complete_lines(path: Path) -> list[dict[str, Any]]:
    """Episode records of a results file. A last line cut short by a crash or Ctrl-C is cut off;
    a corrupt line elsewhere is reported and dropped from the file (its episode is played again),
    and the lines after it are kept."""
    lines = jsonl.read(path)
    for problem in lines.problems:
        warnings.warn(problem + " (that episode is played again)", SealWarning, stacklevel=3)
    if len(lines.problems) > bool(lines.torn):
        jsonl.rewrite(path, lines.values)
    else:
        jsonl.truncate_torn(path, lines)
    return lines.values


@dataclass(frozen=True)
class ConfigDifference:
    path: str
    """dotted key in ``config.json``"""
    text: str
    added_default: bool
    """a setting the earlier run's config does not record, now at its default: added to seal-rl after
    that run was written, whose episodes were therefore played as the default plays them"""


_NO_DEFAULT = object()


def config_differences(old: dict[str, Any], new: dict[str, Any], path: str = "") -> list[ConfigDifference]:
    """What differs between an earlier run's ``config.json`` and this run's, key by key."""
    found = []
    for key in sorted(set(old) | set(new), key=str):
        where = f"{path}.{key}" if path else str(key)
        if key not in old:
            default = _DEFAULTS.get(path, {}).get(key, _NO_DEFAULT)
            found.append(ConfigDifference(where, f"{where} not recorded then, {new[key]!r} now", new[key] == default))
        elif key not in new:
            found.append(ConfigDifference(where, f"{where} was {old[key]!r}, no longer a setting", False))
        elif isinstance(old[key], dict) and isinstance(new[key], dict):
            found += config_differences(old[key], new[key], where)
        elif old[key] != new[key]:
            shown = (f"{len(old[key])} then, {len(new[key])} now, not the same" if isinstance(old[key], list)
                     and isinstance(new[key], list) and len(str(new[key])) > 120 else f"{old[key]!r} then, {new[key]!r} now")  # fmt: skip
            found.append(ConfigDifference(where, f"{where}: {shown}", False))
    return found


def _resumable(out: Path, config: dict[str, Any], overwrite: bool) -> list[dict[str, Any]]:
    """Records already in ``out`` from the same run (resume), or [] after preparing a fresh run."""
    if out.exists() and not out.is_dir():
        raise SealError(f"--out {out} is a file; give a directory for the run.")
    results = out / RESULTS_FILE
    if results.exists() and not overwrite:
        try:
            previous = json.loads((out / CONFIG_FILE).read_text())
        except (OSError, ValueError):
            previous = None
        if previous != config:
            differences = config_differences(previous or {}, config)
            added = [d for d in differences if d.added_default]
            if previous is None or len(added) < len(differences):
                what = "no readable config.json" if previous is None else "; ".join(d.text for d in differences[:6])
                more = f" (and {len(differences) - 6} more)" if len(differences) > 6 else ""
                raise SealError(f"{out} already holds a different run ({what}{more}), so it cannot be resumed; "
                                "choose another --out or pass --overwrite.")  # fmt: skip
            warnings.warn(f"{out} was written before {', '.join(d.path for d in added)} existed; resuming it with "
                          "the default, which is how its episodes were played.", SealWarning, stacklevel=3)  # fmt: skip
            (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        return _read_complete_lines(results)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name in (RESULTS_FILE, SUMMARY_FILE):
            if (out / name).exists():
                (out / name).unlink()
    except OSError as exc:
        raise SealError(f"Cannot write the run directory {out}: {exc.strerror}.") from None
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return []


class RunDirectory:
    """An evaluation run's directory while it is played: ``config.json``, ``results.jsonl`` (one line per
    episode or conversation, keyed by its ``index``) and ``summary.json``. Every runner writes through
    it (BFCL and the environment families: :func:`evaluate`; τ²-bench: :mod:`seal_rl.ood.tau2_run`;
    BFCL V4 memory: :mod:`seal_rl.ood.bfcl_memory`), so every run resumes alike: the same command into
    the same directory keeps what was recorded, plays again what ended in a generation error, and
    refuses another run's directory (:func:`run_directory` holds the run lock)."""

    def __init__(self, out: Path, overwrite: bool) -> None:
        self.out, self.overwrite = Path(out), overwrite
        self.records: dict[int, dict[str, Any]] = {}
        self._results: Any = None

    def resume(self, config: dict[str, Any], on_resume: Callable[[list[dict[str, Any]]], None] | None = None) -> list[dict[str, Any]]:
        """Start the run with ``config`` (``config.json``) or resume it: the records kept, generation errors
        left out (their episodes are played again); ``on_resume`` receives them."""
        kept = _resumable(self.out, config, self.overwrite)
        done = [r for r in kept if not r.get("error")]
        if len(done) < len(kept):
            jsonl.rewrite(self.out / RESULTS_FILE, done)
        self.records = {r["index"]: r for r in done}
        if done and on_resume is not None:
            on_resume(done)
        return done

    def add(self, record: dict[str, Any]) -> None:
        """Record one finished episode (one whole line, flushed: a crash loses at most that line). The
        results file is opened at the first one: a run refused before any episode leaves none."""
        if self._results is None:
            self._results = open(self.out / RESULTS_FILE, "a", encoding="utf-8")
        jsonl.append(self._results, record)
        self.records[record["index"]] = record

    def ordered(self) -> list[dict[str, Any]]:
        return [self.records[i] for i in sorted(self.records)]

    def finish(self, summary: dict[str, Any]) -> dict[str, Any]:
        """``results.jsonl`` in index order (retried episodes back in place) and ``summary.json``."""
        self.close()
        jsonl.rewrite(self.out / RESULTS_FILE, self.ordered())
        (self.out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
        return summary

    def close(self) -> None:
        if self._results is not None:
            self._results.close()
            self._results = None


@contextmanager
def run_directory(out: Path, overwrite: bool) -> Iterator[RunDirectory]:
    """A :class:`RunDirectory` under the run lock (one writer per run directory)."""
    with run_lock(Path(out)):
        run = RunDirectory(out, overwrite)
        try:
            yield run
        finally:
            run.close()


def evaluate(
    episodes: Sequence[Episode],
    env_config: EnvConfig,
    out: Path,
    *,
    policy: Policy | str,
    settings: ModelSettings = ModelSettings(),
    generator: Generator | None = None,
    chat: ChatTokens | None = None,
    overwrite: bool = False,
    on_episode: Callable[[dict[str, Any]], None] | None = None,
    on_resume: Callable[[list[dict[str, Any]]], None] | None = None,
    split: str | None = None,
    family: Any = None,
) -> dict[str, Any]:
    """Play ``episodes`` and write ``results.jsonl`` in input order as they finish; return the summary.
    ``family``: the environment family whose episodes are played (default BFCL; docs/guides/your-environment.md).

    Re-running the same evaluation into the same ``out`` resumes it: episodes already recorded are
    kept and only the others are played, including those that ended in a generation error
    (``on_resume`` receives the records kept). ``policy`` is a :class:`Policy` or its spec
    (``"oracle:faults=0.3"``); ``generator`` overrides the policy's own (benchmarks, tests).
    ``split`` names the task selection in ``summary.json`` (None: tasks named one by one or by the
    policy); the summary also states the protocol and the number of tasks.
    """
    if isinstance(policy, str) and generator is None:
        policy = parse_policy(policy)
    name = policy if isinstance(policy, str) else policy.name
    config = {
        "policy": name,
        "env": asdict(env_config),
        "episodes": [[e.task.id, e.extra.get("sample", 0)] for e in episodes],
        "model_settings": None if isinstance(policy, (str, *SCRIPTED)) else asdict(settings),
        "split": split,
        "versions": {"seal_rl": __version__, "bfcl_eval": BFCL_VERSION, "python": platform.python_version()},
    }
    if family is not None and getattr(family, "name", "bfcl") != "bfcl":  # BFCL runs keep their config as it was (resume)
        config["family"] = family.name
    with run_directory(Path(out), overwrite) as run:
        precision = None if generator is not None else run_precision(policy, settings, Path(out), overwrite)
        if precision is not None:
            if precision.record is not None:
                config["precision"] = precision.record
            settings = replace(settings, dtype=precision.dtype)
        done = run.resume(config, on_resume)
        owned = generator is None  # a generator made here is closed here (connections, threads)
        if generator is None:
            generator, chat, budgets = make_generator(policy, settings, env_config, episodes)
            if precision is not None:  # said once the weights have loaded (a load that fails says only why)
                print(precision.why, file=sys.stderr)
            resolve_scheduler(generator, settings.rollout_scheduler)  # refuse an impossible choice before any episode
        else:
            budgets = Budgets(max_prompt_tokens=10**9, max_completion_tokens=settings.max_completion_tokens,
                              max_new_tokens=settings.max_new_tokens, max_thinking_tokens=settings.max_thinking_tokens)  # fmt: skip
        finished = {r["index"] for r in done}
        todo = [e for e in episodes if e.index not in finished]
        waiting: dict[int, dict[str, Any]] = {}
        order = iter(e.index for e in todo)
        next_index = next(order, None)

        def done_callback(rollout) -> None:  # write finished episodes in input order
            nonlocal next_index
            add_diagnosis(rollout.record)
            waiting[rollout.index] = rollout.record
            while next_index in waiting:
                record = waiting.pop(next_index)
                run.add(record)
                if on_episode is not None:
                    on_episode(record)
                next_index = next(order, None)

        catalog = ToolCatalog()
        make = family.make_env if family is not None else BfclEnv
        try:
            run_episodes(
                [(e.index, e.task, e.extra) for e in todo], generator, lambda: make(env_config, catalog=catalog),
                chat=chat, budgets=budgets, concurrency=settings.concurrency, seed=settings.seed, on_done=done_callback,
                scheduler=settings.rollout_scheduler,
            )  # fmt: skip
        finally:
            if owned and hasattr(generator, "close"):
                generator.close()
        return run.finish({
            "policy": name,
            "protocol": env_config.protocol,
            "split": split,
            "tasks": len({e.task.id for e in episodes}),
            **({"family": config["family"]} if "family" in config else {}),
            **summarize(run.ordered()),
        })  # fmt: skip


def read_results(run_dir: Path) -> list[dict[str, Any]]:
    """The episode records of a run directory's ``results.jsonl``, with clear errors."""
    path = Path(run_dir) / RESULTS_FILE
    if not path.exists():
        hint = " (it is a file; give the run directory)" if Path(run_dir).is_file() else ""
        raise SealError(f"No {RESULTS_FILE} in {run_dir}{hint}; run `seal eval --out {run_dir}` first.")
    lines = jsonl.read(path)
    for problem in lines.problems:
        warnings.warn(problem, SealWarning, stacklevel=2)
    for number, record in zip(lines.numbers, lines.values):
        if not isinstance(record, dict) or "verdict" not in record or "trace" not in record:
            raise SealError(f"{path}:{number}: not an episode record (no verdict/trace).")
        known = isinstance(record.get("category"), str) if record.get("family") else record.get("category") in CATEGORIES
        if not known:  # another family's records name their own categories
            raise SealError(f"{path}:{number}: category {str(record.get('category'))[:40]!r} is not one of {', '.join(CATEGORIES)}.")
    records = lines.values
    return records

