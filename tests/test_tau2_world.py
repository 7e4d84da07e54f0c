"""τ²'s environments built fast (seal_rl.environments.tau2_world): the same environments as τ²'s own
constructors, a private database per episode, and τ²'s own scores through ``scoring_domain``."""

import inspect
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

pytest.importorskip("tau2")

from pydantic import BaseModel  # noqa: E402

from seal_rl.environments.tau2_world import environment_constructor, scoring_domain  # noqa: E402
from seal_rl.environments.tau2_bench import load_tau2  # noqa: E402
from seal_rl.environments.tau2_oracle import gold_actions, with_wrong_write  # noqa: E402
from seal_rl.environments.tau2 import Tau2Family  # noqa: E402
from seal_rl.environments.tau2_players import Player  # noqa: E402
from seal_rl.ood.tau2_run import play  # noqa: E402

BUILDS = [("mock", False), ("mock", True), ("airline", False), ("retail", False), ("telecom", False), ("telecom", True)]


@pytest.fixture(scope="module")
def tau2():
    return load_tau2()


def tools(kit_tools):
    return [tool.openai_schema for tool in kit_tools]


@pytest.mark.parametrize("domain, solo", BUILDS)
def test_the_fast_constructor_builds_taus_own_environment(tau2, domain, solo):
    original = tau2.registry.get_env_constructor(domain)
    fast = environment_constructor(tau2, domain)
    assert inspect.signature(fast) == inspect.signature(original)
    ours, theirs = fast(solo_mode=solo), original(solo_mode=solo)
    assert type(ours) is type(theirs) and ours.get_domain_name() == theirs.get_domain_name() and ours.solo_mode is theirs.solo_mode
    assert ours.get_db_hash() == theirs.get_db_hash() and ours.get_user_db_hash() == theirs.get_user_db_hash()
    assert ours.get_policy() == theirs.get_policy()
    assert tools(ours.get_tools()) == tools(theirs.get_tools())
    if theirs.user_tools is not None:
        assert tools(ours.get_user_tools()) == tools(theirs.get_user_tools())
    db = type(theirs.tools.db).model_validate(theirs.tools.db.model_dump())
    assert fast(db=db).tools.db is db  # a database given is used, as τ²'s constructors use it


def mutable_parts(obj):
    """The ids of every model, list, dict and set reachable from ``obj``."""
    seen, stack = set(), [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, BaseModel):
            seen.add(id(item))
            stack.extend(item.__dict__.values())
        elif isinstance(item, (list, set)):
            seen.add(id(item))
            stack.extend(item)
        elif isinstance(item, dict):
            seen.add(id(item))
            stack.extend(item.values())
        elif isinstance(item, tuple):
            stack.extend(item)
    return seen


@pytest.mark.parametrize("domain", ["mock", "airline", "retail", "telecom"])
def test_no_two_environments_share_any_mutable_part_of_their_databases(tau2, domain):
    fast = environment_constructor(tau2, domain)
    one, two = fast(), fast()
    for kit in ("tools", "user_tools"):
        if getattr(one, kit) is not None:
            a, b = mutable_parts(getattr(one, kit).db), mutable_parts(getattr(two, kit).db)
            assert len(a) > 1 and not a & b


def tool_call(name, arguments, index=0):
    from tau2.data_model.message import ToolCall

    return ToolCall(id=f"call_{index}", name=name, arguments=dict(arguments))


def create_task(env, title):
    return env.get_response(tool_call("create_task", {"user_id": "user_1", "title": title}))


def test_a_write_in_one_episode_shows_in_neither_another_nor_the_cache(tau2):
    fast = environment_constructor(tau2, "mock")
    pristine = fast().get_db_hash()
    one, two = fast(), fast()
    assert not create_task(one, "only in one").error
    assert one.get_db_hash() != pristine and two.get_db_hash() == pristine and fast().get_db_hash() == pristine
    assert [t.title for t in one.tools.db.tasks.values()].count("only in one") == 1
    assert "only in one" not in [t.title for t in two.tools.db.tasks.values()]


def test_episodes_on_threads_each_see_only_their_own_writes(tau2):
    fast = environment_constructor(tau2, "mock")

    def episode(n):
        env = fast(solo_mode=True)
        for k in range(3):
            assert not create_task(env, f"episode {n} task {k}").error
        return sorted(t.title for t in env.tools.db.tasks.values() if t.title.startswith("episode"))

    with ThreadPoolExecutor(max_workers=8) as pool:
        seen = list(pool.map(episode, range(16)))
    assert seen == [[f"episode {n} task {k}" for k in range(3)] for n in range(16)]


