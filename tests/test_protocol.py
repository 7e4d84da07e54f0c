"""The ``bfcl`` protocol against the official ``bfcl generate`` loop and decoders (pinned bfcl-eval)."""

from __future__ import annotations

import ast
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seal_rl.bfcl import import_bfcl
from seal_rl.env import BfclEnv, EnvConfig
from seal_rl.errors import SealError
from seal_rl.parity import official_decoder
from seal_rl.protocol import MAXIMUM_STEP_LIMIT, decode_fc, decode_hermes, decode_pythonic
from seal_rl.tools import ToolCall, get_format
from seal_rl.verify import ground_truth_calls
from tests.helpers import ground_truth_steps, play_steps

HERMES = get_format("hermes")


def test_step_limit_is_bfcls_constant_and_force_terminates_after_the_21st_executing_step(task_set):
    assert MAXIMUM_STEP_LIMIT == import_bfcl("constants.default_prompts").MAXIMUM_STEP_LIMIT
    task = task_set.get("multi_turn_base_0")
    env = BfclEnv(EnvConfig(protocol="bfcl"))
    env.reset(task)
    for step in range(MAXIMUM_STEP_LIMIT + 1):  # official: count += 1 after executing; quit when count > 20
        assert not env.done
        _, reward, terminated, truncated, info = env.step(HERMES.render([ToolCall("pwd")]))
    assert env.done and truncated and not terminated and env.end_reason == "max_steps_per_turn"
    assert reward == 0.0 and env.turns_reached == 1 < task.num_turns  # the official check fails on the turn count
    assert env.model_calls == 21  # the seal protocol would have stopped at 20 messages per episode
    seal = BfclEnv(EnvConfig(protocol="seal"))
    seal.reset(task)
    while not seal.done:
        seal.step(HERMES.render([ToolCall("pwd")]))
    assert seal.model_calls == 20 and seal.end_reason == "max_model_calls"


def test_the_step_limit_counts_per_turn_not_per_episode(task_set):
    task = task_set.get("multi_turn_base_0")
    env = BfclEnv(EnvConfig(protocol="bfcl"))
    env.reset(task)
    for _ in range(task.num_turns - 1):
        for _ in range(MAXIMUM_STEP_LIMIT):
            env.step(HERMES.render([ToolCall("pwd")]))
        env.step("Done.")
    assert not env.done and env.model_calls == (MAXIMUM_STEP_LIMIT + 1) * (task.num_turns - 1)


@pytest.mark.parametrize("message", ["<tool_call>\n{broken\n</tool_call>", "plain text", '<tool_call>\n{"name": "ls"}\n</tool_call>'])
def test_an_undecodable_or_empty_message_ends_the_turn_with_no_observation(task_set, message):
    task = task_set.get("multi_turn_base_0")
    env = BfclEnv(EnvConfig(protocol="bfcl"))
    env.reset(task)
    observation, _, _, _, info = env.step(message)
    assert info["event"] == "next_turn" and env.turn == 1
    assert observation == [dict(m) for m in task.questions[1]]  # the next question, no [ERROR] message
    seal = BfclEnv(EnvConfig(protocol="seal"))
    seal.reset(task)
    observation, *_ = seal.step(message)
    if message.startswith("<tool_call>\n{broken"):
        assert observation[0]["content"].startswith("[ERROR] Invalid tool call format") and seal.turn == 0


def test_held_out_and_unknown_tools_are_executed_by_name_like_the_official_executor(task_set):
    task = task_set.get("multi_turn_miss_func_49")  # its ground truth calls `tail` before it is offered
    steps = ground_truth_steps(ground_truth_calls(task))
    assert play_steps(BfclEnv(EnvConfig(protocol="bfcl")), task, steps).verdict.reward == 1.0
    assert play_steps(BfclEnv(EnvConfig(protocol="seal")), task, steps).verdict.reward == 0.0
    env = BfclEnv(EnvConfig(protocol="bfcl"))
    env.reset(task)
    observation, *_ = env.step(HERMES.render([ToolCall("no_such_tool")]))
    assert "Error during execution: name 'no_such_tool' is not defined" in observation[0]["content"]


def test_the_miss_func_reveal_is_bfcls_message_for_every_miss_func_task(task_set):
    """Our reveal vs what ``inference_multi_turn_prompting`` builds from the official data (after
    ``populate_test_cases_with_predefined_functions``), for all 200 miss_func tasks."""
    prompts = import_bfcl("constants.default_prompts")
    entries = {e["id"]: e for e in import_bfcl("utils").load_dataset_entry("multi_turn_miss_func")}
    assert len(entries) == 200
    for task_id, entry in entries.items():
        task = task_set.get(task_id)
        env = BfclEnv(EnvConfig(protocol="bfcl"))
        env.reset(task)
        (turn,) = [int(t) for t in entry["missed_function"]]
        while env.turn < turn:
            observation, *_ = env.step("I will answer in text.")
        expected = prompts.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(functions=entry["missed_function"][str(turn)])
        assert observation == [{"role": "user", "content": expected}], task_id
        chat = BfclEnv(EnvConfig(protocol="bfcl", prompt_mode="chat_template"))
        chat.reset(task)
        while chat.turn < turn:
            observation, _, _, _, info = chat.step("I will answer in text.")
        assert observation == [{"role": "user", "content": prompts.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC}]
        assert {t["function"]["name"] for t in info["tools"]} >= {d["name"] for d in entry["missed_function"][str(turn)]}


