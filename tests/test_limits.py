"""Bounded resources (issue 14): per-result, per-message, per-episode and per-step caps, the operand
guard and linear-time parsing. Speed itself is measured in benchmarks/bench_attacks_env.py."""

import collections
import re
import signal
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from seal_rl.backends import MAX_INTEGER_DIGITS, MAX_RESULT_DIGITS, Backends, resource_guard
from seal_rl.env import BfclEnv, EnvConfig, accepted_calls
from seal_rl.errors import SealError
from seal_rl.limits import StepTimeout, time_limit, truncate_result
from seal_rl.tools import ToolCall, _hermes_blocks, _strip_fence, get_format
from seal_rl.verify import _missing_indices, _output_key, verify

HERMES = get_format("hermes")
BIG = "x" * 99_000


def _file_system_env(task_set, **config):
    env = BfclEnv(EnvConfig(**config))
    env.reset(task_set.get("multi_turn_base_0"))  # GorillaFileSystem + TwitterAPI
    env.step(HERMES.render([ToolCall("touch", {"file_name": "big.txt"}), ToolCall("echo", {"content": BIG, "file_name": "big.txt"})]))
    return env


def _busy(seconds: float) -> None:
    """Python-level busy work (what a signal can interrupt), bounded so a broken limit fails, not hangs."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def _spin(seconds: float, log: list) -> None:
    """:func:`_busy`, logging whether it finished or was stopped.

    The ``try`` is in this frame, not in the looping one: on CPython 3.13 an exception a signal
    handler raises while a tight ``while`` condition is evaluated can skip that frame's own
    ``except`` (python/cpython#130279; 16 of 100 tries here on 3.13.0, none on 3.11/3.12).
    """
    try:
        _busy(seconds)
        log.append("finished")
    except StepTimeout:
        log.append("stopped")
        raise


@pytest.fixture
def slow_pwd(monkeypatch):
    """Backends in which ``pwd`` runs for 30 s of Python code."""
    log: list[str] = []
    original = Backends.execute

    def execute(self, call):
        if call.name == "pwd":
            _spin(30.0, log)
        return original(self, call)

    monkeypatch.setattr(Backends, "execute", execute)
    return log


# -- one tool result ------------------------------------------------------------------------


@given(st.text(max_size=300), st.integers(1, 200))
def test_truncated_result_keeps_the_head_and_says_how_much_was_cut(text, limit):
    shown, cut = truncate_result(text, limit)
    assert cut == max(0, len(text) - limit)
    if cut:
        assert shown.startswith(text[:limit]) and shown.endswith(f"[truncated: {cut} more characters]")
    else:
        assert shown == text


def test_a_long_result_is_cut_with_a_marker_and_recorded_in_the_trace(task_set):
    env = _file_system_env(task_set, max_result_chars=1_000)
    observation, *_ = env.step(HERMES.render([ToolCall("cat", {"file_name": "big.txt"})]))
    entry = env.trace[-1]
    assert entry.truncated == len(BIG) + len('{"file_content": ""}') - 1_000
    assert f"[truncated: {entry.truncated} more characters]" in observation[0]["content"]
    assert len(observation[0]["content"]) < 1_200
    env.truncate("test")
    assert env.record()["trace"][-1]["truncated"] == entry.truncated
    assert env.record()["trace"][0]["truncated"] == 0


# -- one message ----------------------------------------------------------------------------


def test_a_message_with_too_many_calls_is_rejected_whole_and_nothing_runs(task_set):
    env = _file_system_env(task_set, max_calls_per_message=3)
    calls_before = sum(len(step) for turn in env.calls_by_turn for step in turn)
    observation, _, _, _, info = env.step(HERMES.render([ToolCall("touch", {"file_name": f"f{i}"}) for i in range(4)]))
    assert info["event"] == "rejected"
    assert "4 tool calls exceeds the limit of 3" in observation[0]["content"]
    assert env.trace[-1].error_kind == "parse" and not env.trace[-1].accepted
    assert sum(len(step) for turn in env.calls_by_turn for step in turn) == calls_before
    _, _, _, _, info = env.step(HERMES.render([ToolCall("touch", {"file_name": f"f{i}"}) for i in range(3)]))
    assert info["event"] == "tool_results"


# -- one episode ----------------------------------------------------------------------------


def test_the_observation_budget_ends_the_episode_after_the_step_that_exceeds_it(task_set):
    env = _file_system_env(task_set, max_result_chars=50_000, observation_budget_chars=120_000)
    before = env.observation_chars  # the two "None" results of touch and echo
    env.step(HERMES.render([ToolCall("cat", {"file_name": "big.txt"})] * 2))
    assert not env.done and env.observation_chars - before == 2 * (50_000 + len("\n... [truncated: 49020 more characters]"))
    _, reward, terminated, truncated, info = env.step(HERMES.render([ToolCall("cat", {"file_name": "big.txt"})]))
    assert (terminated, truncated, info["end_reason"]) == (False, True, "observation_budget")
    assert info["verdict"].reward == reward == 0.0 and info["verdict"].checker_error is None
    assert env.record()["observation_chars"] == env.observation_chars


def test_caps_are_validated_with_a_clear_message():
    for field, value in [("max_calls_per_message", 0), ("max_result_chars", 0), ("observation_budget_chars", -1), ("step_timeout_s", 0)]:
        with pytest.raises(SealError, match=field):
            EnvConfig(**{field: value})


# -- one step's wall time -------------------------------------------------------------------


def test_a_call_running_past_the_step_limit_is_stopped_and_ends_the_episode(task_set, slow_pwd):
    # 2 s, not less: the ls before pwd must finish within the limit on a loaded CI machine
    env = BfclEnv(EnvConfig(step_timeout_s=2.0))
    env.reset(task_set.get("multi_turn_base_0"))
    _, _, _, truncated, info = env.step(HERMES.render([ToolCall("ls", {}), ToolCall("pwd", {}), ToolCall("ls", {})]))
    assert slow_pwd == ["stopped"]
    assert truncated and info["end_reason"] == "step_timeout"
    ls, pwd, skipped = env.trace
    assert ls.accepted and ls.error is None
    assert pwd.error_kind == "execution" and "was stopped" in pwd.result
    assert not skipped.accepted and skipped.error_kind == "execution" and "not executed" in skipped.error
    assert env.calls_by_turn[0] == [[ToolCall("ls", {})]]  # the stopped call counts as not made
    assert accepted_calls(env.record()["trace"], env.task.num_turns) == env.calls_by_turn  # and read back from the trace
    assert info["verdict"].checker_error is None


def test_without_signals_the_step_stops_between_calls(task_set, monkeypatch):
    log: list[str] = []
    original = Backends.execute

    def execute(self, call):
        if call.name == "pwd":
            _spin(0.5, log)
        return original(self, call)

    monkeypatch.setattr(Backends, "execute", execute)
    env = BfclEnv(EnvConfig(step_timeout_s=0.1))
    env.reset(task_set.get("multi_turn_base_0"))
    outcome = {}
    worker = threading.Thread(target=lambda: outcome.update(zip("orTtI", env.step(HERMES.render([ToolCall("pwd", {}), ToolCall("ls", {})])))))
    worker.start()
    worker.join(30)
    assert log == ["finished", "finished"]  # a thread cannot be interrupted: the episode and the verifier ran it
    assert outcome["I"]["end_reason"] == "step_timeout"
    assert [e.accepted for e in env.trace] == [True, False]


def test_the_verifier_replays_within_the_same_limit(task_set, slow_pwd):
    task = task_set.get("multi_turn_base_0")
    verdict = verify(task, [[[ToolCall("pwd", {})]]], step_timeout_s=2.0)
    assert slow_pwd == ["stopped"]
    assert verdict.reward == 0.0 and verdict.checker_error is None


def test_time_limit_keeps_an_outer_timer_that_rings_later():
    rang = []
    previous = signal.signal(signal.SIGALRM, lambda *_: rang.append(True))
    signal.setitimer(signal.ITIMER_REAL, 5.0)
    try:
        with pytest.raises(StepTimeout), time_limit(0.05):
            _spin(10.0, [])
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 4.0 < left < 5.0 and signal.getsignal(signal.SIGALRM) is not None and not rang
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_time_limit_leaves_an_outer_timer_that_rings_first_to_its_owner():
    class Outer(BaseException):
        pass

    def ring(*_):
        raise Outer

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, 0.05)
    try:
        with pytest.raises(Outer), time_limit(10.0):
            _spin(10.0, [])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# -- the verifier holds digests of long outputs ---------------------------------------------

_outputs = st.lists(st.sampled_from(["a", "b", "a" * 2_000, "b" * 2_000, "a" * 1_999 + "b"]), max_size=8)


@given(_outputs, _outputs)
def test_output_digests_keep_the_official_multiset_comparison(outputs, expected):
    pool = collections.Counter(outputs)
    missing = []
    for index, item in enumerate(expected):
        if pool[item]:
            pool[item] -= 1
        else:
            missing.append(index)
    assert _missing_indices([_output_key(o) for o in outputs], expected) == missing


# -- operands -------------------------------------------------------------------------------


def test_the_issue_power_call_is_refused_and_small_ones_run(task_set):
    backends = Backends(next(t for t in task_set if "MathAPI" in t.involved_classes))
    refused = backends.execute(ToolCall("power", {"base": int("7" * 4000), "exponent": 10_000}))
    assert refused.raised and "too large" in refused.output
    assert backends.execute(ToolCall("power", {"base": 2, "exponent": 10})).output == '{"result": 1024}'
    # below the guard the official behaviour stands: a result too long to print is Python's own error
    assert "Exceeds the limit" in backends.execute(ToolCall("power", {"base": 10, "exponent": 5_000})).output


@given(st.integers(2, 1_000), st.integers(1, 60_000), st.booleans())
def test_power_is_refused_exactly_when_its_result_is_too_long(base, exponent, negative):
    refused = resource_guard("MathAPI", "power", {"base": -base if negative else base, "exponent": exponent}) is not None
    result = base**exponent
    if refused:
        assert result >= 10 ** (MAX_RESULT_DIGITS - 1)
    else:
        assert result < 10 ** (MAX_RESULT_DIGITS + 1)


@pytest.mark.parametrize("where", ["top", "list", "dict"])
def test_an_integer_longer_than_pythons_own_limit_is_refused_in_any_argument(task_set, where):
    huge = 16**4000  # a pythonic hex literal can carry it; no decimal literal can
    value = {"top": huge, "list": [1, huge], "dict": {"k": [huge]}}[where]
    assert resource_guard("TradingBot", "place_order", {"amount": value}) is not None
    assert resource_guard("TradingBot", "place_order", {"amount": 10**MAX_INTEGER_DIGITS - 1}) is None
    parsed = get_format("pythonic").parse(f"[multiply(a={hex(huge)}, b=2)]")
    backends = Backends(next(t for t in task_set if "MathAPI" in t.involved_classes))
    assert "too large" in backends.execute(parsed.calls[0]).output


def test_rounding_to_a_huge_number_of_places_is_refused():
    assert resource_guard("MathAPI", "round_number", {"number": 5, "decimal_places": -10**8}) is not None
    assert resource_guard("MathAPI", "round_number", {"number": 5, "decimal_places": -3}) is None


# -- linear-time parsing --------------------------------------------------------------------

_OLD_FENCE = re.compile(r"```[A-Za-z0-9_-]*\s*\n?(.*?)\n?```", flags=re.DOTALL)
_OLD_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@given(st.lists(st.sampled_from(["`", "```", "a", "-", " ", "\n", "x y", "{}"]), max_size=14).map("".join))
def test_fence_stripping_matches_the_old_regex(text):
    match = _OLD_FENCE.fullmatch(text)
    assert _strip_fence(text) == (match.group(1).strip() if match else text)


@given(st.lists(st.sampled_from(["<tool_call>", "</tool_call>", "x", "{}", "\n"]), max_size=14).map("".join))
def test_hermes_blocks_match_the_old_regex(text):
    assert _hermes_blocks(text) == [m.span() for m in _OLD_HERMES.finditer(text)]


@pytest.mark.parametrize(
    "message",
    [
        "```" + "a" * 100_000 + "`",
        "```" + "ab`" * 33_000 + "``",
        "</tool_call>" * 4_000 + "<tool_call>" * 4_000 + "x" * 10_000,
    ],
)
@pytest.mark.parametrize("name", ["hermes", "pythonic", "json"])
def test_adversarial_100kb_messages_parse(name, message):
    # Each took tens of seconds with the old regexes; this test would time out the suite then.
    parsed = get_format(name).parse(message)
    assert parsed.error is not None or not parsed.calls


_HOSTILE_NAME = "missing 1 required positional argument: " * 2_400 + "\nX"


@given(st.lists(st.sampled_from(["missing 1 required positional argument: ", "missing 2 required keyword-only arguments: ",
                                 "x", "\n", "'a'"]), max_size=8).map("".join))  # fmt: skip
def test_missing_argument_hint_reads_the_last_line_as_the_whole_text_regex_did(error):
    from seal_rl.interface import _MISSING_ARGUMENT

    whole = _MISSING_ARGUMENT.search(error)
    last = _MISSING_ARGUMENT.search(error.removesuffix("\n").rpartition("\n")[2])
    assert (whole and whole.group(1)) == (last and last.group(1))


def test_tool_hints_on_a_hostile_file_name_complete(task_set):
    # The error of cd(folder=<96 KB of "missing 1 required ...">) took 2 s per call in the hint regex.
    from seal_rl.interface import Interface, InterfaceState

    env = BfclEnv(EnvConfig(), Interface(state=InterfaceState(tool_hints=True)))
    env.reset(task_set.get("multi_turn_base_0"))
    observation, *_ = env.step(HERMES.render([ToolCall("cd", {"folder": _HOSTILE_NAME[:40_000]})] * 2))
    assert observation[0]["content"].count("No such file or directory") == 2