def test_scoring_domain_registers_the_fast_constructor_once(tau2):
    from tau2.registry import Registry

    registry = Registry()  # a registry of its own: the name is not registered yet
    registry.register_domain(tau2.registry.get_env_constructor("mock"), "mock")
    own = SimpleNamespace(registry=registry)
    barrier = threading.Barrier(8)

    def register(_):
        barrier.wait()
        return scoring_domain(own, "mock")

    with ThreadPoolExecutor(max_workers=8) as pool:
        names = set(pool.map(register, range(8)))
    assert names == {"seal-fast-mock"} and registry.get_domains() == ["mock", "seal-fast-mock"]
    assert registry.get_env_constructor("seal-fast-mock") is environment_constructor(own, "mock")
    assert scoring_domain(tau2, "mock") == "seal-fast-mock"
    assert tau2.registry.get_env_constructor("seal-fast-mock") is environment_constructor(tau2, "mock")


def solo_simulation(tau2, domain, task, script):
    """A solo episode as seal-rl's training episodes play it: ``script``'s gold actions (both
    requestors) as the agent's tool calls, then ``done``."""
    from tau2.data_model.message import AssistantMessage

    calls = [tool_call(a.name, a.arguments, i) for i, a in enumerate(gold_actions(script))] + [tool_call("done", {}, -1)]

    class Scripted(tau2.llm_agent.LLMSoloAgent):
        def generate_next_message(self, message, state):
            reply = self._check_if_stop_toolcall(AssistantMessage(role="assistant", tool_calls=[calls.pop(0)]))
            return reply, state

        def set_seed(self, seed):
            pass

    env = environment_constructor(tau2, domain)(solo_mode=True)
    agent = Scripted(tools=env.get_tools() + (env.get_user_tools() if env.user_tools else []), domain_policy=env.get_policy(), task=task)
    orchestrator = tau2.orchestrator.Orchestrator(domain, agent, tau2.user_simulator.DummyUser(), env, task, max_steps=200,
                                                  max_errors=10, seed=1, solo_mode=True)  # fmt: skip
    return orchestrator.run()


def score(tau2, domain, simulation, task, solo):
    info = tau2.evaluator.evaluate_simulation(simulation=simulation, task=task, evaluation_type=tau2.evaluator.EvaluationType.ALL,
                                              solo_mode=solo, domain=domain)  # fmt: skip
    return info.model_dump(mode="json")


@pytest.mark.parametrize("domain, task_id", [("mock", "create_task_1"), ("telecom", "[mobile_data_issue]data_mode_off|data_usage_exceeded[PERSONA:None]")])
def test_solo_scores_through_scoring_domain_are_taus_own_without_parsing_the_database(tau2, domain, task_id, monkeypatch):
    from tau2.environment.db import DB

    task = next(t for t in tau2.registry.get_tasks_loader(domain)() if t.id == task_id)
    wrong = with_wrong_write(tau2, domain, task)
    simulations = [solo_simulation(tau2, domain, task, script) for script in (task, wrong)]  # parses the database, once
    plain = [score(tau2, domain, s, task, True) for s in simulations]
    assert [info["reward"] for info in plain] == [1.0, 0.0]

    def parsed(cls, path):
        raise AssertionError(f"the database was parsed again: {path}")

    monkeypatch.setattr(DB, "load", classmethod(parsed))
    assert [score(tau2, scoring_domain(tau2, domain), s, task, True) for s in simulations] == plain
    with pytest.raises(AssertionError, match="parsed again"):
        score(tau2, domain, simulations[0], task, True)  # τ²'s own domain does parse it


def test_conversation_scores_through_scoring_domain_are_taus_own(tau2):
    domain, task = "retail", tau2.registry.get_tasks_loader("retail")("test")[0]
    family = Tau2Family(domain, solo=False, user=Player("oracle"))
    for played, reward in ((None, 1.0), (with_wrong_write(tau2, domain, task), 0.0)):
        simulation, failure = play(family, task, Player("oracle"), seed=1, played=played)
        plain = score(tau2, domain, simulation, task, False)
        assert failure is None and plain["reward"] == reward
        assert score(tau2, scoring_domain(tau2, domain), simulation, task, False) == plain
