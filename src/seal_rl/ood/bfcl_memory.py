"""BFCL V4 memory (``seal eval --benchmark bfcl-memory``), played and scored by bfcl-eval's own code.

BFCL's memory categories ask whether an agent keeps what a user told it in earlier conversations.
Each of five scenarios (customer, student, finance, healthcare, notetaker) has prerequisite
conversations, 37 in all, in which the user says things; they are played first and in order, each
starting from the memory the one before it left. Then come 155 questions, each a single-turn,
multi-step episode that starts from the memory the scenario's last prerequisite left. The memory is
one of bfcl-eval's backends, reached only through its tools: ``kv`` (``MemoryAPI_kv``: a core and an
archival key-value store with BM25 search) or ``rec_sum`` (``MemoryAPI_rec_sum``: one text the agent
keeps summarising). ``vector`` needs a sentence-transformers encoder from a model hub at import, so
it is refused with what it needs (:data:`UNAVAILABLE`).

From bfcl-eval, unchanged: the entries (``load_dataset_entry("memory_BACKEND")``, with the
dependency order of their prerequisites and the agentic answer-format system prompt), the ground
truth (``load_ground_truth_entry``), the memory instruction with the scenario setting and the
memory's current content (``add_memory_instruction_system_prompt``), the backends and their snapshot
files (``_load_scenario`` / ``_flush_memory_to_local_file``, in bfcl's own result-directory layout
under the run directory) and the checker (``agentic_checker``, on the last message that is not a
call, as ``_evaluate_single_agentic_entry`` picks it).

seal-rl supplies the loop: the ``bfcl`` protocol of :class:`~seal_rl.env.BfclEnv` (the official
``bfcl generate`` loop, 20 executing steps per turn), whose system prompt takes the question's
system message first, as Qwen's chat template and BFCL's ``QwenFCHandler`` put it. Model output
stays hostile input there as everywhere (:mod:`seal_rl.backends`: calls by name, never ``eval``).
"""

from __future__ import annotations

import copy
import json
import shutil
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from seal_rl import __version__
from seal_rl.bfcl import BFCL_VERSION, import_bfcl
from seal_rl.bfcl_results import result_line, write_result_files
from seal_rl.env import BfclEnv, EnvConfig
from seal_rl.errors import SealError
from seal_rl.evaluate import ModelSettings, make_generator, run_directory, run_precision
from seal_rl.generators import ScriptedGenerator
from seal_rl.interface import Message
from seal_rl.policies import Episode, ScriptedAgent, parse_policy
from seal_rl.reasoning import answer
from seal_rl.rollout import Budgets, Generator, run_episodes
from seal_rl.stats import wilson
from seal_rl.tasks import Task
from seal_rl.tools import ToolCatalog

BACKENDS: tuple[str, ...] = ("kv", "rec_sum")
"""the memory backends that run here, in BFCL's order"""
UNAVAILABLE = {
    "vector": "memory_vector loads the sentence-transformers encoder all-MiniLM-L6-v2 from the Hugging Face hub "
    "when bfcl-eval imports it, and no package on the index ships that encoder to hash-check; it is not played here."
}
NO_ANSWER = "agentic:no_last_message"
"""the official error type of an episode whose every message was a call (or that ended before answering)"""


@dataclass(frozen=True)
class MemoryTask(Task):
    """One BFCL memory entry: a prerequisite conversation (``prereq``, unscored) or a question.

    ``depends_on``: the prerequisites that must have been played before it (bfcl's own field).
    ``answers``: the ground truth; any one of them, as a word match, passes (``agentic_checker``).
    ``result_dir``: bfcl's ``model_result_dir`` (the run directory), where the memory snapshots live.
    """

    scenario: str = ""
    prereq: bool = False
    depends_on: tuple[str, ...] = ()
    answers: tuple[str, ...] = ()
    result_dir: str = ""

    def initial_config(self) -> dict[str, Any]:
        config = super().initial_config()
        for settings in config.values():  # the backend joins paths onto it
            settings["model_result_dir"] = Path(settings["model_result_dir"])
        return config


