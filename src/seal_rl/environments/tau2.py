"""τ²-bench as an environment family: airline, retail, telecom and mock, trained with SEAL's closed loop.

Each episode is one τ² conversation played by τ²'s own pieces: its ``Orchestrator`` (stepped here,
one agent message at a time), its domain ``Environment`` (the tools, the database), its user (the
``DummyUser`` of solo mode, or its ``UserSimulator`` prompt served by a model) and its scorer,
``evaluate_simulation`` with ``EvaluationType.ALL``: the reward that reaches the loss is τ²'s.
Nothing of τ² is re-implemented; the agent side is a τ² agent class whose next message is the one
the policy just wrote (:class:`_Pushed`).

Why not ``tau2.gym.AgentGymEnv``: its observations are formatted text (the loop needs structured
calls and results for the trace Ψ reads), it runs the orchestrator in a thread per episode, and it
re-loads the task file at every step (87% of a telecom episode's time, DESIGN.md §12).

Ways to play the user (``family_settings``):

* ``solo: true`` — τ²'s solo mode, for the tasks τ²'s solo agent accepts (a ticket and gold actions:
  telecom all, mock 6 of 9): no user,
  the agent gets τ²'s solo policy and the ticket, and ends with τ²'s ``done`` tool;
* ``user: openai:MODEL@URL`` — τ²'s ``UserSimulator`` (its own prompt, temperature 0) on any
  OpenAI-compatible server (``vllm serve``, ``seal rollout-server``);
* ``user: hf:MODEL`` / ``vllm:MODEL`` — the same ``UserSimulator`` with a local model, loaded in the
  trainer's process and served to τ² through litellm (:mod:`seal_rl.environments.tau2_players`);
* ``user: oracle`` — the scripted user of ``seal eval``'s τ² oracle (opens, runs the user-side gold
  actions, stops): the parity check.

The user is never trained: its messages are observations, so its tokens never reach the loss.

``seal eval --benchmark tau2-DOMAIN`` plays its conversations through the same :class:`Conversation`
(the same environment, orchestrator stepping and scoring), with τ²'s own agent on the agent side
(``LLMAgent``: τ²'s prompts, unchanged) instead of the policy's pushed messages.

Differences from ``tau2 run`` a user should know: each tool call of a message is sent to τ² as its
own agent message (the trace keeps one entry per call; τ²'s ``max_steps`` counts them one by one),
and the driver's budgets can end a conversation early (scored as τ²'s ``max_steps``).

Ψ's evidence (:func:`outcome`): per gold action, matched / called with other arguments / never
called; ``communicate_info`` not said; the database hash; telecom's environment assertions; and the
end reason. τ² scores only conversations that end by a stop; for the others (max steps, too many
errors, an agent error) the same checks are run on the conversation as it stood — evidence for the
labels only, never the reward (docs/concepts/diagnosis.md).
"""

from __future__ import annotations

import copy
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from typing import Any

from seal_rl.environments.family import Family, FamilyTask, TaskSource
from seal_rl.environments.outcome import Outcome, ToolError
from seal_rl.environments.tau2_models import EngineError, engine_failure
from seal_rl.environments.tau2_oracle import oracle_classes
from seal_rl.environments.tau2_players import Player, user_player
from seal_rl.environments.tau2_world import environment_constructor, scoring_domain
from seal_rl.errors import SealError
from seal_rl.policies import ServerPolicy, parse_policy

DOMAINS = ("airline", "retail", "telecom", "mock")
READ_PREFIXES = ("get_", "find_", "list_", "search_", "check_", "calculate")
"""τ² tools whose names start so only read state: Ω's "inspect the current state first" hints name them"""
STOPPED = ("agent_stop", "user_stop")
"""the termination reasons τ² scores (every other one is reward 0)"""


