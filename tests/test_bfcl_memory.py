"""BFCL V4 memory through bfcl-eval's own backends and checker (seal_rl.ood.bfcl_memory; issue 58).

The oracle (the ground-truth answer) is the harness check: 100% of both backends' 155 questions,
and a wrong answer in the same format 0%. A scripted agent that stores a fact with the memory tools
in one prerequisite conversation and reads it back in a question checks what the oracle cannot: the
memory reaches later conversations through bfcl's snapshot files and its memory instruction. The
export is scored by bfcl's own ``_evaluate_single_agentic_entry``; the opening prompt is compared with
what bfcl's ``QwenFCHandler`` writes for the same entry.
"""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from seal_rl import jsonl
from seal_rl.bfcl import import_bfcl
from seal_rl.env import EnvConfig
from seal_rl.errors import SealError
from seal_rl.evaluate import ModelSettings
from seal_rl.generators import ScriptedGenerator
from seal_rl.ood.bfcl_memory import (
    BACKENDS, MemoryEnv, evaluate_memory, export_memory, load_tasks, oracle_messages, prerequisite_rounds, select,
    wrong_messages,
)  # fmt: skip
from seal_rl.parity import official_decoder
from seal_rl.policies import ScriptedAgent
from tests.test_cli import run_cli

ENV = EnvConfig(protocol="bfcl")


def _run(out, messages=oracle_messages, **kwargs):
    return evaluate_memory(list(kwargs.pop("backends", BACKENDS)), out, policy="oracle", env_config=ENV,
                           settings=ModelSettings(concurrency=4), messages=messages, **kwargs)  # fmt: skip


def _records(out: Path) -> list[dict]:
    return jsonl.read(out / "results.jsonl").values


def test_bfcls_entries_come_in_its_order_with_every_prerequisite_before_what_depends_on_it(tmp_path):
    tasks = load_tasks("kv", tmp_path)
    questions = [t for t in tasks if not t.prereq]
    assert (len(tasks) - len(questions), len(questions)) == (37, 155)  # bfcl-eval 2026.3.23's memory data
    assert all(t.answers for t in questions) and not any(t.answers for t in tasks if t.prereq)
    seen: set[str] = set()
    for round_ in prerequisite_rounds(tasks):
        assert len({t.scenario for t in round_}) == len(round_)  # one conversation per scenario at a time
        assert all(set(t.depends_on) <= seen for t in round_)
        seen |= {t.id for t in round_}
    assert all(set(t.depends_on) == {p.id for p in tasks if p.prereq and p.scenario == t.scenario} for t in questions)
    # the agentic answer format is bfcl's own system message on every question, not on the prerequisites
    agentic = import_bfcl("constants.default_prompts").ADDITIONAL_SYSTEM_PROMPT_FOR_AGENTIC_RESPONSE_FORMAT
    assert all(t.questions[0][0] == {"role": "system", "content": agentic} for t in questions)
    assert not any(m["role"] == "system" for t in tasks if t.prereq for turn in t.questions for m in turn)


def test_the_oracle_scores_every_question_and_a_wrong_answer_none(tmp_path):
    summary = _run(tmp_path / "oracle")
    assert summary["prerequisites"] == 74 and summary["questions"] == 310
    assert {b: (row["questions"], row["passed"]) for b, row in summary["backends"].items()} == {"kv": (155, 155), "rec_sum": (155, 155)}
    assert summary["accuracy"] == 1.0 and summary["failures"] == {}
    records = _records(tmp_path / "oracle")
    assert [r["index"] for r in records] == list(range(1, 385))
    # every prerequisite left its memory where bfcl's backends read it back
    for backend in BACKENDS:
        folder = tmp_path / "oracle" / "agentic" / "memory" / backend / "memory_snapshot"
        assert sorted(p.name for p in folder.glob("*_final.json")) == [f"{s}_final.json" for s in
                                                                       ("customer", "finance", "healthcare", "notetaker", "student")]  # fmt: skip
    control = _run(tmp_path / "control", messages=wrong_messages)
    assert control["questions"] == 310 and control["accuracy"] == 0.0
    assert control["failures"] == {"agentic:answer_not_found": 310}


