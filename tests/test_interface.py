import collections
import difflib
import json
import random
import re
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seal_rl.diagnose import Diagnosis, TurnLabel
from seal_rl.env import BfclEnv, EnvConfig
from seal_rl.errors import SealError
from seal_rl.faults import oracle_transcript
from seal_rl.interface import (
    ADDITIONAL_FUNCTIONS_PROMPT,
    ASK_USER,
    GUIDELINES,
    PAPER_NOTE,
    PAPER_EPISODES_PER_WINDOW,
    Interface,
    InterfaceConfig,
    InterfaceState,
    Rejection,
    ToolResult,
    auto_min_count,
    evolve,
)
from seal_rl.profile import CapabilityProfile, EpisodeLabels
from seal_rl.tools import SchemaViolation, ToolCall, ToolCatalog, get_format
from seal_rl.verify import ground_truth_calls

ALL_ON = InterfaceState(
    preset="seal", schema_tools=("*",), schema_types=True, format_note=True, parse_hints=True,
    tool_hints=True, guidelines=tuple(GUIDELINES), tool_list=True, pressure=("state_mismatch",), round=3,
)  # fmt: skip
STATES = [
    InterfaceState.initial("paper"),
    ALL_ON,
    InterfaceState(preset="seal", schema_tools=("cd", "mv")),
    InterfaceState(preset="seal", parse_hints=True),
    InterfaceState(preset="seal", tool_hints=True),
    InterfaceState(preset="seal", guidelines=("cautious_call",), tool_list=True),
]


def _doc(task_set, name):
    return next(d for t in task_set for d in t.all_functions() if d["name"] == name)


# -- φ_schema ---------------------------------------------------------------------------------


def test_schema_annotations_mark_required_allowed_values_and_types(task_set):
    doc = _doc(task_set, "adjustClimateControl")
    shown = Interface(state=ALL_ON).annotate(doc)
    props, original = shown["parameters"]["properties"], doc["parameters"]["properties"]
    assert props["temperature"]["description"] == original["temperature"]["description"] + " [required] Type: float."
    assert props["unit"]["description"].endswith(" Allowed values: celsius, fahrenheit Type: string.")
    paper = Interface(state=InterfaceState.initial("paper")).annotate(doc)["parameters"]["properties"]
    assert paper["unit"]["description"] == original["unit"]["description"] + " Allowed values: celsius, fahrenheit"
    only_cd = Interface(state=InterfaceState(preset="seal", schema_tools=("cd",)))
    assert only_cd.annotate(doc) is doc
    assert "[required]" in json.dumps(only_cd.annotate(_doc(task_set, "cd")))
    assert doc == _doc(task_set, "adjustClimateControl")  # the task's doc is untouched


@pytest.mark.parametrize("prompt_mode", ["bfcl_qwen_fc", "chat_template"])
def test_held_out_functions_are_annotated_like_the_others(task_set, prompt_mode):
    task = task_set.get("multi_turn_miss_func_0")
    fmt = "hermes"
    env = BfclEnv(EnvConfig(prompt_mode=prompt_mode), Interface(prompt_mode, ALL_ON, call_format=fmt))
    env.reset(task)
    (turn, docs), = task.held_out.items()
    while env.turn < turn:
        observation, *_, info = env.step("ok")
    listing, restated = observation[0]["content"].split("\n" + ADDITIONAL_FUNCTIONS_PROMPT)
    assert "[required]" in listing
    revealed = next(s for s in info["tools"] if s["function"]["name"] == docs[0]["name"])
    assert "[required]" in json.dumps(revealed)
    # φ_cap's tool list, fixed in the system prompt at reset, is restated with the revealed tools.
    names = [spec["function"]["name"] for spec in info["tools"]]
    assert restated == "\n\nAvailable tools: " + ", ".join(names) + "." and docs[0]["name"] in names
    without = Interface(prompt_mode, replace(ALL_ON, tool_list=False)).reveal(docs, task.all_functions())
    assert without[0]["content"].endswith("\n" + ADDITIONAL_FUNCTIONS_PROMPT)