class Tau2TaskSource(TaskSource):
    """τ²'s tasks of one domain; asking for a task solo mode cannot play is one line."""

    def __init__(self, tasks: Sequence[FamilyTask], unplayable: Mapping[str, str]) -> None:
        super().__init__(tasks)
        self.unplayable = dict(unplayable)

    def get(self, task_id: str) -> FamilyTask:
        if str(task_id) in self.unplayable:
            raise SealError(self.unplayable[str(task_id)])
        return super().get(task_id)


class Tau2Family(Family):
    """τ²-bench's ``domain`` as a family (see the module docstring)."""

    def __init__(self, domain: str, *, solo: bool | None = None, user: str | Player | None = None, max_steps: int = 200,
                 max_errors: int = 10, seed: int = 300, user_timeout: float = 120.0, user_temperature: float = 0.0,
                 user_max_new_tokens: int = 512) -> None:  # fmt: skip
        from seal_rl.environments.tau2_bench import load_tau2, splits
        from seal_rl.evaluate import ModelSettings

        if domain not in DOMAINS:
            raise SealError(f"Unknown τ² domain {domain!r}: choose one of {', '.join(f'tau2-{d}' for d in DOMAINS)}.")
        self.tau2 = load_tau2()
        self.domain, self.name = domain, f"tau2-{domain}"
        self.solo = user is None if solo is None else bool(solo)
        self.has_user = not self.solo  # solo: a text message ends the conversation (τ²'s agent_error)
        if self.solo and user is not None:
            raise SealError(f"{self.name}: solo mode has no user; drop family_settings.user or set solo: false.")
        if not self.solo and user is None:
            raise SealError(f"{self.name} with a user needs one: family_settings.user=openai:MODEL@URL (a `vllm serve` "
                            "of the user model), hf:MODEL or vllm:MODEL (loaded in this process), or solo: true for "
                            "tasks with a ticket (telecom, mock).")  # fmt: skip
        self.user_spec = user.spec if isinstance(user, Player) else user
        self._user = user if isinstance(user, Player) else None
        self._user_policy = None if user is None or isinstance(user, Player) or user == "oracle" else _user_policy(user)
        self._closing, self._user_lock = ExitStack(), threading.Lock()
        self.user_settings = ModelSettings(temperature=user_temperature, max_new_tokens=user_max_new_tokens, timeout=user_timeout)
        self.max_steps, self.max_errors, self.seed = max_steps, max_errors, seed
        known = splits(self.tau2, domain)
        split_of = {t: name for name in ("test", "train") for t in known.get(name, ())}
        tasks, unplayable = [], {}
        for task in self.tau2.registry.get_tasks_loader(domain)():
            if self.solo and not self.tau2.llm_agent.LLMSoloAgent.check_valid_task(task):  # τ²'s own test
                unplayable[str(task.id)] = (f"{self.name} task {task.id!r} cannot be played solo: τ²'s solo agent needs a "
                                            "ticket and gold actions (telecom: every task). Play it with a user: "
                                            "family_settings.user.")  # fmt: skip
                continue
            tasks.append(FamilyTask(str(task.id), _category(domain, str(task.id)), task.ticket or "",
                                    split_of.get(str(task.id), "train"), task))  # fmt: skip
        if not tasks:
            raise SealError(f"{self.name} has no task τ²'s solo agent can play (it needs a ticket and gold actions): "
                            "set family_settings.user.")  # fmt: skip
        self._tasks, self._unplayable = tasks, unplayable
        probe = environment_constructor(self.tau2, domain)(solo_mode=self.solo)
        self._policy = probe.get_policy()
        tools = _env_tools(probe, self.solo)
        self._tool_objects = _agent_class(self.tau2, True)(tools, self._policy, tasks[0].data).tools if self.solo else tools  # + done
        self._docs = [tool_doc(t.openai_schema["function"]) for t in self._tool_objects]
        self.inspect_tools = tuple(d["name"] for d in self._docs if d["name"].startswith(READ_PREFIXES))

    def check_user(self, timeout: float = 10.0) -> None:
        """The simulated user can play, or one line (``seal train`` and ``seal preflight`` ask before anything
        starts): a server answers ``GET /models`` and serves the model named; a local model loads."""
        import httpx

        if not isinstance(self._user_policy, ServerPolicy):
            if self._user_policy is not None:
                self.user_player()  # loads the model now: a model that cannot load is one line before the run
            return
        policy = self._user_policy
        url = policy.url.rstrip("/")
        try:
            response = httpx.get(f"{url}/models", timeout=timeout)
            response.raise_for_status()
            served = [str(m.get("id")) for m in response.json().get("data", [])]
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            raise SealError(f"The user simulator's server {url} cannot be reached ({type(exc).__name__}: {exc}); start it "
                            "(e.g. `vllm serve MODEL --port PORT`) or fix family_settings.user.") from None  # fmt: skip
        if policy.model not in served:
            raise SealError(f"The user simulator's server {url} serves {', '.join(served) or 'no model'}, not "
                            f"{policy.model!r}; fix family_settings.user.")  # fmt: skip

    def user_player(self) -> Player | None:
        """The simulated user's :class:`Player` (None in solo mode); a local model loads at the first call."""
        if self.solo:
            return None
        with self._user_lock:
            if self._user is None:
                try:
                    self._user = self._closing.enter_context(user_player(self.user_spec, self.user_settings))
                except SealError:
                    raise
                except Exception as exc:  # noqa: BLE001 - a model that cannot load is one line, not a traceback
                    said = " ".join(str(exc).split())[:300]  # one line, whatever the loader wrote
                    raise SealError(f"family_settings.user {self.user_spec!r} cannot load: {type(exc).__name__}: {said}") from None
            return self._user

    def close(self) -> None:
        """Release the simulated user's local model, if one was loaded."""
        self._closing.close()
        self._user = None if self._user_policy is not None else self._user

    # -- the family protocol ------------------------------------------------------------------

    def tasks(self) -> list[FamilyTask]:
        return list(self._tasks)

    def task_set(self) -> Tau2TaskSource:
        return Tau2TaskSource(self._tasks, self._unplayable)

    def tools(self, task: FamilyTask) -> list[dict[str, Any]]:
        return copy.deepcopy(self._docs)

    def instructions(self, task: FamilyTask) -> str:
        """τ²'s own agent system prompt: its instructions and the domain policy (solo: and the ticket)."""
        agent = _agent_class(self.tau2, self.solo)
        made = agent(self._tool_objects, self._policy, task.data) if self.solo else agent(self._tool_objects, self._policy)
        return made.system_prompt

    def start(self, task: FamilyTask) -> Conversation:
        return Conversation(self, task.data)

    def opening(self, state: Conversation, task: FamilyTask) -> str:
        return state.opening if not self.solo else task.prompt

    def call(self, state: Conversation, name: str, arguments: dict[str, Any]) -> str:
        return state.tool_call(name, arguments)

    def reply(self, state: Conversation, task: FamilyTask, text: str) -> str | None:
        return state.text(text)

    def oracle(self, task: FamilyTask) -> list[Any]:
        """τ²'s gold actions, one call a message (solo: the user-side ones too, then ``done``; with a user:
        then one message with every ``communicate_info``), as ``seal eval``'s τ² oracle plays them."""
        from seal_rl.tools import ToolCall

        criteria = task.data.evaluation_criteria
        actions = [a for a in (criteria.actions or []) if self.solo or a.requestor == "assistant"]
        script: list[Any] = [[ToolCall(a.name, copy.deepcopy(dict(a.arguments)))] for a in actions]
        if self.solo:
            return [*script, [ToolCall("done", {})]]
        return [*script, " ".join(str(i) for i in criteria.communicate_info or []) or "Done."]

    def ended(self, state: Conversation) -> str | None:
        reason = state.termination
        return None if reason is None else ("completed" if reason in STOPPED else reason)

    def verify(self, task: FamilyTask, state: Conversation, transcript: Sequence[Mapping[str, Any]]) -> Outcome:
        return outcome(state.score(), solo=self.solo)


