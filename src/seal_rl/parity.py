"""Parity of ``seal eval --policy bfcl-result:`` with the official ``bfcl evaluate``.

:func:`official_verdict` is the official evaluation of one multi-turn result entry:
``_evaluate_single_multi_turn_entry`` of ``bfcl_eval/eval_checker/eval_runner.py`` (pinned
``bfcl-eval==2026.3.23``), whose module imports every vendor SDK and so cannot be imported here.
Its lines are restated in :data:`OFFICIAL_LINES` (the test checks them against the installed
source) and run with the official decoders: ``convert_to_function_call`` and
``default_decode_execute_prompting`` from ``bfcl_eval.model_handler.utils`` (imported), and
``QwenFCHandler.decode_execute`` (restated in :data:`OFFICIAL_QWEN_FC_LINES`: its module needs
the ``overrides`` package).

:func:`result_entries` writes result entries the way models fail: perturbed ground truth
(:func:`seal_rl.differential.perturbed_steps`), the faulty oracle (:mod:`seal_rl.faults`) and
hostile steps (:data:`HOSTILE_STEPS`). Two things are never generated, because the official side
would misbehave on them rather than judge them: text of the form ``name(`` inside string
arguments (the official executor prefixes it with an instance name, see
:mod:`seal_rl.differential`), and anything the official decoders ``eval`` (arithmetic, lambdas,
:data:`seal_rl.protocol.DECLINED`). Names are never Python builtins, since the official executor
``eval`` s call strings.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from typing import Any

from seal_rl.bfcl import import_bfcl
from seal_rl.differential import official_checker, perturbed_steps
from seal_rl.faults import oracle_transcript
from seal_rl.tasks import Task
from seal_rl.tools import ToolCall, get_format, python_call_string
from seal_rl.verify import ground_truth_calls

DECODERS = ("fc", "hermes", "pythonic")

OFFICIAL_LINES = '''
    if type(model_result_list) != list:
        return {
...
    if len(model_result_list) != len(ground_truth_list):
        return {
...
    multi_turn_model_result_list_decoded: list[list[list[str]]] = []
    for single_turn_model_result_list in model_result_list:
        single_turn_model_result_list_decoded = []
        for model_result_item in single_turn_model_result_list:
            try:
                decoded_result: list[str] = handler.decode_execute(
                    model_result_item, has_tool_call_tag=False
                )
                if is_empty_execute_response(decoded_result):
                    continue
                single_turn_model_result_list_decoded.append(decoded_result)
            except Exception as e:
                continue
        multi_turn_model_result_list_decoded.append(single_turn_model_result_list_decoded)
    accuracy_checker_result = multi_turn_checker(
        multi_turn_model_result_list_decoded,
        ground_truth_list,
        prompt_entry,
        test_category,
        model_name,
    )
'''
"""The lines of ``_evaluate_single_multi_turn_entry`` that decide validity, in order (``...``: the
error records it returns and comments, left out)."""

OFFICIAL_QWEN_FC_LINES = '''
    def decode_execute(self, result, has_tool_call_tag):
        tool_calls = self._extract_tool_calls(result)
        if type(tool_calls) != list or any(type(item) != dict for item in tool_calls):
            raise ValueError(f"Model did not return a list of function calls: {result}")
        decoded_result = []
        for item in tool_calls:
            if type(item) == str:
                item = eval(item)
            decoded_result.append({item["name"]: item["arguments"]})
        return convert_to_function_call(decoded_result)
...
    def _extract_tool_calls(input_string):
        pattern = r"<tool_call>\\n(.*?)\\n</tool_call>"
        matches = re.findall(pattern, input_string, re.DOTALL)
        result = []
        for match in matches:
            try:
                match = json.loads(match)
                result.append(match)
            except Exception as e:
                pass
        return result
'''
"""``QwenFCHandler.decode_execute`` and ``_extract_tool_calls`` of
``bfcl_eval/model_handler/local_inference/qwen_fc.py``."""


def _qwen_fc_decode_execute(result: str) -> list[str]:
    """:data:`OFFICIAL_QWEN_FC_LINES`, run (``eval(item)`` is unreachable: every item is a dict)."""
    utils = import_bfcl("model_handler.utils")
    tool_calls = []
    for match in re.findall(r"<tool_call>\n(.*?)\n</tool_call>", result, re.DOTALL):
        try:
            tool_calls.append(json.loads(match))
        except Exception:
            pass
    if type(tool_calls) != list or any(type(item) != dict for item in tool_calls):  # noqa: E721 (restated)
        raise ValueError(f"Model did not return a list of function calls: {result}")
    return utils.convert_to_function_call([{item["name"]: item["arguments"]} for item in tool_calls])


def official_decoder(decoder: str):
    """The official ``decode_execute`` of the handlers that write ``decoder``-shaped steps."""
    utils = import_bfcl("model_handler.utils")
    return {
        "fc": utils.convert_to_function_call,
        "hermes": _qwen_fc_decode_execute,
        "pythonic": utils.default_decode_execute_prompting,
    }[decoder]


def official_verdict(task: Task, result: Any, decoder: str) -> dict[str, Any]:
    """The official evaluation of one entry's ``result`` (:data:`OFFICIAL_LINES`):
    ``{"valid": bool, "error_type": ...}``."""
    if type(result) != list:  # noqa: E721 (restated)
        return {"valid": False, "error_type": "multi_turn:inference_error"}
    if len(result) != task.num_turns:
        return {"valid": False, "error_type": "multi_turn:force_terminated"}
    utils = import_bfcl("eval_checker.multi_turn_eval.multi_turn_utils")
    decode_execute = official_decoder(decoder)
    decoded = []
    for turn in result:
        steps = []
        for item in turn:
            try:
                calls = decode_execute(item)
                if utils.is_empty_execute_response(calls):
                    continue
                steps.append(calls)
            except Exception:
                continue
        decoded.append(steps)
    return official_checker(task, decoded)


# -- result entries ---------------------------------------------------------------------------

_UNKNOWN_NAMES = ("list_files", "change_directory", "send_mail", "get_weather", "foo_bar")
HOSTILE_STEPS: dict[str, tuple[Any, ...]] = {
    "hermes": (
        '<tool_call>{"name": "ls", "arguments": {}}</tool_call>',  # no newlines: not a block
        "<tool_call>\n[1, 2]\n</tool_call>",
        '<tool_call>\n{"name": "ls"}\n</tool_call>',
        '<tool_call>\n{"arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "cd", "arguments": "{\\"folder\\": "}\n</tool_call>',
        '<tool_call>\n{"name": "cd", "arguments": "[1]"}\n</tool_call>',
        '<tool_call>\n{"name": ["ls"], "arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": 5, "arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "cd x", "arguments": {}}\n</tool_call>',
        '<tool_call>\n{"name": "ls", "arguments": {"class": 1}}\n</tool_call>',
        '<tool_call>\n{"name": "ls", "arguments": {"a": NaN}}\n</tool_call>',
        '<tool_call>\n{"name": "pwd", "arguments": {}}\n</tool_call>\n<tool_call>\n{oops}\n</tool_call>',
        "<tool_call>\n<tool_call>\n{\"name\": \"pwd\", \"arguments\": {}}\n</tool_call>\n</tool_call>",
        "I cannot do that. " * 200,
        "",
        "\u202e\u0000\ufeff emoji \U0001f600 text",
    ),
    "fc": (
        [{"cd": '{"folder": '}],
        ["not an object"],
        [{"ls": "[1]"}],
        [{"pwd": "{}", "ls": "{}"}],
        [{"ls": {"a": float("nan")}}],
        [{"cd x": "{}"}],
        [{"ls": '{"class": 1}'}],
        [{"ls": 7}],
        [],
        [[]],
    ),
    "pythonic": (
        "[cd(folder='x')",
        "cd(folder='document')",
        "[1, 2]",
        "[cd(folder=document)]",
        "[ls(a=-5)]",
        "[ls(a=(1, 2))]",
        "[ls(**{'a': 1})]",
        "[cd(folder='a'), 5]",
        "`[pwd()]`",
        "'[pwd()]'",
        "[pwd(), ls(a=[1, {'k': 'v'}])]",
        "[foo.bar.ls()]",
        "[cd(folder=not_defined_name)]",
        "Sorry, I cannot help with that.",
        "",
    ),
}
"""Steps no well-behaved model writes: malformed blocks, wrong shapes, NaN, unknown and
non-identifier names, Python keywords as argument names, junk text."""


def render_step(calls: Sequence[ToolCall], decoder: str, rng: random.Random) -> Any:
    """One step's calls as a model of that kind writes them."""
    if decoder == "fc":
        return [{c.name: json.dumps(c.arguments) if rng.random() < 0.8 else c.arguments} for c in calls]
    if decoder == "hermes":
        return get_format("hermes").render(list(calls))
    return "[" + ", ".join(python_call_string(c) for c in calls) + "]"