def backend_category(backend: str) -> str:
    """``kv`` -> ``memory_kv`` (bfcl's test category), with one line for a backend that cannot run."""
    if backend in UNAVAILABLE:
        raise SealError(UNAVAILABLE[backend])
    if backend not in BACKENDS:
        raise SealError(f"Unknown memory backend {backend!r}; choose from {', '.join(BACKENDS)}.")
    return f"memory_{backend}"


def load_tasks(backend: str, result_dir: Path) -> list[MemoryTask]:
    """The backend's entries in bfcl's inference order (prerequisites first, each scenario's in its
    dependency order, then the questions), with their ground truth."""
    category = backend_category(backend)
    utils = import_bfcl("utils")
    entries = utils.load_dataset_entry(category)
    truth = {e["id"].replace("memory", category, 1): e["ground_truth"] for e in utils.load_ground_truth_entry(category)}
    entries = utils.populate_initial_settings_for_memory_test_cases(entries, Path(result_dir))
    tasks = []
    for entry in sorted(entries, key=utils.sort_key):
        config = {cls: {**settings, "model_result_dir": str(settings["model_result_dir"])}
                  for cls, settings in entry["initial_config"].items()}  # fmt: skip
        prereq = utils.is_memory_prereq(entry["id"])
        if not prereq and entry["id"] not in truth:
            raise SealError(f"bfcl-eval's memory data has no ground truth for {entry['id']}; reinstall bfcl-eval.")
        tasks.append(MemoryTask(
            id=entry["id"], category=category,
            questions=tuple(tuple(turn) for turn in entry["question"]),
            functions=tuple(entry["function"]), held_out={}, ground_truth=tuple(() for _ in entry["question"]),
            involved_classes=tuple(entry["involved_classes"]), initial_config_json=json.dumps(config),
            scenario=entry["scenario"], prereq=prereq, depends_on=tuple(entry.get("depends_on", ())),
            answers=tuple(truth.get(entry["id"], ())), result_dir=str(result_dir),
        ))  # fmt: skip
    return tasks


SCENARIOS: tuple[str, ...] = ("customer", "finance", "healthcare", "notetaker", "student")
"""bfcl's memory scenarios (``MEMORY_SCENARIO_NAME``), alphabetical"""


def select(tasks: Sequence[MemoryTask], scenarios: Sequence[str] | None = None,
           ids: Sequence[str] | None = None) -> list[MemoryTask]:  # fmt: skip
    """The questions of ``scenarios`` (None: all), or the questions ``ids`` names (with or without
    the backend in the id: ``memory_kv_0-customer-0`` or ``memory_0-customer-0``), each with every
    prerequisite of its scenario; one line naming the choices for an unknown name."""
    unknown = sorted(set(scenarios or ()) - set(SCENARIOS))
    if unknown:
        raise SealError(f"Unknown memory scenario {unknown[0]!r}; choose from {', '.join(SCENARIOS)} (or all).")
    chosen = [t for t in tasks if not t.prereq and (scenarios is None or t.scenario in scenarios)]
    if ids is not None:
        wanted = set(ids)
        chosen = [t for t in chosen if t.id in wanted or t.id.replace(t.category, "memory", 1) in wanted]
        found = {t.id for t in chosen} | {t.id.replace(t.category, "memory", 1) for t in chosen}
        missing = sorted(wanted - found)
        if missing:
            raise SealError(f"No memory question {missing[0]!r} in bfcl-eval's data; ids look like memory_0-customer-0.")
    needed = {t.scenario for t in chosen}
    keep = {t.id for t in chosen}
    return [t for t in tasks if t.id in keep or t.prereq and t.scenario in needed]


def prerequisite_rounds(tasks: Sequence[MemoryTask]) -> list[list[MemoryTask]]:
    """The prerequisites in rounds that may run at once: round k holds every scenario's k-th
    conversation, so a conversation starts only once all it depends on have ended."""
    rounds: list[list[MemoryTask]] = []
    for task in tasks:
        if task.prereq:
            depth = len(task.depends_on)
            while len(rounds) <= depth:
                rounds.append([])
            rounds[depth].append(task)
    return rounds


