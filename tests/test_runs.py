"""Run directories survive hostile text and crashes: JSON Lines writers and readers, the per-run
lock, torn and corrupt lines, and training resumed from any kill point (issue 14)."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seal_rl import jsonl
from seal_rl.env import EnvConfig
from seal_rl.errors import SealWarning
from seal_rl.evaluate import evaluate, read_results
from seal_rl.policies import parse_policy
from seal_rl.report import write_report
from seal_rl.tasks import TaskSet
from seal_rl.train import SEAL_STATE_FILE, _drop_logs_after, read_metrics, train
from tests.test_cli import run_cli

ROOT = Path(__file__).resolve().parents[1]
_TASKS: dict = {}  # the task set, loaded once for the property test

# Any string a model can produce: lone surrogates, the separators str.splitlines() splits on, NUL.
hostile_text = st.text(
    st.one_of(st.characters(), st.integers(0xD800, 0xDFFF).map(chr), st.sampled_from(["\u2028", "\u2029", "\x85", "\x0b", "\x1c", "\x00", "\r"])),
    max_size=40,
)


def _same_text(a: str) -> str:
    """A string as UTF-16 sees it: adjacent surrogates that form a pair read back as one character."""
    return a.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")


@given(st.lists(hostile_text, max_size=5))
def test_any_string_round_trips_through_one_json_line(values):
    line = jsonl.dumps({"v": values})
    assert "\n" not in line and line.encode("utf-8")  # one line, writable as UTF-8
    assert json.loads(line) == {"v": [_same_text(v) for v in values]}


@settings(max_examples=50, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from("abc"), hostile_text, max_size=2), min_size=1, max_size=6), st.data())
def test_a_corrupt_line_never_hides_the_lines_after_it(tmp_path_factory, values, data):
    path = tmp_path_factory.mktemp("jsonl") / "x.jsonl"
    lines = [jsonl.dumps(v) for v in values]
    bad = data.draw(st.integers(0, len(lines) - 1))
    lines[bad] = lines[bad][: len(lines[bad]) // 2] + "\x01}{"
    torn = data.draw(st.booleans())
    path.write_text("\n".join(lines) + ("\n" + '{"a": "cut' if torn else "\n"), encoding="utf-8")
    read = jsonl.read(path)
    assert read.values == [json.loads(line) for i, line in enumerate(lines) if i != bad]
    assert f"{path}:{bad + 1}: not valid JSON" in read.problems[0]
    assert bool(read.torn) == torn and len(read.problems) == 1 + torn


def _replay(tmp_path: Path, messages_per_episode: list[list[str]]) -> Path:
    path = tmp_path / "replay.jsonl"
    path.write_text("".join(json.dumps({"task_id": "multi_turn_base_0", "assistant": m}) + "\n" for m in messages_per_episode),
                    encoding="utf-8")  # fmt: skip
    return path


def test_a_lone_surrogate_in_a_tool_argument_no_longer_blocks_evaluation(monkeypatch, capsys, tmp_path):
    half_emoji = '<tool_call>\n{"name": "mkdir", "arguments": {"dir_name": "x\\ud83d"}}\n</tool_call>'
    replay = _replay(tmp_path, [["Done."], [half_emoji, "Done."], ["Done."]])
    for protocol in ("bfcl", "seal"):
        out = tmp_path / protocol
        code, _, err = run_cli(monkeypatch, capsys, "eval", "-p", f"replay:{replay}", "--out", str(out), "--protocol", protocol)
        assert code == 0, err
        records = read_results(out)
        assert [r["index"] for r in records] == [1, 2, 3]  # the episodes after it were evaluated too
        assert records[1]["trace"][0]["arguments"] == {"dir_name": "x\ud83d"}  # kept, not mangled
        code, _, err = run_cli(monkeypatch, capsys, "eval", "-p", f"replay:{replay}", "--out", str(out), "--protocol", protocol)
        assert code == 0 and "3 of 3 episodes already done" in err  # and resuming reads it back
    assert write_report(tmp_path / "seal").read_text(encoding="utf-8")


@settings(max_examples=15, deadline=None)
@given(hostile_text, hostile_text)
def test_any_model_text_survives_eval_and_its_resume(tmp_path_factory, argument, text):
    tmp = tmp_path_factory.mktemp("hostile")
    call = '<tool_call>\n{"name": "mkdir", "arguments": {"dir_name": ' + json.dumps(argument) + "}}\n</tool_call>"
    policy = parse_policy(f"replay:{_replay(tmp, [[call, text, 'Done.']])}")
    episodes = policy.episodes([], _TASKS.setdefault("set", TaskSet.load()), "hermes")
    evaluate(episodes, EnvConfig(), tmp / "run", policy=policy)
    (record,) = read_results(tmp / "run")
    assert record["trace"][0]["arguments"] == {"dir_name": _same_text(argument)}
    assert evaluate(episodes, EnvConfig(), tmp / "run", policy=policy)["episodes"] == 1  # resumed from the file


def test_replay_files_split_on_newlines_only(monkeypatch, capsys, tmp_path):
    text = "line\u2028separator\x85next\u2029para"
    raw = tmp_path / "raw.jsonl"  # the separators written raw, as seal-rl's own writers write them
    raw.write_text(json.dumps({"task_id": "multi_turn_base_0", "assistant": [text]}, ensure_ascii=False) + "\n", encoding="utf-8")
    code, _, err = run_cli(monkeypatch, capsys, "eval", "-p", f"replay:{raw}", "--out", str(tmp_path / "run"))
    assert code == 0, err
    assert read_results(tmp_path / "run")[0]["messages"][2]["content"] == text


def test_a_corrupt_results_line_is_reported_and_only_its_episode_played_again(monkeypatch, capsys, tmp_path):
    args = ("eval", "-p", "oracle:faults=0.5,seed=1", "--tasks", "multi_turn_base_0,multi_turn_base_1,multi_turn_base_2,multi_turn_base_3",
            "--out", str(tmp_path))  # fmt: skip
    assert run_cli(monkeypatch, capsys, *args)[0] == 0
    path = tmp_path / "results.jsonl"
    good = path.read_text(encoding="utf-8").split("\n")
    path.write_text("\n".join([good[0], good[1][:50], *good[2:]]), encoding="utf-8")
    code, _, err = run_cli(monkeypatch, capsys, *args)
    assert code == 0 and f"{path}:2: not valid JSON" in " ".join(err.split()) and "3 of 4 episodes already done" in err
    assert path.read_text(encoding="utf-8").split("\n") == good  # the same file as before the damage


def test_a_second_writer_to_the_same_run_directory_is_refused(monkeypatch, capsys, tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from seal_rl.runlock import run_lock\n"
                               f"with run_lock({str(tmp_path)!r}):\n    print('held', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        code, out, err = run_cli(monkeypatch, capsys, "eval", "-p", "oracle", "--tasks", "multi_turn_base_0", "--out", str(tmp_path))
        assert code == 2 and "Another seal process is writing to" in err and len(err.strip().splitlines()) == 1
        assert not (tmp_path / "results.jsonl").exists()
    finally:
        holder.kill()
        holder.wait()
    code, _, err = run_cli(monkeypatch, capsys, "eval", "-p", "oracle", "--tasks", "multi_turn_base_0", "--out", str(tmp_path))
    assert code == 0, err  # a killed holder leaves no stale lock


def test_training_logs_with_torn_lines_and_hostile_text_resume_and_report(tmp_path):
    rows = [{"round": r, "text": "\ud83d\u2028x", "kind": "rollout"} for r in (1, 2, 3)]
    for name in ("metrics.jsonl", "trajectories.jsonl"):
        with open(tmp_path / name, "w", encoding="utf-8") as handle:
            for row in rows:
                jsonl.append(handle, row)
            handle.write('{"round": 4, "te')  # killed mid-write
    assert [m["round"] for m in read_metrics(tmp_path)] == [1, 2, 3]
    _drop_logs_after(tmp_path, 2)
    assert [json.loads(line)["round"] for line in (tmp_path / "trajectories.jsonl").read_text(encoding="utf-8").split("\n") if line] == [1, 2]
    assert read_metrics(tmp_path)[0]["text"] == "\ud83d\u2028x"


def _seal(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "seal_rl", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **kwargs)


def test_training_killed_at_random_points_resumes_to_every_round_exactly_once(tmp_path):
    """SIGKILL `seal train` (smoke recipe: 2 rounds of 8 episodes) at random moments, resume until it
    finishes: every round is in the logs exactly once, and the model is written."""
    out = tmp_path / "run"
    rng = random.Random(7)
    start = ("train", "--config", str(ROOT / "configs" / "smoke-cpu.yaml"), "--out", str(out))
    kills, process = 0, _seal(*start)
    for _ in range(4):
        deadline = time.time() + rng.uniform(3, 15)
        while time.time() < deadline and process.poll() is None:
            time.sleep(0.1)
        if process.poll() is not None:
            break
        process.send_signal(signal.SIGKILL)
        process.wait()
        kills += 1
        # killed before it wrote the recipe into the run directory: nothing to resume, start again
        process = _seal("train", "--resume", str(out)) if (out / "config.yaml").exists() else _seal(*start)
    _, stderr = process.communicate(timeout=600)
    assert process.returncode == 0, stderr[-2000:]
    assert kills >= 2
    assert [m["round"] for m in read_metrics(out)] == [1, 2]
    rounds = [json.loads(line)["round"] for line in (out / "trajectories.jsonl").read_text(encoding="utf-8").split("\n") if line]
    assert sorted(rounds) == [1] * 8 + [2] * 8
    assert (out / "model" / "config.json").exists()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SealWarning)
        assert write_report(out).exists()


def test_resume_before_the_first_checkpoint_starts_over_and_says_so(tiny_model_dir, tmp_path):
    from tests.test_train import _recipe

    out = tmp_path / "run"
    recipe = _recipe(tiny_model_dir, **{"grpo.max_steps": 1})
    train(recipe, out)
    for checkpoint in (out / "checkpoints").glob("checkpoint-*"):  # as if killed before checkpoint 1
        (checkpoint / SEAL_STATE_FILE).unlink()
    with open(out / "trajectories.jsonl", "a", encoding="utf-8") as handle:
        handle.write('{"round": 2, "cut')  # and a torn last line
    with pytest.warns(SealWarning, match="has no checkpoint yet; starting the run over from round 1"):
        summary = train(recipe, out, resume=out)
    assert summary["rounds"] == 1 and [m["round"] for m in read_metrics(out)] == [1]
    rows = [json.loads(line) for line in (out / "trajectories.jsonl").read_text(encoding="utf-8").split("\n") if line]
    assert [r["round"] for r in rows] == [1] * 4  # round 1 once, the torn line gone


@settings(max_examples=30, deadline=None)
@given(st.lists(hostile_text, min_size=1, max_size=4))
def test_any_text_survives_the_training_logs_and_their_resume(tmp_path_factory, texts):
    out = tmp_path_factory.mktemp("train-logs")
    rows = [{"round": r + 1, "kind": "rollout", "messages": [{"role": "assistant", "content": t}]} for r, t in enumerate(texts)]
    for name in ("metrics.jsonl", "trajectories.jsonl"):
        with open(out / name, "a", encoding="utf-8") as handle:  # as SealLoop writes them
            for row in rows:
                jsonl.append(handle, row)
    assert [m["messages"][0]["content"] for m in read_metrics(out)] == [_same_text(t) for t in texts]
    _drop_logs_after(out, 1)
    assert [m["round"] for m in read_metrics(out)] == [1]


@settings(max_examples=8, deadline=None)
@given(hostile_text, hostile_text)
def test_any_text_survives_the_report(tmp_path_factory, task_id_noise, message):
    tmp = tmp_path_factory.mktemp("report")
    replay = _replay(tmp, [[message, "Done."]])
    policy = parse_policy(f"replay:{replay}")
    episodes = policy.episodes([], _TASKS.setdefault("set", TaskSet.load()), "hermes")
    evaluate(episodes, EnvConfig(), tmp / "run", policy=policy)
    path = tmp / "run" / "results.jsonl"
    (record,) = read_results(tmp / "run")
    record["end_reason"] = task_id_noise  # a tampered field too
    path.write_text(jsonl.dumps(record) + "\n", encoding="utf-8")
    page = write_report(tmp / "run").read_text(encoding="utf-8")
    assert "<script>alert" not in page and len(page) > 1000
