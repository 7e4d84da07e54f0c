import html
import json
import re
import shutil
import subprocess
import sys
from collections import Counter
from html.parser import HTMLParser

import pytest
from hypothesis import given
from hypothesis import strategies as st

from seal_rl.errors import SealError
from seal_rl.interface import GUIDELINES
from seal_rl.report import compare_report, eval_report, training_report, write_report
from seal_rl.report.episodes import episode_html, steps_of
from seal_rl.report.evaluation import browsable, end_reasons, label_counts
from seal_rl.report.page import sample_evenly
from seal_rl.report.interface import switched_by
from seal_rl.report.training import optimisation_metrics, time_section
from tests.report_runs import episode, write_eval_run, write_training_run

EIGHT = ("multi_turn_base_1,multi_turn_base_4,multi_turn_miss_func_1,multi_turn_miss_func_2,"
         "multi_turn_miss_param_1,multi_turn_miss_param_2,multi_turn_long_context_1,multi_turn_long_context_4")  # fmt: skip
HOSTILE = '<script>window.__pwned=1;document.title="pwned"</script><img src=x onerror="window.__pwned=2">'


def _seal(*args, timeout=600, code=0):
    result = subprocess.run([sys.executable, "-m", "seal_rl", *args], capture_output=True, text=True, timeout=timeout)
    assert result.returncode == code, result.stderr[-3000:]
    return result