def test_the_format_note_names_the_required_marker_only_when_it_is_shown(task_set):
    docs = list(task_set.get("multi_turn_base_0").functions)
    notes = {tools: Interface(state=InterfaceState(preset="seal", schema_tools=tools, format_note=True)).system(docs)
             for tools in ((), ("*",), ("no_such_tool",))}  # fmt: skip
    assert "supply every required parameter" in notes[()][0]["content"]
    assert "supply every [required] parameter" in notes[("*",)][0]["content"]
    assert "supply every required parameter" in notes[("no_such_tool",)][0]["content"]
    assert "[required]" not in notes[()][0]["content"]


# -- φ_err ------------------------------------------------------------------------------------


def test_parse_hints_follow_a_rejection():
    docs = [{"name": "cd", "parameters": {"properties": {}, "required": []}}]
    hinted = Interface(state=InterfaceState(preset="seal", parse_hints=True)).rejection(Rejection("bad", ("rm_rf",)), docs)
    base = Interface().rejection(Rejection("bad", ("rm_rf",)), docs)
    assert base == [{"role": "user", "content": "[ERROR] Invalid tool call format: bad"}]
    content = hinted[0]["content"]
    assert content.startswith(base[0]["content"] + "\n[Hint] Write each tool call exactly as <tool_call>")
    assert "[Hint] Available tools: cd." in content and "answer in plain text" in content


def _hints(result, available):
    on = Interface(prompt_mode="chat_template", state=InterfaceState(preset="seal", tool_hints=True))
    return on.tool_results([result], available)[0]["content"][len(result.output):]


def test_tool_hints_name_the_fix_never_the_answer(task_set):
    available = [_doc(task_set, n) for n in ("cd", "ls", "pwd", "displayCarStatus", "authenticate_travel", "book_flight")]
    missing = ToolResult("cd", "Error during execution: GorillaFileSystem.cd() missing 1 required positional argument: 'folder'",
                         {}, "GorillaFileSystem.cd() missing 1 required positional argument: 'folder'")  # fmt: skip
    assert _hints(missing, available) == ("\n[ToolHint] cd needs the argument(s) folder; its parameters are: folder "
                                          "(required). Supply them and retry; if a value you need is not known, ask the user.")
    unknown = ToolResult("cd", "Error during execution: x", {"dir": "a"}, "got an unexpected keyword argument 'dir'",
                         (SchemaViolation("unknown_argument", "dir", "unknown argument 'dir'"),))  # fmt: skip
    assert "cd has no parameter dir" in _hints(unknown, available)
    enum = ToolResult("displayCarStatus", '{"error": "Invalid option"}', {"option": "oil"}, "Invalid option",
                      (SchemaViolation("not_in_enum", "option", "..."),))  # fmt: skip
    assert "must be one of: fuel, battery, doors" in _hints(enum, available)
    not_found = ToolResult("cd", '{"error": "cd: \'x\': No such file or directory"}', {"folder": "x"}, "cd: 'x': No such file or directory")
    assert "inspect the current state first (e.g. with ls, pwd)" in _hints(not_found, available)
    auth = ToolResult("book_flight", '{"error": "Token not valid"}', {}, "Token not valid")
    assert "Authenticate first (e.g. with authenticate_travel)" in _hints(auth, available)
    raised = ToolResult("pwd", "Error during execution: list index out of range", {}, "list index out of range")
    assert "The call to pwd failed" in _hints(raised, available)
    assert _hints(ToolResult("pwd", '{"current_working_directory": "/"}'), available) == ""


# -- φ_cap ------------------------------------------------------------------------------------


def test_guidelines_and_notes_extend_the_system_prompt(task_set):
    docs = list(task_set.get("multi_turn_base_0").functions)
    state = InterfaceState(preset="seal", guidelines=("cautious_call", "format"), tool_list=True)
    qwen = Interface(state=state).system(docs)[0]["content"]
    base = Interface().system(docs)[0]["content"]
    assert qwen.startswith(base)
    assert qwen[len(base):] == ("\n\n" + GUIDELINES["cautious_call"] + "\n\n" + GUIDELINES["format"]
                                + "\n\nAvailable tools: " + ", ".join(d["name"] for d in docs) + ".")  # fmt: skip
    chat = Interface("chat_template", state).system(docs)
    assert chat[0]["role"] == "system" and chat[0]["content"].startswith(GUIDELINES["cautious_call"])
    assert Interface("chat_template").system(docs) == []
    paper = Interface(state=InterfaceState.initial("paper")).system(docs)[0]["content"]
    assert paper.endswith("\n\n" + PAPER_NOTE)