@dataclass(frozen=True)
class MemoryVerdict:
    """The official checker's result for one question; a prerequisite is not scored (``scored`` False)."""

    reward: float
    scored: bool = True
    answer: str | None = None
    error_type: str | None = None
    """``agentic:answer_not_found`` or ``agentic:no_last_message`` (bfcl's own), None when it passed"""
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def progress(self) -> float:
        return self.reward

    def to_json(self) -> dict[str, Any]:
        return {"reward": self.reward, "scored": self.scored, "answer": self.answer,
                "error_type": self.error_type, "details": self.details}  # fmt: skip


def final_answer(messages: Sequence[Message], trace: Sequence[Any]) -> str | None:
    """The last assistant message that made no call, reasoning removed: what
    ``_evaluate_single_agentic_entry`` checks (the last step response that does not decode to calls).
    None when every message made a call."""
    called = {entry.step for entry in trace if entry.name is not None}
    said = [m for m in messages if m["role"] == "assistant"]
    for step in range(len(said) - 1, -1, -1):
        if step not in called:
            return answer(said[step].get("content") or "")
    return None


def score(task: MemoryTask, messages: Sequence[Message], trace: Sequence[Any]) -> MemoryVerdict:
    """bfcl's ``agentic_checker`` on the episode's final answer (a normalised word match of any
    ground-truth answer)."""
    text = final_answer(messages, trace)
    if text is None:
        return MemoryVerdict(0.0, error_type=NO_ANSWER)
    checker = import_bfcl("eval_checker.agentic_eval.agentic_checker").agentic_checker
    result = checker(text, list(task.answers))
    if result["valid"]:
        return MemoryVerdict(1.0, answer=text)
    return MemoryVerdict(0.0, answer=text, error_type=result["error_type"], details=result["details"])


class MemoryEnv(BfclEnv):
    """A BFCL memory entry as an episode of the ``bfcl`` protocol.

    Opening: bfcl's memory instruction (scenario setting and the memory's content as this episode's
    backend loaded it) joined with the entry's own system message, then the question; the interface's
    system prompt (tools block, notes) follows that text, as Qwen's template puts a system message
    before its ``# Tools``. End: a prerequisite flushes its memory to bfcl's snapshot files (unless it
    ended in a generation error, which is played again) and is not scored; a question is scored by
    :func:`score`."""

    def reset(self, task: Task, *, seed: int | None = None) -> tuple[list[Message], dict[str, Any]]:
        if not isinstance(task, MemoryTask):
            raise TypeError("MemoryEnv plays MemoryTask entries (seal_rl.ood.bfcl_memory.load_tasks).")
        _, info = super().reset(task, seed=seed)
        memory = self._backends.instances[task.involved_classes[0]]
        add_instruction = import_bfcl("model_handler.utils").add_memory_instruction_system_prompt
        first = add_instruction([copy.deepcopy(list(task.questions[0]))], task.category, task.scenario, memory)[0]
        opening = self.interface.system(task.functions)
        system = first[0]["content"] + ("\n\n" + opening[0]["content"] if opening and opening[0]["content"] else "")
        observation = [{"role": "system", "content": system}, *first[1:]]
        self.messages[:] = observation
        return observation, info

    def _finish(self, reason: str) -> None:
        self.end_reason = reason
        task: MemoryTask = self.task
        if task.prereq:
            if reason != "generation_error":
                self._backends.instances[task.involved_classes[0]]._flush_memory_to_local_file()
            self.verdict = MemoryVerdict(0.0, scored=False)
        else:
            try:
                self.verdict = score(task, self.messages, self.trace)
            except Exception as exc:  # a checker failure must not crash the driver
                self.verdict = MemoryVerdict(0.0, error_type="checker_error", details={"error": f"{type(exc).__name__}: {exc}"})
        self._backends = None


def oracle_messages(task: MemoryTask) -> list[str]:
    """The harness check's agent: a plain reply to every prerequisite turn, and for a question the
    first ground-truth answer in the answer format bfcl's agentic prompt asks for. It uses no memory
    tool, so it checks the loop, the answer extraction and the checker, not memory."""
    if task.prereq:
        return ["Noted."] * task.num_turns
    return [json.dumps({"answer": task.answers[0], "context": "the ground truth"})]