class Remembering:
    """Stores the customer's first name with the memory tools in the first prerequisite conversation
    (core memory) and their city in the second (archival memory), unless ``writes`` is off; answers
    the first and third questions from what the tools return, and the rest with "I do not know"."""

    def __init__(self, task, writes=True):
        self.task, self.writes, self.said, self.opening = task, writes, 0, ""

    def act(self, observation, info):
        self.said += 1
        task = self.task
        if task.prereq:
            if self.writes and self.said == 1 and task.id.endswith("customer-0"):
                return '<tool_call>\n{"name": "core_memory_add", "arguments": {"key": "first_name", "value": "Michael"}}\n</tool_call>'
            if self.writes and self.said == 1 and task.id.endswith("customer-1"):
                return ('<tool_call>\n{"name": "archival_memory_add", "arguments": {"key": "home_city", '
                        '"value": "The customer lives in Seattle"}}\n</tool_call>')  # fmt: skip
            return "Noted."
        asks = {"_0-customer-0": ([("core_memory_retrieve", {"key": "first_name"})], "Michael"),
                "_2-customer-2": ([("archival_memory_key_search", {"query": "home city", "k": 1}),
                                   ("archival_memory_retrieve", {"key": "home_city"})], "Seattle")}  # fmt: skip
        for suffix, (calls, fact) in asks.items():
            if task.id.endswith(suffix):
                if self.said <= len(calls):
                    tool, arguments = calls[self.said - 1]
                    return "<tool_call>\n" + json.dumps({"name": tool, "arguments": arguments}) + "\n</tool_call>"
                found = observation[-1]["content"]
                return json.dumps({"answer": fact if fact in found else "I do not know", "context": found[:200]})
        return json.dumps({"answer": "I do not know", "context": "I do not know"})


class Opening(ScriptedGenerator):
    """Hands each agent its conversation's opening system prompt."""

    def generate(self, requests, seed):
        for request in requests:
            if request.observation and request.observation[0]["role"] == "system":
                self.agents[request.episode].opening = request.observation[0]["content"]
        return super().generate(requests, seed)


@pytest.mark.parametrize("writes", [True, False])
def test_memory_reaches_later_conversations_through_bfcls_snapshots(tmp_path, writes):
    out = tmp_path / "run"
    tasks = select(load_tasks("kv", out), ["customer"])
    agents = {i: Remembering(t, writes) for i, t in enumerate(tasks, start=1)}
    summary = evaluate_memory(["kv"], out, policy="oracle", env_config=ENV, settings=ModelSettings(concurrency=4),
                              generator=Opening(agents), scenarios=["customer"])  # fmt: skip
    records = {r["task_id"]: r for r in _records(out)}
    passed = {i for i, r in records.items() if r["reward"] == 1.0}
    assert passed == ({"memory_kv_0-customer-0", "memory_kv_2-customer-2"} if writes else set())
    assert summary["backends"]["kv"]["passed"] == len(passed) and summary["backends"]["kv"]["questions"] == 30
    final = json.loads((out / "agentic" / "memory" / "kv" / "memory_snapshot" / "customer_final.json").read_text())
    assert (final["core_memory"] == {"first_name": "Michael"}) == writes and ("home_city" in final["archival_memory"]) == writes
    # bfcl's memory instruction shows the core memory to every later conversation, and only then
    question = next(a for a in agents.values() if a.task.id == "memory_kv_0-customer-0")
    later = next(a for a in agents.values() if a.task.id.endswith("prereq_1-customer-1"))
    for agent in (question, later):
        assert ('"first_name": "Michael"' in agent.opening) == writes, agent.opening[:600]
    assert '"first_name"' not in agents[1].opening  # the first prerequisite starts from an empty memory


def _official_agentic_evaluation():
    """bfcl's ``_evaluate_single_agentic_entry``, the installed function's own source. Its module
    imports every API handler (anthropic, google-genai, ...), so the function is compiled on its own
    with the two names it uses."""
    import ast

    source = (Path(import_bfcl("utils").__file__).parent / "eval_checker" / "eval_runner.py").read_text()
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == "_evaluate_single_agentic_entry")
    namespace = {"agentic_checker": import_bfcl("eval_checker.agentic_eval.agentic_checker").agentic_checker,
                 "is_empty_execute_response": import_bfcl("eval_checker.multi_turn_eval.multi_turn_utils").is_empty_execute_response,
                 "BaseHandler": object}  # fmt: skip
    exec(compile(ast.Module([node], []), "eval_runner.py", "exec"), namespace)  # trusted package code
    return namespace["_evaluate_single_agentic_entry"]