# -- evaluation is the original protocol --------------------------------------------------------


def _observations(env, task, messages):
    seen, tools = [], []
    observation, info = env.reset(task)
    seen.append(observation)
    tools.append(info["tools"])
    for message in messages:
        if env.done:
            break
        observation, *_, info = env.step(message)
        seen.append(observation)
        tools.append(info.get("tools"))
    return seen, tools, env.messages


@pytest.mark.parametrize("prompt_mode", ["bfcl_qwen_fc", "chat_template"])
def test_eval_mode_is_byte_identical_to_vanilla_for_every_task_preset_and_state(task_set, prompt_mode):
    config = EnvConfig(prompt_mode=prompt_mode)
    vanilla = BfclEnv(config)
    evaluated = [BfclEnv(config, Interface(prompt_mode, state, training=False)) for state in STATES]
    fmt = get_format("hermes")
    for i, task in enumerate(task_set):
        messages = []
        if i % 8 == 0:  # full faulty episodes on a tenth of the tasks, resets on all
            messages, _ = oracle_transcript(task, ground_truth_calls(task), fmt, fault_rate=0.5, seed=i)
        expected = _observations(vanilla, task, messages)
        for env in evaluated:
            assert _observations(env, task, messages) == expected, (task.id, env.interface.state)


@settings(max_examples=40, deadline=None)
@given(
    state=st.builds(
        InterfaceState,
        preset=st.sampled_from(["vanilla", "paper", "seal"]),
        schema_tools=st.sampled_from([(), ("*",), ("cd",), ("cd", "mv", "ls")]),
        schema_types=st.booleans(), format_note=st.booleans(), parse_hints=st.booleans(), tool_hints=st.booleans(),
        guidelines=st.lists(st.sampled_from(sorted(GUIDELINES)), unique=True).map(tuple), tool_list=st.booleans(),
    )
)  # fmt: skip
def test_any_state_in_eval_mode_renders_the_base_interface(task_set, state):
    task = task_set.get("multi_turn_miss_func_0")
    messages, _ = oracle_transcript(task, ground_truth_calls(task), get_format("hermes"), 0.6, seed=1)
    base = _observations(BfclEnv(), task, messages)
    assert _observations(BfclEnv(None, Interface(state=state, training=False)), task, messages) == base


# -- no leakage -------------------------------------------------------------------------------
#
# Everything the interface adds to the base rendering (φ_schema annotations, system notes, [Hint]
# and [ToolHint] lines, restated tool lists) is compared with what the agent had been shown *up to
# that step* in the base rendering: tool docs, system block, user turns and tool outputs so far.
# Forbidden in an added text: (a) a held-out tool's name before its reveal; (b) a ground-truth
# argument value not shown yet; (c) a later user turn's text or its distinctive tokens.

_TOKEN = re.compile(r"\w+|\W")
_DISTINCTIVE = re.compile(r"[\w.\-/@]*[\w](?:[\w.\-/@]*[\w])?")
_QUOTED = re.compile(r"'([^'\n]{3,})'|\"([^\"\n]{3,})\"")
CATALOG = ToolCatalog()
LEAK_STATES = [
    InterfaceState.initial("vanilla"), InterfaceState.initial("seal"), *STATES,
    InterfaceState(preset="seal", format_note=True, parse_hints=True, guidelines=("cautious_call",)),
]  # fmt: skip


def _appended(base, shown):
    """The texts ``shown`` appends to the strings of the JSON value ``base``; fails on any other change."""
    if isinstance(base, str):
        assert isinstance(shown, str) and shown.startswith(base), (base, shown)
        return [shown[len(base):]] if shown != base else []
    if isinstance(base, (dict, list)):
        assert type(shown) is type(base) and len(shown) == len(base), (base, shown)
        if isinstance(base, dict):
            assert list(shown) == list(base), (base, shown)
            return [text for key in base for text in _appended(base[key], shown[key])]
        return [text for a, b in zip(base, shown) for text in _appended(a, b)]
    assert shown == base, (base, shown)
    return []