def wrong_messages(task: MemoryTask) -> list[str]:
    """The negative control: the oracle's format with an answer no ground truth contains."""
    if task.prereq:
        return ["Noted."] * task.num_turns
    return [json.dumps({"answer": "I do not know", "context": "I do not know"})]


def summarize(records: Sequence[dict[str, Any]], backends: Sequence[str]) -> dict[str, Any]:
    """Accuracy per backend and per scenario with Wilson 95% intervals, BFCL's memory accuracy (the
    mean over backends), the failure types and the prerequisites played."""
    questions = [r for r in records if not r.get("prereq") and not r.get("error")]
    per_backend = {}
    for backend in backends:
        mine = [r for r in questions if r["category"] == f"memory_{backend}"]
        passed = sum(r["reward"] == 1.0 for r in mine)
        scenarios = {}
        for scenario in sorted({r["scenario"] for r in mine}):
            rows = [r for r in mine if r["scenario"] == scenario]
            scenarios[scenario] = {"questions": len(rows), "passed": sum(r["reward"] == 1.0 for r in rows)}
        per_backend[backend] = {"questions": len(mine), "passed": passed,
                                "accuracy": passed / len(mine) if mine else 0.0,
                                "interval": list(wilson(passed, len(mine))), "scenarios": scenarios}  # fmt: skip
    played = [b for b in per_backend.values() if b["questions"]]
    return {
        "backends": per_backend,
        "accuracy": sum(b["accuracy"] for b in played) / len(played) if played else 0.0,
        "questions": len(questions),
        "prerequisites": sum(bool(r.get("prereq")) and not r.get("error") for r in records),
        "failures": dict(Counter(r["verdict"]["error_type"] for r in questions if r["verdict"]["error_type"])),
        "endings": dict(Counter(r["end_reason"] for r in questions)),
        "generation_errors": sum(bool(r.get("error")) for r in records),
    }


def snapshot_dirs(out: Path, backends: Sequence[str]) -> list[Path]:
    """Where bfcl's backends keep a run's memory snapshots (``memory_snapshot`` under its layout)."""
    layout = import_bfcl("utils").get_directory_structure_by_category
    return [Path(out) / layout(backend_category(b)) / "memory_snapshot" for b in backends]