def _category(domain: str, task_id: str) -> str:
    """telecom's ids start with their issue (``[mobile_data_issue]...``); other domains are one category."""
    if domain == "telecom" and task_id.startswith("[") and "]" in task_id:
        return task_id[1 : task_id.index("]")]
    return domain


def _user_policy(spec: str) -> Any:
    """``family_settings.user``'s policy (``openai:``, ``hf:``, ``vllm:``), or one line on what a user can be."""
    from seal_rl.policies import ModelPolicy, VLLMPolicy

    try:
        policy = parse_policy(spec)
    except SealError as exc:
        raise SealError(f"family_settings.user {spec!r}: {exc}") from None
    if not isinstance(policy, (ServerPolicy, ModelPolicy, VLLMPolicy)):
        raise SealError(f"family_settings.user {spec!r} cannot play τ²'s user: choose openai:MODEL@URL (a `vllm serve` "
                        "of the user model), hf:MODEL, vllm:MODEL or oracle.")  # fmt: skip
    return policy


def _env_tools(env: Any, solo: bool) -> list[Any]:
    """The tools the agent class is given, as τ²'s gym agent gets them: the domain's, plus in solo mode
    the user's (τ²'s solo agent adds ``done`` itself)."""
    return list(env.get_tools()) + (list(env.get_user_tools()) if solo and env.user_tools else [])