def _text_answer(decoder: str) -> Any:
    return [] if decoder == "fc" else "Done."


def _oracle_turns(task: Task, decoder: str, rng: random.Random) -> list[list[Any]]:
    """The faulty oracle's messages, split into turns where it answers in text."""
    fmt = get_format("hermes" if decoder == "fc" else decoder)
    messages, _ = oracle_transcript(task, ground_truth_calls(task), fmt, 0.5, rng.randrange(10**6))
    turns: list[list[Any]] = [[]]
    for text in messages:
        parsed = fmt.parse(text)
        if decoder == "fc":
            turns[-1].append([{c.name: json.dumps(c.arguments)} for c in parsed.calls] if parsed.error is None else ["?"])
        else:
            turns[-1].append(text)
        if not parsed.calls and parsed.error is None:
            turns.append([])
    return [turn for turn in turns if turn][: task.num_turns]


def _perturbed_turns(task: Task, decoder: str, rng: random.Random) -> list[list[Any]]:
    steps = perturbed_steps(task, ground_truth_calls(task), rng)
    return [[render_step(step, decoder, rng) for step in turn if step] + [_text_answer(decoder)] for turn in steps]


def _hostile(turns: list[list[Any]], task: Task, decoder: str, rng: random.Random) -> list[list[Any]]:
    """Hostile steps dropped into random places, held-out and unknown tools called early, and
    now and then a cut-short or empty turn."""
    turns = [list(turn) for turn in turns]
    for _ in range(rng.randint(1, 4)):
        turn = rng.choice(turns)
        kind = rng.random()
        if kind < 0.6:
            step = rng.choice(HOSTILE_STEPS[decoder])
        else:
            held = [doc["name"] for docs in task.held_out.values() for doc in docs]
            name = rng.choice(held + list(_UNKNOWN_NAMES)) if held and kind < 0.8 else rng.choice(_UNKNOWN_NAMES)
            step = render_step([ToolCall(name, {})], decoder, rng)
        turn.insert(rng.randrange(len(turn) + 1), step)
    roll = rng.random()
    if roll < 0.1:
        turns = turns[: rng.randrange(1, len(turns) + 1)]  # force-terminated: fewer turns
    elif roll < 0.15:
        turns[rng.randrange(len(turns))] = []
    return turns


def result_entries(tasks: Sequence[Task], decoder: str, seed: int = 0) -> list[dict[str, Any]]:
    """One BFCL result entry per task (``{"id", "result"}``): perturbed ground truth, the faulty
    oracle or either with hostile steps, chosen at random; one entry in 25 an inference error."""
    entries = []
    for task in tasks:
        rng = random.Random(f"{seed}:{decoder}:{task.id}")
        roll = rng.random()
        if roll < 0.04:
            entries.append({"id": task.id, "result": "Error during inference: connection reset"})
            continue
        turns = _oracle_turns(task, decoder, rng) if roll < 0.35 else _perturbed_turns(task, decoder, rng)
        if rng.random() < 0.5:
            turns = _hostile(turns, task, decoder, rng)
        entries.append({"id": task.id, "result": turns})
    return entries


def json_line(entry: dict[str, Any]) -> str:
    """A result line as ``bfcl generate`` writes it (``json.dumps``; NaN stays ``NaN``)."""
    return json.dumps(entry) + "\n"