def test_the_export_is_scored_by_bfcls_own_agentic_evaluation(tmp_path):
    _run(tmp_path / "run", backends=["kv"], scenarios=["notetaker"])
    wrong = _run(tmp_path / "wrong", backends=["kv"], scenarios=["notetaker"], messages=wrong_messages)
    assert wrong["accuracy"] == 0.0
    records = [r if r["index"] % 2 else w for r, w in zip(_records(tmp_path / "run"), _records(tmp_path / "wrong"))]
    assert 0 < sum(r["reward"] for r in records if not r["prereq"]) < 25
    written = export_memory(records, tmp_path / "export", "Qwen/Qwen3-8B-FC")
    assert [p.relative_to(tmp_path / "export").as_posix() for p in written] == [
        "Qwen_Qwen3-8B-FC/agentic/memory/kv/BFCL_v4_memory_kv_result.json"]
    utils = import_bfcl("utils")
    evaluate_entry = _official_agentic_evaluation()
    decode = official_decoder("hermes")
    handler = SimpleNamespace(decode_execute=lambda item, has_tool_call_tag=False: decode(item))
    prompts = {e["id"]: e for e in utils.load_dataset_entry("memory_kv", include_prereq=False)}
    truth = {e["id"]: e for e in utils.load_ground_truth_entry("memory_kv")}
    entries = utils.load_file(written[0])
    expected = {r["task_id"]: r["reward"] == 1.0 for r in records if not r["prereq"]}
    assert [e["id"] for e in entries] == list(expected)  # bfcl's order
    for entry in entries:
        official = evaluate_entry(handler, entry["id"], entry["result"],
                                                          truth[entry["id"].replace("memory_kv", "memory")]["ground_truth"],
                                                          prompts[entry["id"]], "model", "memory_kv")  # fmt: skip
        assert official["valid"] == expected[entry["id"]]
    assert not list((tmp_path / "export").rglob("*.partial"))


def test_the_opening_prompt_is_what_bfcls_qwen_fc_handler_writes(tmp_path):
    """bfcl's handler for the same entry, memory instruction included, from the same memory."""
    _run(tmp_path / "run", backends=["kv"], scenarios=["finance"])
    task = next(t for t in select(load_tasks("kv", tmp_path / "run"), ["finance"]) if not t.prereq)
    env = MemoryEnv(ENV)
    observation, _ = env.reset(task)
    utils = import_bfcl("model_handler.utils")
    question = [json.loads(json.dumps(list(task.questions[0])))]
    from seal_rl.backends import Backends

    memory = Backends(task).instances[task.involved_classes[0]]
    official = utils.add_memory_instruction_system_prompt(question, task.category, task.scenario, memory)[0]
    handler = import_bfcl("model_handler.local_inference.qwen_fc").QwenFCHandler
    prompt = handler._format_prompt(None, official, list(task.functions))
    ours = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in observation)
    assert prompt.startswith(ours) and prompt[len(ours):] == "<|im_start|>assistant\n"
    assert "There is no content in the core memory" in observation[0]["content"]  # the oracle stored nothing


@pytest.mark.parametrize("reply", [
    "<tool_call>\n{\"name\": \"core_memory_add\", \"arguments\": {\"key\": \"Bad Key\", \"value\": 1}}",  # unclosed block
    '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>',  # no such tool
    '<tool_call>\n{"name": "core_memory_retrieve", "arguments": {"key": ["x"], "zzz": 1}}\n</tool_call>',  # wrong arguments
    "\ud800" + "x" * 300_000,  # a lone surrogate and 300 KB
    "",
])
def test_hostile_replies_are_scored_never_crash_and_are_written(tmp_path, reply):
    def hostile(task):
        return ["Noted."] * task.num_turns if task.prereq else [reply, reply, reply]

    summary = _run(tmp_path / "run", backends=["rec_sum"], scenarios=["healthcare"], messages=hostile)
    assert summary["questions"] == 25 and summary["accuracy"] == 0.0
    assert set(summary["failures"]) <= {"agentic:answer_not_found", "agentic:no_last_message"}
    records = _records(tmp_path / "run")
    assert len(records) == summary["questions"] + summary["prerequisites"]