def _json(line):
    try:
        return json.loads(line)
    except ValueError:
        return None


def _inserted(base, shown):
    """The runs of text ``shown`` inserts into ``base``; fails if the interface changed base text.

    Lines first; a changed line that is JSON (a tool doc) is compared value by value, any other by
    tokens."""
    if shown == base:
        return []
    if shown.startswith(base):
        return [shown[len(base):]]
    runs = []
    base_lines, shown_lines = base.split("\n"), shown.split("\n")
    lines = difflib.SequenceMatcher(None, base_lines, shown_lines, autojunk=False)
    for op, i1, i2, j1, j2 in lines.get_opcodes():
        assert op in ("equal", "insert", "replace"), f"base text removed: {base_lines[i1:i2]!r}"
        if op == "insert":
            runs.append("\n".join(shown_lines[j1:j2]))
        elif op == "replace":
            pairs = list(zip(base_lines[i1:i2], shown_lines[j1:j2]))
            if i2 - i1 != j2 - j1 or any(_json(a) is None or _json(b) is None for a, b in pairs):
                pairs = [("\n".join(base_lines[i1:i2]), "\n".join(shown_lines[j1:j2]))]
            for a, b in pairs:
                if _json(a) is not None and _json(b) is not None:
                    runs += _appended(json.loads(a), json.loads(b))
                    continue
                a, b = _TOKEN.findall(a), _TOKEN.findall(b)
                for op2, k1, k2, m1, m2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
                    assert op2 in ("equal", "insert"), f"base text changed: {''.join(a[k1:k2])!r} -> {''.join(b[m1:m2])!r}"
                    if op2 == "insert":
                        runs.append("".join(b[m1:m2]))
    return runs


def _added_texts(base_observation, shown_observation, base_tools, shown_tools):
    """Every text the interface added to one step's observation (and to the tool specs, if given)."""
    added = []
    if len(shown_observation) == len(base_observation) + 1 and shown_observation[0]["role"] == "system":
        added.append(shown_observation[0]["content"])  # chat_template mode: a system message of notes only
        shown_observation = shown_observation[1:]
    assert [m["role"] for m in shown_observation] == [m["role"] for m in base_observation]
    for base, shown in zip(base_observation, shown_observation):
        added += _inserted(base["content"], shown["content"])
    if shown_tools is not None:
        added += _appended(base_tools, shown_tools)
    return [text for text in added if text.strip()]


def _ground_truth_values(task):
    """Argument values of the task's ground-truth calls (strings and numbers of 3+ characters)."""
    values = set()
    for turn in ground_truth_calls(task):
        for call in turn:
            stack = list(call.arguments.values())
            while stack:
                value = stack.pop()
                if isinstance(value, list):
                    stack.extend(value)
                elif isinstance(value, dict):
                    stack.extend(value.values())
                elif isinstance(value, str) and len(value) >= 3 or isinstance(value, (int, float)) and len(str(value)) >= 3:
                    values.add(str(value))
    return values


def _distinctive_tokens(text):
    """Tokens of a user text that name instances: quoted spans and tokens with a digit, ``.``, ``_``,
    ``/``, ``@``, ``-`` or an inner capital (file names, ids, amounts, places)."""
    tokens = {a or b for a, b in _QUOTED.findall(text)}
    for token in _DISTINCTIVE.findall(text):
        if len(token) >= 3 and (re.search(r"[\d._/@\-]", token) or re.search(r".[A-Z]", token)):
            tokens.add(token)
    return tokens


def _occurs(token, text):
    return re.search(r"(?<!\w)" + re.escape(token) + r"(?!\w)", text) is not None