def _agent_class(tau2: Any, solo: bool) -> type:
    return tau2.llm_agent.LLMSoloAgent if solo else tau2.llm_agent.LLMAgent


def tool_doc(function: Mapping[str, Any]) -> dict[str, Any]:
    """A τ² tool's OpenAI function schema as a plain JSON-schema doc: ``$ref`` inlined from ``$defs``,
    ``anyOf`` reduced to its first typed branch (τ²'s pydantic schemas offer "the model or any dict"),
    ``title`` keys dropped. The doc shows the agent the same parameters; τ² still checks the call."""
    parameters = copy.deepcopy(dict(function.get("parameters", {})))
    defs = parameters.pop("$defs", {})

    def plain(schema: Any, depth: int = 0) -> Any:
        if not isinstance(schema, Mapping) or depth > 8:
            return schema
        if "$ref" in schema:
            resolved = defs.get(str(schema["$ref"]).rsplit("/", 1)[-1], {})
            return plain({**resolved, **{k: v for k, v in schema.items() if k != "$ref"}}, depth + 1)
        if "anyOf" in schema and "type" not in schema:
            branches = [plain(b, depth + 1) for b in schema["anyOf"]]
            typed = [b for b in branches if isinstance(b, Mapping) and b.get("type") not in (None, "null")]
            chosen = dict(typed[0]) if typed else {"type": "string"}
            if "description" in schema:  # the parameter's own description, not its model's
                chosen["description"] = schema["description"]
            return plain(chosen, depth + 1)
        out = {k: plain(v, depth + 1) if k in ("items", "additionalProperties") else v for k, v in schema.items() if k != "title"}
        if isinstance(schema.get("properties"), Mapping):
            out["properties"] = {name: plain(p, depth + 1) for name, p in schema["properties"].items()}
        return out

    parameters = plain(parameters)
    parameters.setdefault("type", "object")
    parameters.setdefault("properties", {})
    for prop in parameters["properties"].values():
        prop.setdefault("description", "")
    return {"name": function["name"], "description": function.get("description", ""), "parameters": parameters}