def evaluate_memory(
    backends: Sequence[str],
    out: Path,
    *,
    policy: str,
    env_config: EnvConfig,
    settings: ModelSettings,
    generator: Generator | None = None,
    messages: Callable[[MemoryTask], list[str]] = oracle_messages,
    scenarios: Sequence[str] | None = None,
    ids: Sequence[str] | None = None,
    overwrite: bool = False,
    on_episode: Callable[[dict[str, Any]], None] | None = None,
    on_resume: Callable[[list[dict[str, Any]]], None] | None = None,
    on_entries: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Play every entry of ``backends`` into ``out`` and return the summary.

    ``results.jsonl``: one line per entry (prerequisites included, ``prereq`` true, unscored), in
    bfcl's order; ``summary.json`` (:func:`summarize`); ``config.json``; bfcl's memory snapshots under
    ``agentic/memory/BACKEND/memory_snapshot``. Re-running resumes: entries recorded are kept, those
    that ended in a generation error are played again, and the snapshots the prerequisites left
    are read back as the backends read them. ``policy``: ``oracle`` (scripted by ``messages``) or a
    model policy (:func:`seal_rl.policies.parse_policy`); ``generator`` overrides its own (tests).
    ``scenarios`` / ``ids``: a selection (:func:`select`)."""
    out = Path(out)
    scripted = policy == "oracle"
    chosen = None if scripted else parse_policy(policy)
    # resolved: the backends join their snapshot paths onto it, whatever the working directory
    tasks = [t for backend in backends for t in select(load_tasks(backend, out.resolve()), scenarios, ids)]
    indices = {t.id: i for i, t in enumerate(tasks, start=1)}
    if on_entries is not None:
        on_entries(len(tasks))
    config = {"benchmark": "bfcl-memory", "backends": list(backends), "policy": policy, "env": asdict(env_config),
              "entries": [t.id for t in tasks], "model_settings": None if scripted else asdict(settings),
              "versions": {"seal_rl": __version__, "bfcl_eval": BFCL_VERSION}}  # fmt: skip
    with run_directory(out, overwrite) as run:
        precision = None if scripted or generator is not None else run_precision(chosen, settings, out, overwrite)
        if precision is not None:
            if precision.record is not None:
                config["precision"] = precision.record
            settings = replace(settings, dtype=precision.dtype)
        done = run.resume(config, on_resume)
        if not done:  # a fresh run: no memory left by another
            for folder in snapshot_dirs(out, backends):
                shutil.rmtree(folder, ignore_errors=True)
        chat, budgets, owned = None, Budgets(), generator is None
        if generator is None and scripted:
            generator = ScriptedGenerator({indices[t.id]: ScriptedAgent(messages(t)) for t in tasks})
        elif generator is None:
            episodes = [Episode(indices[t.id], t, None) for t in tasks]
            generator, chat, budgets = make_generator(chosen, settings, env_config, episodes)
            if precision is not None:
                print(precision.why, file=sys.stderr)  # once the weights have loaded, as seal eval says it
        try:

            def finished(record: dict[str, Any]) -> None:
                run.add(record)
                if on_episode is not None:
                    on_episode(record)

            play_memory(tasks, generator, env_config, chat=chat, budgets=budgets,
                        concurrency=settings.concurrency, seed=settings.seed,
                        indices=indices, done={r["task_id"] for r in done}, on_done=finished)  # fmt: skip
        finally:
            if owned and hasattr(generator, "close"):
                generator.close()
        ordered = run.ordered()
        return run.finish({"benchmark": "bfcl-memory", "policy": policy, "protocol": env_config.protocol,
                           **summarize(ordered, backends)})  # fmt: skip


def play_memory(tasks: Sequence[MemoryTask], generator: Generator, env_config: EnvConfig, *, chat: Any = None, budgets: Budgets | None = None,
                concurrency: int = 8, seed: int = 0, indices: dict[str, int], done: set[str],
                on_done: Callable[[dict[str, Any]], None]) -> None:  # fmt: skip
    """Play ``tasks`` (minus ``done``) in bfcl's order: prerequisite rounds one after the other, then
    every question at once (up to ``concurrency``). ``on_done`` gets each finished record."""
    catalog = ToolCatalog()
    batches = [*prerequisite_rounds(tasks), [t for t in tasks if not t.prereq]]
    for batch in batches:
        todo = [(indices[t.id], t, {"scenario": t.scenario, "prereq": t.prereq}) for t in batch if t.id not in done]
        if not todo:
            continue
        failed: list[str] = []

        def finished(rollout) -> None:
            if rollout.record.get("error"):
                failed.append(rollout.record["task_id"])
            on_done(rollout.record)

        run_episodes(todo, generator, lambda: MemoryEnv(env_config, catalog=catalog), chat=chat,
                     budgets=budgets if budgets is not None else Budgets(), concurrency=concurrency, seed=seed,
                     on_done=finished)  # fmt: skip
        if failed and batch[0].prereq:
            raise SealError(f"prerequisite conversation {failed[0]} ended in a generation error, so the memory the "
                            "later entries start from is missing; re-run the same command to resume from it.")  # fmt: skip


def export_memory(records: Sequence[dict[str, Any]], out: Path, model_name: str) -> list[Path]:
    """Write a memory run's questions as bfcl result files (``out/<model>/agentic/memory/BACKEND/
    BFCL_v4_memory_BACKEND_result.json``, bfcl's own layout and names) in the prompting shape, so that
    ``bfcl evaluate --test-category memory_BACKEND`` scores them; prerequisites are not scored and not
    written. A question that ended in a generation error becomes bfcl's inference-error string."""
    utils = import_bfcl("utils")
    by_category: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        if not record.get("prereq"):
            by_category.setdefault(record["category"], []).append(result_line(record))
    if not by_category:
        raise SealError("Nothing to export: the run has no memory questions.")
    folder = Path(out) / model_name.replace("/", "_")
    return write_result_files({
        folder / utils.get_directory_structure_by_category(category) / utils.get_file_name_by_category(category, is_result_file=True):
            sorted(lines, key=utils.sort_key)
        for category, lines in by_category.items()
    })  # fmt: skip