class _LeakCheck:
    """Plays a transcript under the base interface and under ``state`` in lockstep, checking each
    step's added texts against what the base rendering had shown so far."""

    def __init__(self):
        self.added = 0
        self.kinds = collections.Counter()  # added texts by what they contain
        self.checked = collections.Counter()  # (added text, forbidden item) pairs compared, by kind
        self.names_checked = set()  # tasks whose held-out names were compared with some added text
        self.leaks = []

    def run(self, task, messages, prompt_mode, state, base_steps):
        interface = Interface(prompt_mode, state, catalog=CATALOG)
        env = BfclEnv(EnvConfig(prompt_mode=prompt_mode), interface, catalog=CATALOG)
        values = _ground_truth_values(task)
        held_out = {doc["name"]: turn for turn, docs in task.held_out.items() for doc in docs}
        user_turns = [" ".join(m["content"] for m in turn) for turn in task.questions]
        seen = ""
        observation, info = env.reset(task)
        steps = [(observation, info.get("tools"))]
        for message in messages:
            if env.done:
                break
            observation, *_, info = env.step(message)
            steps.append((observation, info.get("tools")))
        assert len(steps) == len(base_steps), task.id
        for (shown, shown_tools), (base, base_tools, turn) in zip(steps, base_steps):
            seen += "\x00".join(m["content"] for m in base) + "\x00"
            if base_tools is not None:
                seen += json.dumps(base_tools) + json.dumps(base_tools, ensure_ascii=False) + "\x00"
            names = {name for name, reveal in held_out.items() if reveal > turn}
            unshown = {value for value in values if value not in seen}
            later = [text for text in user_turns[turn + 1:] if text]
            tokens = {t for text in later for t in _distinctive_tokens(text) if t not in seen}
            reveal = any(m["content"].endswith(ADDITIONAL_FUNCTIONS_PROMPT) for m in base)
            for text in _added_texts(base, shown, base_tools, shown_tools):
                self.added += 1
                self.kinds.update(kind for kind in ("[Hint]", "[ToolHint]", "Available tools:", ASK_USER) if kind in text)
                self.kinds["reveal: Available tools:"] += reveal and "Available tools:" in text
                self.checked.update(names=len(names), values=len(unshown), tokens=len(tokens), turns=len(later))
                if names:
                    self.names_checked.add(task.id)
                found = ([f"held-out tool {n}" for n in names if _occurs(n, text)]
                         + [f"unshown value {v!r}" for v in unshown if v in text]
                         + [f"later user text {t!r}" for t in later if t in text]
                         + [f"later user token {t!r}" for t in tokens if _occurs(t, text)])  # fmt: skip
                if found:
                    self.leaks.append((task.id, prompt_mode, state.active_components, turn, found, text))


def _base_steps(task, messages, prompt_mode):
    """The base rendering of a transcript, step by step: (observation, tools if given, turn)."""
    env = BfclEnv(EnvConfig(prompt_mode=prompt_mode), catalog=CATALOG)
    observation, info = env.reset(task)
    steps = [(observation, info.get("tools"), env.turn)]
    for message in messages:
        if env.done:
            break
        observation, *_, info = env.step(message)
        steps.append((observation, info.get("tools"), env.turn))
    return steps


@pytest.mark.slow
def test_no_component_ever_shows_what_the_agent_has_not_been_shown_yet(task_set):
    """All-on state: every task with a faulty oracle (a fourth also in chat_template mode).
    Every other state, both prompt modes, the oracle and a faulty oracle: every 20th task (ten per
    category)."""
    fmt, check = get_format("hermes"), _LeakCheck()
    categories, miss_func = collections.Counter(), 0
    for i, task in enumerate(task_set):
        if task.category == "miss_func":
            assert task.held_out, task.id
            miss_func += 1
        faulty, _ = oracle_transcript(task, ground_truth_calls(task), fmt, fault_rate=0.5, seed=i)
        runs = [("bfcl_qwen_fc", faulty, [ALL_ON])] + ([("chat_template", faulty, [ALL_ON])] if i % 4 == 0 else [])
        if i % 20 == 0:
            categories[task.category] += 1
            clean, _ = oracle_transcript(task, ground_truth_calls(task), fmt)
            runs = [(mode, messages, LEAK_STATES) for mode in ("bfcl_qwen_fc", "chat_template") for messages in (clean, faulty)]
        for prompt_mode, messages, states in runs:
            base = _base_steps(task, messages, prompt_mode)
            for state in states:
                check.run(task, messages, prompt_mode, state, base)
    assert not check.leaks, f"{len(check.leaks)} leak(s):\n" + "\n".join(
        f"{task_id} {mode} {'+'.join(components)} turn {turn}: {'; '.join(found)} in {text!r}"
        for task_id, mode, components, turn, found, text in check.leaks[:8])  # fmt: skip
    # Not vacuous: many texts were checked, of every kind, against non-empty forbidden sets.
    assert miss_func == 200 and categories == {"base": 10, "miss_func": 10, "miss_param": 10, "long_context": 10}
    assert check.added > 50_000, check.added
    assert min(check.kinds.values()) > 100 and len(check.kinds) == 5, check.kinds
    assert min(check.checked[k] for k in ("names", "values", "tokens", "turns")) > 10_000, check.checked
    assert {t.id for t in task_set if t.category == "miss_func"} <= check.names_checked