class Tags(HTMLParser):
    """Every start tag with its attributes, and the text a reader sees."""

    def __init__(self, page: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def _no_markup_from_the_run(page: str) -> Tags:
    parsed = Tags(page)
    assert [t for t, _ in parsed.tags].count("script") == 1  # the page's own filter script
    handlers = {name for _, attrs in parsed.tags for name in attrs if name.startswith("on")}
    assert handlers <= {"onchange", "oninput"}, handlers  # only the filters' own handlers
    assert not any(t == "img" and not (a.get("src") or "").startswith("data:image/png;base64,") for t, a in parsed.tags)
    return parsed


@pytest.fixture(scope="module")
def hf_run(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("hf") / "eval"
    _seal("eval", "--policy", f"hf:{tiny_model_dir}", "--tasks", EIGHT, "--max-new-tokens", "16", "--concurrency", "8", "--out", str(out))
    return out


@pytest.fixture(scope="module")
def replay_run(tmp_path_factory):
    """multi_turn_base_0 played by a replay under the seal protocol (as training plays): a message with one real and one unknown call (rejected
    whole), a hostile text answer, and an unparseable call."""
    tmp = tmp_path_factory.mktemp("replay")
    messages = ['<tool_call>\n{"name": "ls", "arguments": {}}\n</tool_call>\n'
                '<tool_call>\n{"name": "no_such_tool", "arguments": {"x": "<b>bold</b>"}}\n</tool_call>',
                HOSTILE, "<tool_call>\n{not json\n</tool_call>"]  # fmt: skip
    (tmp / "replay.jsonl").write_text(json.dumps({"task_id": "multi_turn_base_0", "assistant": messages}) + "\n")
    _seal("eval", "--policy", f"replay:{tmp / 'replay.jsonl'}", "--out", str(tmp / "run"), "--protocol", "seal")
    return tmp / "run"


@pytest.fixture(scope="module")
def faulty_runs(tmp_path_factory):
    """The faulty oracle and the oracle on the same 12 tasks, 2 samples each."""
    tmp = tmp_path_factory.mktemp("faulty")
    tasks = ",".join([*(f"multi_turn_base_{i}" for i in range(6)), *(f"multi_turn_miss_func_{i}" for i in range(3)),
                      *(f"multi_turn_miss_param_{i}" for i in range(3))])  # fmt: skip
    _seal("eval", "-p", "oracle:faults=0.6,seed=3", "--tasks", tasks, "--samples", "2", "--out", str(tmp / "a"), "--protocol", "seal")
    _seal("eval", "-p", "oracle", "--tasks", tasks, "--samples", "2", "--out", str(tmp / "b"), "--protocol", "seal")
    return tmp / "a", tmp / "b"


def _records(run):
    return [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]


# -- evaluation report ------------------------------------------------------------------------


def test_a_tiny_hf_model_is_evaluated_on_eight_tasks(hf_run):
    records = _records(hf_run)
    assert len(records) == 8 and {r["category"] for r in records} == {"base", "miss_func", "miss_param", "long_context"}
    assert all(r["model_calls"] >= 1 and r["diagnosis"]["labels"] for r in records)
    summary = json.loads((hf_run / "summary.json").read_text())
    assert summary["episodes"] == 8 and all(len(c["ci95"]) == 2 for c in summary["categories"].values())
    config = json.loads((hf_run / "config.json").read_text())
    assert config["model_settings"]["temperature"] == 0.0  # greedy by default


def test_the_eval_report_is_self_contained(hf_run):
    page = write_report(hf_run).read_text()
    for section in ("<h2>Success</h2>", "<h2>Failure labels</h2>", "Label mix by turn position", "<h2>How episodes ended</h2>",
                    "<h2>Trajectories</h2>", 'id="f-task"'):  # fmt: skip
        assert section in page
    assert page.count('class="episode"') == 8 and page.count('src="data:image/png;base64,') == 3  # no pass@k: 1 sample
    assert not re.search(r'(src|href)="(https?:)?//', page) and "<link" not in page  # nothing fetched


def test_model_text_is_escaped_in_the_report(replay_run):
    page = write_report(replay_run).read_text()
    parsed = _no_markup_from_the_run(page)
    assert HOSTILE in "".join(parsed.text)  # shown, as text
    assert "&lt;script&gt;window.__pwned=1;document.title=" in page


def test_calls_in_a_rejected_message_are_shown_rejected_with_what_the_agent_saw(replay_run):
    (record,) = _records(replay_run)
    assert record["steps"][0]["event"] == "rejected"  # the environment rejected the whole message
    block = str(episode_html(record))
    assert "[None] None" not in block  # the old report drew the unexecuted ls call green with this
    rejected = re.findall(r'<div class="rejected-call">(.*?)</div>', block, re.S)
    assert len(rejected) == 2 and all('<span class="tag">rejected</span>' in r for r in rejected)
    assert "ls({})" in rejected[0] and "not executed" in rejected[0]
    assert "no_such_tool" in rejected[1] and "is not available" in rejected[1]
    assert 'class="ok"' not in block.split("step 1")[0]  # nothing before step 1 looks like it ran
    observation = next(m["content"] for m in record["messages"][3:] if m["content"].startswith("[ERROR]"))
    assert f"[user] {observation}" in "".join(Tags(block).text)  # the rejection message the agent saw


def test_an_unparseable_message_is_shown_as_not_parsed(replay_run):
    (record,) = _records(replay_run)
    block = str(episode_html(record))
    assert '<span class="tag">not parsed</span> nothing in this message ran' in block and "[None]" not in block


def test_steps_inferred_from_the_trace_match_the_environment(faulty_runs, replay_run):
    """Training rows carry no ``steps``; the browser infers them from the trace and must agree with
    what the environment recorded, on every episode of a faulty oracle (rejections, text answers,
    failed calls) and the replay."""
    records = [*_records(faulty_runs[0]), *_records(replay_run)]
    assert any(s["event"] == "rejected" for r in records for s in r["steps"])
    for record in records:
        assistant = sum(m["role"] == "assistant" for m in record["messages"])
        inferred = steps_of({k: v for k, v in record.items() if k != "steps"}, assistant)
        assert inferred == record["steps"][:assistant], record["task_id"]


_text = st.lists(st.sampled_from([*"<>&\"'=/ ab;()", "script", "onerror", "<img", "</pre>", "-->"]), max_size=12).map("".join)


@given(task_id=_text, end_reason=_text, index=_text, sample=_text, message=_text, role=_text, error=_text,
       name=_text, argument=_text, result=_text, evidence=_text, fault=_text)  # fmt: skip
def test_every_field_of_an_episode_is_shown_as_text(task_id, end_reason, index, sample, message, role, error, name,
                                                    argument, result, evidence, fault):  # fmt: skip
    record = episode(task_id, "base", index=index, sample=sample, text=message, end_reason=end_reason, error=error,
                     labels=("pass", "state_mismatch"), faults=[{"turn": 0, "type": fault}])  # fmt: skip
    record["messages"].insert(2, {"role": role, "content": message})
    record["trace"] = [{"turn": 0, "step": 0, "name": name, "arguments": {argument: argument}, "accepted": True,
                        "result": result, "error_kind": "execution", "error": error}]  # fmt: skip
    record["steps"][0]["event"] = "tool_results"
    record["diagnosis"]["labels"][1]["evidence"] = {"note": evidence}
    parsed = Tags(str(episode_html(record)))
    assert {t for t, _ in parsed.tags} <= {"details", "summary", "span", "div", "pre", "b"}
    assert all(name == "class" or name == "style" or name.startswith("data-") for _, a in parsed.tags for name in a)
    attributes = {name: value for t, a in parsed.tags if t == "details" for name, value in a.items()}
    assert attributes["data-task"] == task_id  # the search box matches the id itself
    text = "".join(parsed.text)
    for value in (task_id, end_reason, str(index), str(sample), message, name, result, error, fault):
        assert value in text


def test_every_field_of_results_is_escaped_in_the_whole_page(tmp_path):
    records = [episode(HOSTILE, "base", index=HOSTILE, sample=HOSTILE, text=HOSTILE, end_reason=HOSTILE, error=None,
                       labels=("pass", "missing_tool_call"), faults=[{"turn": HOSTILE, "type": HOSTILE}]),
               episode("multi_turn_base_1", "base", reward=1.0, index=2)]  # fmt: skip
    run = write_eval_run(tmp_path / "run", records, config={"policy": HOSTILE, "versions": {HOSTILE: HOSTILE}})
    page = eval_report(run)
    parsed = _no_markup_from_the_run(page)
    assert "".join(parsed.text).count(HOSTILE) >= 6  # meta, end-reason table, summary, text, ...


def test_pass_at_k_is_the_unbiased_estimate_when_tasks_were_sampled(tmp_path):
    rewards = {"multi_turn_base_0": [1.0, 0.0, 0.0], "multi_turn_base_1": [0.0, 0.0, 0.0]}
    records = [episode(t, "base", reward=r, sample=s, index=i) for i, (t, rs) in enumerate(rewards.items()) for s, r in enumerate(rs)]
    page = eval_report(write_eval_run(tmp_path / "run", records))
    # one task: 1 of 3 correct: pass@1 = 1/3, pass@2 = 1 - C(2,2)/C(3,2) = 2/3, pass@3 = 1; the other 0
    row = re.search(r"<tr><td>base</td>(.*?)</tr>", page.split("<h2>pass@k</h2>")[1], re.S).group(1)
    assert re.findall(r"<td>([\d.]+%)</td>", row) == ["16.7%", "33.3%", "50.0%"]
    assert page.count('src="data:image/png;base64,') == 4


def test_without_samples_the_page_says_how_to_get_pass_at_k(tmp_path):
    page = eval_report(write_eval_run(tmp_path / "run", [episode("multi_turn_base_0", "base")]))
    assert "One sample per task: no pass@k" in page and "--samples N" in page


def test_label_mix_by_turn_position_and_end_reasons(tmp_path):
    records = [episode("a", "base", labels=("pass", "missing_tool_call", "state_mismatch")),
               episode("b", "base", labels=("pass", "pass"), end_reason="max_model_calls"),
               episode("c", "miss_func", labels=("spurious_tool_call",))]  # fmt: skip
    per_category, per_turn = label_counts(records)
    assert per_turn == {"turn 0": Counter({"pass": 2, "spurious_tool_call": 1}), "turn 1": Counter({"missing_tool_call": 1, "pass": 1}),
                        "turn 2": Counter({"state_mismatch": 1})}  # fmt: skip
    assert per_category["base"] == Counter({"pass": 3, "missing_tool_call": 1, "state_mismatch": 1})
    reasons, columns = end_reasons(records)
    assert reasons == {"base": Counter(completed=1, max_model_calls=1), "miss_func": Counter(completed=1)}
    assert columns == ["completed", "max_model_calls"]
    page = eval_report(write_eval_run(tmp_path / "run", records))
    table = page.split("<h2>How episodes ended</h2>")[1].split("</table>")[0]
    assert re.search(r"<td>base</td><td>2</td>\s*<td>50.0%</td><td>50.0%</td>", table)


@given(n=st.integers(0, 300), cap=st.integers(1, 60))
def test_sampling_keeps_at_most_cap_in_order_with_both_ends(n, cap):
    kept = sample_evenly(range(n), cap)
    assert len(kept) == min(n, cap) and kept == sorted(set(kept))
    if n:
        assert kept[0] == 0 and (cap == 1 or kept[-1] == n - 1)


@given(tasks=st.integers(1, 30), samples=st.integers(1, 4), cap=st.integers(1, 50))
def test_the_browser_shows_every_task_before_a_second_sample(tasks, samples, cap):
    records = [{"task_id": f"t{t}", "sample": s} for t in range(tasks) for s in range(samples)]
    shown = browsable(records, cap)
    assert len(shown) == min(cap, len(records))
    assert [records.index(r) for r in shown] == sorted(records.index(r) for r in shown)  # run order
    assert len({r["task_id"] for r in shown}) == min(tasks, len(shown))  # no task twice while one is missing


def test_the_browser_keeps_at_most_cap_episodes_and_says_so(tmp_path):
    records = [episode(f"multi_turn_base_{i}", "base", index=i + 1, reward=float(i % 2)) for i in range(10)]
    page = eval_report(write_eval_run(tmp_path / "run", records), cap=3)
    assert page.count('class="episode"') == 3 and "Showing 3 of 10 episodes" in page
    assert re.search(r"<td>base</td><td>10</td>\s*<td>5</td><td>50.0%</td>", page)  # rates still count all ten


def test_report_needs_a_run_directory(tmp_path):
    with pytest.raises(SealError, match="neither an evaluation run"):
        write_report(tmp_path)


# -- training report --------------------------------------------------------------------------


def test_trl_metrics_come_from_metrics_jsonl_else_from_the_trainer_state(tmp_path):
    logged = write_training_run(tmp_path / "new", trl_lines=True)
    source, series = optimisation_metrics(logged, [json.loads(x) for x in (logged / "metrics.jsonl").read_text().splitlines()])
    assert source == "metrics.jsonl" and series["kl"] == {1: 0.01, 2: 0.02, 3: 0.03, 4: 0.04}
    old = write_training_run(tmp_path / "old")
    source, series = optimisation_metrics(old, [json.loads(x) for x in (old / "metrics.jsonl").read_text().splitlines()])
    assert source == "checkpoints/checkpoint-4/trainer_state.json" and series["loss"] == {1: 0.5, 2: 0.25, 3: 0.5 / 3, 4: 0.125}
    assert set(series) == {"loss", "kl", "entropy", "grad_norm", "clip_ratio/region_mean", "completions/mean_length",
                           "frac_reward_zero_std"}  # fmt: skip


def test_a_run_without_learning_signal_is_flagged(tmp_path):
    flat = training_report(write_training_run(tmp_path / "flat", zero_signal=True))
    assert "id='no-signal'" in flat and "the loss was 0 at every step" in flat
    assert "id='no-signal'" not in training_report(write_training_run(tmp_path / "ok"))


def test_the_interface_timeline_names_the_labels_and_shows_the_prompt(tmp_path):
    page = training_report(write_training_run(tmp_path / "run"))
    section = page.split("<h2>Interface evolution</h2>")[1].split("<h2>")[0]
    assert "guideline:active_respond ← missing_tool_call" in section and "tool_list ← missing_tool_call" in section
    assert 'class="legend"' in section
    summaries = re.findall(r"<details><summary>(rounds .*?)</summary><pre>(.*?)</pre>", section, re.S)
    assert [s for s, _ in summaries] == ["rounds 1: base interface", "rounds 2–4: guideline:active_respond, tool_list"]
    assert html.escape(GUIDELINES["active_respond"]) not in summaries[0][1]
    assert html.escape(GUIDELINES["active_respond"]) in summaries[1][1] and "<tools>" not in summaries[1][1]


def test_switched_by_follows_evolve():
    pressure = ("argument_mismatch", "invalid_tool_call", "recovery_failure", "missing_tool_call", "state_mismatch")
    assert switched_by("schema:cd,ls", pressure) == ["argument_mismatch"]
    assert switched_by("format_note", pressure) == ["argument_mismatch", "invalid_tool_call"]
    assert switched_by("parse_hints", pressure) == ["invalid_tool_call"]
    assert switched_by("tool_hints", pressure) == ["recovery_failure"]
    assert switched_by("guideline:state_aware", pressure) == ["state_mismatch"]
    assert switched_by("tool_list", pressure) == ["missing_tool_call"] and switched_by("format_note", ()) == []


def test_the_time_table_sums_resumed_sessions_and_the_last_round():
    rounds = [{"round": 1, "time/seconds": {"generation": 1.0, "optimisation": 0.0}},
              {"round": 2, "time/seconds": {"generation": 2.0, "optimisation": 5.0}},
              {"round": 3, "time/seconds": {"generation": 1.0, "optimisation": 0.0}},  # resumed: counters restart
              {"round": 4, "time/seconds": {"generation": 3.0, "optimisation": 4.0}}]  # fmt: skip
    end = {"round": 4, "time/seconds": {"generation": 3.0, "optimisation": 9.0}}
    table = str(time_section(rounds, end)[1])
    assert "<td>optimisation</td>\n<td>14.0</td>" in table and "<td>generation</td>\n<td>5.0</td>" in table
    assert "<th>19.0</th>" in table and "not included" not in table
    assert "not included" in str(time_section(rounds, None)[1])


def test_the_training_report_has_its_sections_and_a_rollout_browser(tmp_path):
    page = training_report(write_training_run(tmp_path / "run", text=HOSTILE))
    for section in ("Success over training", "<h2>Validation</h2>", "<h2>Optimisation</h2>", "Failure labels over training",
                    "Interface evolution", "A-Patch weights", "Rewards and scales", "Where the time went", "<h2>Training rollouts</h2>"):  # fmt: skip
        assert section in page
    assert page.count('class="episode"') == 16 and "round 3 · w 1.2" in page
    assert page.count("assistant, step 0 → end") == 16  # steps inferred for rows without them
    assert HOSTILE in "".join(_no_markup_from_the_run(page).text)


def test_a_long_run_stays_bounded(tmp_path):
    run = write_training_run(tmp_path / "run", rounds=300, per_round=8)
    page = training_report(run, cap=40)
    assert page.count('class="episode"') == 40 and "Showing 40 of 2400 rollouts" in page
    assert len(page) < 1_500_000


# -- comparison page --------------------------------------------------------------------------


def test_compare_two_runs(tmp_path):
    tasks = ",".join(f"multi_turn_base_{i}" for i in range(40))
    _seal("eval", "-p", "oracle", "--tasks", tasks, "--out", str(tmp_path / "a"))
    _seal("eval", "-p", "oracle:faults=0.5,seed=1", "--tasks", tasks, "--out", str(tmp_path / "b"))
    result = _seal("compare", str(tmp_path / "a"), str(tmp_path / "b"))
    assert "McNemar" in result.stdout and "paired bootstrap" in result.stdout
    row = next(line for line in result.stdout.splitlines() if line.startswith("│ base"))
    cells = [c.strip() for c in row.split("│")[1:-1]]
    _, pairs, rate_a, rate_b, _, only_a, only_b, p_value = cells
    assert pairs == "40" and rate_a == "100.0%" and int(only_b) == 0 and int(only_a) > 10
    assert float(p_value) < 0.01  # the faulty oracle is significantly worse, pair by pair


def test_compare_html_shows_both_runs_and_every_flip(faulty_runs, tmp_path):
    a, b = faulty_runs
    _seal("compare", str(a), str(b), "--resamples", "200", "--html", str(tmp_path / "cmp.html"))
    page = (tmp_path / "cmp.html").read_text()
    outcome = lambda run: {(r["task_id"], r["sample"]): r["reward"] == 1.0 for r in _records(run)}  # noqa: E731
    flips = {k for k, v in outcome(a).items() if v != outcome(b)[k]}
    assert flips and page.count('class="flip"') == len(flips)
    for task, sample in flips:
        assert f'data-task="{task}"><td>{task}</td><td>{sample}</td>' in page
    for section in ("<h2>Success</h2>", "<h2>Label mix</h2>", "<h2>Flipped episodes</h2>", "McNemar p"):
        assert section in page
    _no_markup_from_the_run(page)


def test_compare_html_into_a_directory_is_one_clear_line(faulty_runs, tmp_path):
    result = _seal("compare", *map(str, faulty_runs), "--resamples", "10", "--html", str(tmp_path), code=2)
    assert "is a directory; give a file path" in result.stderr and "Traceback" not in result.stderr


def test_compare_report_needs_shared_episodes(tmp_path):
    a = write_eval_run(tmp_path / "a", [episode("multi_turn_base_0", "base")])
    b = write_eval_run(tmp_path / "b", [episode("multi_turn_base_1", "base")])
    with pytest.raises(SealError, match="share no episode"):
        compare_report(a, b)


@pytest.mark.skipif(shutil.which("chromium") is None, reason="headless Chromium is not installed (apt-get install chromium)")
def test_headless_chromium_renders_the_report(hf_run, tmp_path):
    page = write_report(hf_run)
    shot = tmp_path / "report.png"
    subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,1600", f"--screenshot={shot}", page.as_uri()],
        capture_output=True, timeout=120,
    )  # fmt: skip
    assert shot.exists() and shot.stat().st_size > 20_000


def test_validation_lines_get_a_chart_per_category(tmp_path):
    run = write_training_run(tmp_path / "run")
    assert "No validation points" in training_report(run)
    lines = [{"round": r, "step": r, "kind": "validation", "validation/average": 0.25 * r, "validation/average_ci95": [0.0, 0.9],
              "validation/categories": {"base": {"success_rate": 0.5, "ci95": [0.1, 0.9], "episodes": 4}}} for r in (0, 2, 4)]  # fmt: skip
    with open(run / "metrics.jsonl", "a") as handle:
        handle.writelines(json.dumps(line) + "\n" for line in lines)
    page = training_report(run)
    section = page.split("<h2>Validation</h2>")[1].split("<h2>")[0]
    assert "No validation points" not in page and section.count('alt="validation"') == 1
    assert page.count("<h2>Success over training</h2>") == 1 and "4 rounds" in page  # validation lines are not rounds