class _Pushed:
    """Mixin for a τ² agent class: its next message is the one :class:`Conversation` pushed."""

    pending: Any = None

    def generate_next_message(self, message: Any, state: Any) -> tuple[Any, Any]:
        pushed, self.pending = self.pending, None
        if pushed is None:
            raise RuntimeError("the orchestrator asked the agent for a message the policy has not written")
        if hasattr(self, "_check_if_stop_toolcall") and pushed.tool_calls:
            pushed = self._check_if_stop_toolcall(pushed)  # solo: a `done` call is τ²'s stop
        state.messages.append(pushed)
        return pushed, state

    def set_seed(self, seed: int) -> None:
        """The policy is seeded by the episode driver, not by τ²."""


def _pushed_class(tau2: Any, solo: bool) -> type:
    base = _agent_class(tau2, solo)
    return type(f"Pushed{base.__name__}", (_Pushed, base), {})


class Conversation:
    """One τ² conversation (a :class:`Tau2Family` episode's state). ``agent``: None for training, where each
    agent message is the one the policy wrote (pushed by :meth:`tool_call` and :meth:`text`); or a
    :class:`Player` whose τ² agent class writes every message (``seal eval``: τ²'s ``LLMAgent`` with its own
    prompts, or the scripted oracle), played to the end by :meth:`play`. ``seed``: τ²'s seed of the
    conversation (default the family's); ``script``: the task scripted players play instead of ``task``
    (the negative control's oracle); the score is always against ``task``."""

    def __init__(self, family: Tau2Family, task: Any, *, agent: Player | None = None, seed: int | None = None,
                 script: Any = None) -> None:  # fmt: skip
        tau2, self.family, self.task = family.tau2, family, task
        self.seed = family.seed if seed is None else seed
        script = task if script is None else script
        env = environment_constructor(tau2, family.domain)(solo_mode=family.solo)
        self.pushed = agent is None
        if self.pushed:
            agent_class = _pushed_class(tau2, family.solo)
            tools = _env_tools(env, family.solo)
            self.agent = agent_class(tools, env.get_policy(), task) if family.solo else agent_class(tools, env.get_policy())
        elif agent.scripted:
            self.agent = oracle_classes(tau2)[0](tools=env.get_tools(), domain_policy=env.get_policy(), task=script)
        else:
            self.agent = tau2.llm_agent.LLMAgent(tools=env.get_tools(), domain_policy=env.get_policy(), llm=agent.llm,
                                                 llm_args=dict(agent.llm_args))  # fmt: skip
        user_tools = list(env.get_user_tools()) if env.user_tools else None
        player = family.user_player()
        if player is None:
            user = tau2.user_simulator.DummyUser()
        elif player.scripted:  # the scripted user of `seal eval`'s τ² oracle
            user = oracle_classes(tau2)[1](task=script, tools=user_tools)
        else:
            user = tau2.user_simulator.UserSimulator(tools=user_tools, instructions=str(task.user_scenario), llm=player.llm,
                                                     llm_args=dict(player.llm_args))  # fmt: skip
        o = tau2.orchestrator
        self.orchestrator = o.Orchestrator(domain=family.domain, agent=self.agent, user=user, environment=env, task=task,
                                           max_steps=family.max_steps, max_errors=family.max_errors, seed=self.seed,
                                           solo_mode=family.solo)  # fmt: skip
        self.started, self.began = o.get_now(), time.perf_counter()
        self.initialized = False
        self.calls = 0
        self.termination: str | None = None
        self.failure: str | None = None
        self.opening = ""
        if self.pushed and not family.solo:  # the agent's greeting goes to the user, whose first message opens the chat
            self._run(None)
            self.opening = self._last_user_text() or ""

    def play(self) -> Conversation:
        """Play a conversation whose agent writes its own messages to the end (``Orchestrator.run``'s loop).
        Raises :class:`~seal_rl.environments.tau2_models.EngineError` where no message could be generated."""
        self._run(None)
        return self

    # -- what the episode asks -----------------------------------------------------------------

    def tool_call(self, name: str, arguments: dict[str, Any]) -> str:
        if self.termination is not None:
            raise ToolError(f"the conversation has ended ({self.termination}); nothing was executed")
        m = self.family.tau2.message
        self.calls += 1
        call_id = f"call_{self.calls}"
        call = m.ToolCall(id=call_id, name=name, arguments=arguments, requestor="assistant")
        self._run(m.AssistantMessage(role="assistant", content=None, tool_calls=[call]))
        answer = next((msg for msg in reversed(self.orchestrator.trajectory)
                       if isinstance(msg, m.ToolMessage) and msg.id == call_id), None)  # fmt: skip
        if answer is None:
            if self.termination in STOPPED:
                return "The conversation is over."
            raise ToolError(self.failure or f"the conversation ended ({self.termination}) before the call ran")
        if answer.error:
            raise ToolError(answer.content or "the tool failed")
        return answer.content or ""

    def text(self, text: str) -> str | None:
        """The agent's text to the user; the user's answer, or None once the conversation is over."""
        if self.termination is not None:
            return None
        m = self.family.tau2.message
        self._run(m.AssistantMessage(role="assistant", content=text))
        return None if self.termination is not None else self._last_user_text()

    def score(self) -> tuple[Any, Any, Any]:
        """τ²'s ``SimulationRun`` of the conversation, its ``evaluate_simulation`` (the reward), and the
        same checks run as if it had stopped (Ψ's evidence for a conversation τ² does not score)."""
        tau2 = self.family.tau2
        reason = tau2.simulation.TerminationReason
        if self.termination is None:  # the driver's budget ended it: scored as τ² scores a conversation out of steps
            self.termination = reason.MAX_STEPS.value
        simulation = tau2.simulation.SimulationRun(
            id=str(uuid.uuid4()), task_id=self.task.id, start_time=self.started, end_time=tau2.orchestrator.get_now(),
            duration=time.perf_counter() - self.began, termination_reason=reason(self.termination), reward_info=None,
            messages=self.orchestrator.get_trajectory(), seed=self.seed,
        )  # fmt: skip
        costs = tau2.orchestrator.get_cost(simulation.messages)  # as Orchestrator.run records them (None for local models)
        if costs is not None:
            simulation.agent_cost, simulation.user_cost = costs
        domain = scoring_domain(tau2, self.family.domain)
        kind = tau2.evaluator.EvaluationType.ALL
        failure = self.failure
        try:
            simulation.reward_info = tau2.evaluator.evaluate_simulation(simulation=simulation, task=self.task, evaluation_type=kind,
                                                                        solo_mode=self.family.solo, domain=domain)  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - τ²'s check raised (an assertion on a record never made): no reward
            failure = f"scoring: {type(exc).__name__}: {str(exc)[:300]}"
            simulation.reward_info = tau2.simulation.RewardInfo(reward=0.0, info={"note": f"evaluate_simulation raised {failure}"})
        checks = simulation.reward_info
        if self.termination not in STOPPED:
            stopped = simulation.model_copy(update={"termination_reason": reason.AGENT_STOP})
            try:
                checks = tau2.evaluator.evaluate_simulation(simulation=stopped, task=self.task, evaluation_type=kind,
                                                            solo_mode=self.family.solo, domain=domain)  # fmt: skip
            except Exception as exc:  # noqa: BLE001 - e.g. an environment assertion on a record never made
                checks, failure = None, failure or f"checks: {type(exc).__name__}: {str(exc)[:300]}"
        return simulation, checks, failure

    # -- stepping τ²'s orchestrator ------------------------------------------------------------

    def _run(self, message: Any) -> None:
        """Hand ``message`` to a pushed agent and step the orchestrator until the agent is asked again or the
        conversation ends (an agent that writes its own messages: until it ends), with ``Orchestrator.run``'s
        checks of max_steps and max_errors."""
        o = self.orchestrator
        roles, reason = self.family.tau2.orchestrator.Role, self.family.tau2.simulation.TerminationReason
        if self.pushed:
            self.agent.pending = message
        try:
            if not self.initialized:
                self.initialized = True
                o.initialize()
            while not o.done and not (self.pushed and o.to_role == roles.AGENT and self.agent.pending is None):
                o.step()
                if o.to_role == roles.ENV:
                    continue
                if o.step_count >= o.max_steps:
                    o.done, o.termination_reason = True, reason.MAX_STEPS
                if o.num_errors >= o.max_errors:
                    o.done, o.termination_reason = True, reason.TOO_MANY_ERRORS
        except Exception as exc:  # noqa: BLE001 - a message τ² refuses ends the conversation as τ²'s run would
            if not self.pushed and engine_failure(self.family.tau2, exc):  # seal eval plays it again on resume
                raise EngineError(str(exc)) from exc
            side = "user" if o.to_role == roles.USER else "agent"
            o.done, o.termination_reason = True, (reason.USER_ERROR if side == "user" else reason.AGENT_ERROR)
            self.failure = f"{side}: {type(exc).__name__}: {str(exc)[:500]}"
        if self.pushed:
            self.agent.pending = None
        if o.done:
            self.termination = o.termination_reason.value

    def _last_user_text(self) -> str | None:
        m = self.family.tau2.message
        last = next((msg for msg in reversed(self.orchestrator.trajectory) if isinstance(msg, m.UserMessage)), None)
        return None if last is None else (last.content or "")