def test_every_hint_that_suggests_a_retry_offers_asking_the_user(task_set):
    """A hint never pushes a call where the user must be asked; its text does not depend on
    whether the value is actually missing (miss_param) or not (base)."""
    fmt, interface = get_format("hermes"), Interface(state=ALL_ON)
    retries = 0
    for i, task in enumerate(list(task_set)[::10]):
        messages, _ = oracle_transcript(task, ground_truth_calls(task), fmt, fault_rate=1.0, seed=i)
        _, _, shown = _observations(BfclEnv(None, interface), task, messages)
        for message in shown:
            for line in message["content"].splitlines():
                if line.startswith(("[ToolHint]", "[Hint]")) and "retry" in line:
                    retries += 1
                    assert line.endswith(f"; {ASK_USER}."), line
    assert retries > 50


# -- evolve -----------------------------------------------------------------------------------


def _profile_with(rounds, window=1, with_pass=True):
    """rounds: list of {label: episodes}; each episode has that label (plus a 'pass' turn when
    with_pass); reward 0 for failing episodes."""
    profile = CapabilityProfile(window=window)
    for index, counts in enumerate(rounds, start=1):
        episodes = []
        for label, n in counts.items():
            for k in range(n):
                evidence = {"call": "cd"} if label == "argument_mismatch" else {}
                labels = (TurnLabel(0, label, evidence),) + ((TurnLabel(1, "pass", {}),) if with_pass else ())
                reward = 1.0 if label == "pass" else 0.0
                episodes.append(EpisodeLabels(f"t{label}{k}", "base", reward, Diagnosis(labels, 0, 0)))
        profile = profile.add_round(index, episodes)
    return profile


PAPER_SCALE = InterfaceConfig().resolved(PAPER_EPISODES_PER_WINDOW)  # min_count auto at 256 episodes a window


def test_pressure_switches_components_on_with_hysteresis():
    config = PAPER_SCALE
    state = InterfaceState.initial("seal")
    # 10 state_mismatch turns out of 100 countable (10%): on.
    on = evolve(state, _profile_with([{"state_mismatch": 10, "pass": 40}]), config)
    assert on.guidelines == ("state_aware",) and on.pressure == ("state_mismatch",) and on.round == 1
    # 8 of 100 (8%) is below prevalence_on but above prevalence_off: stays on because it was on.
    lower = _profile_with([{"state_mismatch": 8, "pass": 42}])
    assert evolve(on, lower, config).guidelines == ("state_aware",)
    assert evolve(state, lower, config).guidelines == ()
    # 4 of 100 (4%): off.
    assert evolve(on, _profile_with([{"state_mismatch": 4, "pass": 46}]), config).guidelines == ()


def test_pressure_needs_enough_turns_and_low_reward():
    config = PAPER_SCALE
    few = _profile_with([{"state_mismatch": 7, "pass": 0}])  # 50% but only 7 turns
    assert evolve(InterfaceState.initial("seal"), few, config).pressure == ()
    rewarded = _profile_with([{"pass": 30}])
    assert evolve(InterfaceState.initial("seal"), rewarded, config).pressure == ()  # pass is never pressure