def test_end_turn_replays_recorded_boundaries(task_set):
    task = task_set.get("multi_turn_base_0")
    env = BfclEnv(EnvConfig(protocol="bfcl"))
    env.reset(task)
    observation, _, _, _, info = env.step("not a call", end_turn=False)
    assert (observation, info["event"], env.turn) == ([], "skipped", 0)
    observation, _, _, _, info = env.step(HERMES.render([ToolCall("pwd")]), end_turn=True)
    assert env.turn == 1 and "<tool_response>" in observation[0]["content"] and observation[-1] == dict(task.questions[1][0])
    for _ in range(MAXIMUM_STEP_LIMIT + 5):  # the recording's own step limit applies, not ours
        env.step(HERMES.render([ToolCall("pwd")]), end_turn=False)
    assert not env.done
    with pytest.raises(ValueError):
        seal = BfclEnv()
        seal.reset(task)
        seal.step("x", end_turn=True)


def test_json_format_and_unknown_protocols_are_refused():
    with pytest.raises(SealError, match="hermes and pythonic"):
        EnvConfig(protocol="bfcl", call_format="json", prompt_mode="chat_template")
    with pytest.raises(SealError, match="Unknown protocol"):
        EnvConfig(protocol="bfcl-v3")


# -- decoders vs the official decode_execute ----------------------------------------------------

def _official_strings(calls: list[ToolCall]) -> list[str]:
    """``convert_to_function_call``'s rendering of decoded calls."""
    return [f"{c.name}({','.join(f'{k}={v!r}' for k, v in c.arguments.items())})" for c in calls]


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
_names = st.sampled_from(["ls", "cd", "mkdir", "foo_bar", "cd x", "", "class"]) | st.integers(0, 9) | st.none()
_block_bodies = st.one_of(
    st.builds(lambda n, a: json.dumps({"name": n, "arguments": a}), _names, st.dictionaries(st.sampled_from(["folder", "a", "class", "x y"]), _json_values, max_size=3)),
    st.builds(lambda n, a: json.dumps({"name": n, "arguments": json.dumps(a)}), _names, _json_values),
    st.builds(lambda n, a: json.dumps({"name": n, "arguments": a}), _names, _json_values),
    st.builds(json.dumps, _json_values),
    st.text(max_size=20),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["", "text ", "\n"]), _block_bodies, st.booleans()), max_size=4), st.text(max_size=10))
def test_decode_hermes_agrees_with_the_official_qwen_fc_decoder(blocks, tail):
    text = "".join(f"{pre}<tool_call>\n{body}\n</tool_call>" if closed else f"{pre}<tool_call>\n{body}" for pre, body, closed in blocks) + tail
    ours = decode_hermes(text)
    try:
        official = official_decoder("hermes")(text)
    except Exception:
        assert ours.error is not None
        return
    assert ours.error is None and _official_strings(list(ours.calls)) == official


@settings(max_examples=300, deadline=None)
@given(st.one_of(
    st.lists(st.dictionaries(st.sampled_from(["ls", "cd", "x y"]), st.one_of(_json_values, _json_values.map(json.dumps), st.text(max_size=6)), max_size=2), max_size=3),
    st.lists(_json_values, max_size=2),
))
def test_decode_fc_agrees_with_the_official_convert_to_function_call(step):
    ours = decode_fc(step)
    try:
        official = official_decoder("fc")(step)
    except Exception:
        assert ours.error is not None
        return
    assert ours.error is None and _official_strings(list(ours.calls)) == official


_py_values = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000) | st.floats(allow_nan=False, allow_infinity=False) | st.text(alphabet="ab '\"\\é", max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner) | st.dictionaries(st.text(alphabet="kv'", max_size=3), inner, max_size=2),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["ls", "cd", "a.b.c"]), st.dictionaries(st.sampled_from(["folder", "a", "b"]), _py_values, max_size=3)), max_size=3),
       st.sampled_from(["{}", "[{}]", "`[{}]`", "'[{}]'", "{} trailing", "[{}, 5]"]))
def test_decode_pythonic_agrees_with_the_official_prompting_decoder(calls, shape):
    text = shape.format(", ".join(f"{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})" for name, args in calls))
    ours = decode_pythonic(text)
    try:
        official = official_decoder("pythonic")(text)
    except Exception:
        assert ours.error is not None
        return
    if ours.error is not None:
        assert ours.error.startswith("declined"), ours.error  # a nested call or an unquotable key
        return
    parsed = [ast.parse(s, mode="eval").body for s in official]
    assert [".".join(reversed(_dotted(p.func))) for p in parsed] == [c.name for c in ours.calls]
    assert [{k.arg: ast.literal_eval(k.value) for k in p.keywords} for p in parsed] == [c.arguments for c in ours.calls]


def _dotted(node) -> list[str]:
    return [node.attr, *_dotted(node.value)] if isinstance(node, ast.Attribute) else [node.id]


def test_hermes_block_extraction_is_linear_on_hostile_input():
    text = "<tool_call>\n" * 20_000 + "x" * 100_000
    assert decode_hermes(text).calls == ()  # re.findall would be quadratic here
    assert re.findall(r"<tool_call>\n(.*?)\n</tool_call>", "<tool_call>\n1\n</tool_call>" * 3, re.DOTALL) == ["1"] * 3