def outcome(scored: tuple[Any, Any, Any], *, solo: bool) -> Outcome:
    """The :class:`Outcome` of a scored conversation: τ²'s reward, and Ψ's evidence from its checks
    (solo: the agent makes the user-side gold actions too, so they are its expected tools)."""
    simulation, checks, failure = scored
    reward = float(simulation.reward_info.reward)
    checks = checks if checks is not None else simulation.reward_info  # the checks could not run: the reward's alone
    called: dict[str, list[dict[str, Any]]] = {}
    for message in simulation.messages:
        for call in getattr(message, "tool_calls", None) or []:
            if call.requestor == "assistant":
                called.setdefault(call.name, []).append(call.arguments)
    actions = []
    for check in checks.action_checks or []:
        action = check.action
        status = "matched" if check.action_match else ("other_arguments" if action.name in called else "never_called")
        actions.append({"name": action.name, "requestor": action.requestor, "status": status})
    differences = [f"action.{a['name']}" for a in actions if a["status"] == "other_arguments"]
    if checks.db_check is not None and not checks.db_check.db_match:
        differences.append("database.hash")
    differences += [f"assertion.{c.env_assertion.func_name}" for c in checks.env_assertions or [] if not c.met]
    missing = [c.info for c in checks.communicate_checks or [] if not c.met]
    termination = simulation.termination_reason.value
    if reward < 1 and not differences and not missing:  # every check held (or none could run)
        why = "scoring" if (failure or "").startswith(("scoring", "checks")) else termination
        differences.append(f"conversation.{why}")  # τ² scores no unfinished conversation; a check that raised scores 0
    expected = tuple(a["name"] for a in actions if solo or a["requestor"] == "assistant")
    evidence = {
        "termination_reason": termination, "failure": failure, "actions": actions,
        "communicate": [{"info": c.info, "met": c.met} for c in checks.communicate_checks or []],
        "db_match": None if checks.db_check is None else checks.db_check.db_match,
        "reward_info": simulation.reward_info.model_dump(mode="json"),
        "simulation": simulation.model_dump(mode="json"),
    }  # fmt: skip
    return Outcome(reward, state_ok=not differences if reward < 1 else True, state_differences=tuple(differences),
                   response_ok=not missing or reward >= 1, missing_responses=tuple(missing), expected_tools=expected,
                   evidence=evidence)  # fmt: skip