def test_each_label_switches_its_component():
    config = InterfaceConfig(min_count=8, max_guidelines=2)
    profile = _profile_with([{"argument_mismatch": 10, "invalid_tool_call": 10, "recovery_failure": 10,
                              "spurious_tool_call": 20, "missing_tool_call": 12, "response_mismatch": 10, "pass": 5}],
                            with_pass=False)  # fmt: skip
    state = evolve(InterfaceState.initial("seal"), profile, config)
    assert state.schema_tools == ("cd",) and state.schema_types and state.format_note
    assert state.parse_hints and state.tool_hints
    assert state.guidelines == ("cautious_call", "active_respond")  # top 2 by prevalence × (1 − reward)
    assert state.tool_list
    assert set(state.pressure) == {"argument_mismatch", "invalid_tool_call", "recovery_failure",
                                   "spurious_tool_call", "missing_tool_call", "response_mismatch"}  # fmt: skip


def test_evolve_is_pure_and_fixed_presets_never_change():
    profile = _profile_with([{"state_mismatch": 20, "pass": 10}])
    seal = InterfaceState.initial("seal")
    assert evolve(seal, profile, PAPER_SCALE) == evolve(seal, profile, PAPER_SCALE)
    assert seal == InterfaceState.initial("seal")
    for preset in ("vanilla", "paper"):
        start = InterfaceState.initial(preset)
        assert evolve(start, profile, InterfaceConfig(preset=preset)) == replace(start, round=1)


def test_min_count_auto_is_the_papers_count_scaled_to_the_window():
    assert PAPER_SCALE.min_count == 8 and InterfaceConfig().min_count == "auto"  # the seal preset's default
    assert [auto_min_count(n) for n in (1, 8, 47, 48, 80, 96, 512)] == [1, 1, 1, 2, 3, 3, 16]
    assert InterfaceConfig(min_count=5).resolved(8).min_count == 5  # a number stays as given
    with pytest.raises(SealError, match="resolve `auto`"):
        evolve(InterfaceState.initial("seal"), _profile_with([{"state_mismatch": 20}]), InterfaceConfig())
    for bad in (0, "sometimes", True, 2.5):
        with pytest.raises(SealError, match="min_count must be an integer >= 1 or auto"):
            InterfaceConfig(min_count=bad)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 300))
def test_a_label_in_every_episode_switches_its_component_on_at_any_window_size(episodes):
    """What ``auto`` is for: a label the whole window shows (prevalence 100%, reward 0) drives its
    component at any round size; the paper's fixed 8 stays off below 8 episodes, silently."""
    profile = _profile_with([{"state_mismatch": episodes}], with_pass=False)
    scaled = evolve(InterfaceState.initial("seal"), profile, InterfaceConfig().resolved(episodes))
    fixed = evolve(InterfaceState.initial("seal"), profile, InterfaceConfig(min_count=8))
    assert scaled.guidelines == ("state_aware",)
    assert (fixed.guidelines == ("state_aware",)) == (episodes >= 8)


def test_state_serialises_and_diffs():
    assert InterfaceState.from_json(json.loads(json.dumps(ALL_ON.to_json()))) == ALL_ON
    assert InterfaceState.initial("seal").diff(replace(InterfaceState.initial("seal"), parse_hints=True)) == {
        "parse_hints": (False, True)
    }
    assert "guideline:format" in ALL_ON.active_components
    with pytest.raises(SealError, match="Unknown interface preset"):
        InterfaceState(preset="best")
    with pytest.raises(SealError, match="Unknown guideline"):
        InterfaceState(guidelines=("be_nice",))
    with pytest.raises(SealError, match="Unknown interface state field"):
        InterfaceState.from_json({"bogus": 1})
    with pytest.raises(SealError, match="prevalence_off <= prevalence_on"):
        InterfaceConfig(prevalence_on=0.05, prevalence_off=0.1)


def test_environment_refuses_an_interface_with_other_settings():
    with pytest.raises(SealError, match="build both from the same settings"):
        BfclEnv(EnvConfig(prompt_mode="chat_template"), Interface("bfcl_qwen_fc"))