def test_a_run_stopped_midway_resumes_to_the_same_result(tmp_path):
    full = _run(tmp_path / "full", backends=["kv"], scenarios=["customer", "student"])
    seen = []

    def stop(record):
        seen.append(record)
        if len(seen) == 9:  # in the prerequisite rounds
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path / "part", backends=["kv"], scenarios=["customer", "student"], on_episode=stop)
    kept = []
    again = _run(tmp_path / "part", backends=["kv"], scenarios=["customer", "student"], on_resume=kept.extend)
    assert len(kept) >= 8 and again == full
    assert [r["task_id"] for r in _records(tmp_path / "part")] == [r["task_id"] for r in _records(tmp_path / "full")]
    with pytest.raises(SealError, match="different run"):
        _run(tmp_path / "part", backends=["kv"], scenarios=["customer"])


def test_bad_input_is_one_line_and_nothing_starts(monkeypatch, capsys, tmp_path):
    out = tmp_path / "run"
    for args, message in (
        (["-c", "vector"], "sentence-transformers"),
        (["-c", "graph"], "Unknown memory backend 'graph'"),
        (["--split", "shop"], "Unknown memory scenario 'shop'"),
        (["--tasks", "memory_999-customer-0"], "No memory question"),
        (["--trials", "2"], "do not apply to bfcl-memory"),
        (["--policy", "replay:x.jsonl"], "bfcl-memory plays --policy oracle"),
    ):
        argv = ["eval", "--benchmark", "bfcl-memory", "--out", str(out), *args]
        if "--policy" not in args:
            argv += ["--policy", "oracle"]
        code, _, err = run_cli(monkeypatch, capsys, *argv)
        assert code == 2 and message in " ".join(err.split()) and "Traceback" not in err, (args, err)
        assert not (out / "results.jsonl").exists()


def test_seal_eval_plays_a_selection_and_prints_the_table(monkeypatch, capsys, tmp_path):
    code, out, err = run_cli(monkeypatch, capsys, "eval", "--benchmark", "bfcl-memory", "--policy", "oracle", "-c", "kv",
                             "--tasks", "memory_3-customer-3,memory_kv_7-customer-7", "--out", str(tmp_path / "run"))  # fmt: skip
    assert code == 0, err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["backends"]["kv"]["questions"] == 2 and summary["prerequisites"] == 10 and summary["accuracy"] == 1.0
    assert "100.0%" in out and "10 prerequisite conversations" in out
    code, out, err = run_cli(monkeypatch, capsys, "diagnose", str(tmp_path / "run"), "--json")
    assert code == 0 and json.loads(out)["labels"] == {"pass": 2}, err
    code, out, err = run_cli(monkeypatch, capsys, "report", str(tmp_path / "run"))
    assert code == 0 and "memory_kv_3-customer-3" in (tmp_path / "run" / "report.html").read_text(), err
    with pytest.raises(SealError, match="ids look like"):
        select(load_tasks("kv", tmp_path), None, ["customer-3"])


@pytest.mark.slow
def test_a_tiny_real_model_plays_a_scenario_and_the_run_exports(monkeypatch, capsys, tiny_model_dir, tmp_path):
    """The hf: path: prerequisites and a question played by a model, the dtype recorded, the export written."""
    run = tmp_path / "run"
    code, out, err = run_cli(monkeypatch, capsys, "eval", "--benchmark", "bfcl-memory", "--policy", f"hf:{tiny_model_dir}",
                             "-c", "rec_sum", "--tasks", "memory_30-healthcare-0", "--max-new-tokens", "8",
                             "--temperature", "1.0", "--out", str(run))  # fmt: skip
    assert code == 0, err
    records = _records(run)
    assert [r["prereq"] for r in records] == [True] * 5 + [False]
    assert all(sum(m["role"] == "assistant" for m in r["messages"]) >= r["num_turns"] for r in records)  # the model spoke every turn
    assert json.loads((run / "config.json").read_text())["precision"]["dtype"] in ("float32", "bfloat16")
    code, out, err = run_cli(monkeypatch, capsys, "export-bfcl", str(run), "--out", str(tmp_path / "export"))
    assert code == 0, err
    (written,) = (tmp_path / "export").rglob("BFCL_v4_memory_rec_sum_result.json")
    assert [json.loads(line)["id"] for line in written.read_text().splitlines()] == ["memory_rec_sum_30-healthcare-0"]
