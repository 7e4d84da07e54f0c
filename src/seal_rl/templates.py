"""Will this model work with seal-rl? Chat-template families and ``seal templates check``.

A model works in a prompt mode when the ground truth of a few tasks, played through the real
sample builder (:class:`~seal_rl.trajectory.ChatTokens` and the episode driver, as the warm start
plays transcripts), completes every episode with reward 1, and every sample decodes to the chat
template's own rendering of its conversation (the template that :func:`episode_template` picks:
the model's own, or TRL's prefix-preserving training variant where the own one rewrites history).
The ``turn`` layout works too when every message's recorded prompt is the model's own template's
rendering of the conversation before it. Otherwise the mode is refused with the reason and the
setting that fixes it.

The family is the TRL 1.16 template that the tokenizer's template equals (:mod:`seal_rl.families`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from seal_rl.env import BfclEnv, EnvConfig
from seal_rl.errors import SealError
from seal_rl.families import family, trl_templates  # noqa: F401  (re-exported: what seal templates check reports)
from seal_rl.interface import Interface, InterfaceState
from seal_rl.policies import OraclePolicy, ScriptedAgent
from seal_rl.rollout import Budgets, run_episodes
from seal_rl.stops import message_stops
from seal_rl.tasks import Task, TaskSet
from seal_rl.tools import ToolCatalog
from seal_rl.trajectory import ChatTokens, Trajectory, episode_template, prompt_opener, render_or_explain, special_tokens

# The combinations a check plays: BFCL's own prompt (hermes calls in the system prompt's words)
# and the model's template with seal-rl's three call formats and the model's own (native) calls.
MODES = (("bfcl_qwen_fc", "hermes"), ("chat_template", "hermes"), ("chat_template", "json"), ("chat_template", "pythonic"),
         ("chat_template", "native"))  # fmt: skip
CHECK_TASKS = ("multi_turn_base_0", "multi_turn_miss_func_3", "multi_turn_long_context_5", "multi_turn_miss_param_7")


@dataclass
class ModeReport:
    """One prompt mode and call format, as ``seal templates check`` reports it."""

    mode: str
    call_format: str
    works: bool
    template: str | None
    """``own`` (the model's template) or ``trl_training`` (TRL's prefix-preserving variant)"""
    reason: str | None
    """why it does not work, and what to set instead"""
    episodes: int = 0
    success: float | None = None
    longest_prompt_tokens: int | None = None
    """the longest opening prompt of the checked tasks, in this tokenizer's tokens"""
    tools_in_prompt: bool | None = None
    forgets_reasoning: bool | None = None
    """``native``: the template drops past reasoning, which the episode keeps as generated"""
    layouts: list[str] | None = None
    """the sample layouts that work: ``episode`` (samples equal to the rendering) and ``turn`` (each
    message's prompt equal to the model's own template's rendering of the conversation before it)"""
    kept_as_generated: dict[str, str] | None = None
    """terminators the episode layout's samples keep as generated where the template writes
    another in history, ``{generated: written}`` (gpt-oss ``<|return|>`` for ``<|end|>``;
    :mod:`seal_rl.stops`); the ``turn`` layout prompts as at inference"""


def _equal_to_rendering(decoded: str, rendered: str, specials: list[str]) -> bool:
    """The sample is the rendering, up to how a last message ends (an end-of-message token the
    template writes only after the last message, or writes differently there, and whitespace)."""
    sample = _strip_end(decoded, specials)
    if not rendered.startswith(sample):
        return False
    rest = rendered[len(sample) :]
    for special in specials:
        rest = rest.replace(special, "")
    return rest.strip() == ""


def _strip_end(text: str, specials: list[str]) -> str:
    text = text.rstrip()
    for special in specials:
        if special and text.endswith(special):
            return text[: -len(special)].rstrip()
    return text


def _as_history(trajectory: Trajectory, tokenizer: Any, history: dict[str, str]) -> tuple[str, dict[str, str]]:
    """The sample's text with the stop that ends each model message written as the template writes
    it once another message follows (``Stops.history``: gpt-oss's ``<|return|>`` as ``<|end|>``),
    and the pairs so rewritten before the sample's end: what the episode keeps as generated."""
    ids, mask, kept = list(trajectory.completion_ids), trajectory.env_mask, {}
    for k, token in enumerate(ids):
        if not mask[k] or (k + 1 < len(ids) and mask[k + 1]):
            continue  # not the last token of a model message
        text = tokenizer.decode([token])
        if text in history:
            ids[k] = tokenizer.convert_tokens_to_ids(history[text])
            kept |= {text: history[text]} if k + 1 < len(ids) else {}
    return tokenizer.decode(trajectory.prompt_ids + ids, skip_special_tokens=False), kept


def check_mode(tokenizer: Any, mode: str, call_format: str, tasks: list[Task], task_set: TaskSet) -> ModeReport:
    """Play ``tasks``' ground truth in one mode through the sample builder (see the module docstring)."""
    native = call_format == "native"
    try:
        template, _, forgets = episode_template(tokenizer, mode, native=native)
        chat = ChatTokens(tokenizer, chat_template=template, native=native, forgets_reasoning=forgets).for_turns()
    except SealError as error:
        return ModeReport(mode, call_format, False, None, str(error))
    config = EnvConfig(prompt_mode=mode, call_format=call_format)
    catalog = ToolCatalog()
    interface = Interface(mode, InterfaceState.initial("vanilla"), call_format=call_format, catalog=catalog)
    episodes = OraclePolicy().episodes(tasks, task_set, call_format)
    agents = {e.index: ScriptedAgent(list(e.agent.messages)) for e in episodes}
    if chat.stops.end_id is None:
        return ModeReport(mode, call_format, False, None, "The model names no end-of-message token (no eos_token, no "
                          "generation config stops, no template terminator); a model message could not end.")
    from seal_rl.sft import TranscriptGenerator

    try:
        rollouts = run_episodes([(e.index, e.task, {}) for e in episodes], TranscriptGenerator(agents, chat),
                                lambda: BfclEnv(config, interface, catalog=catalog), chat=chat,
                                budgets=Budgets(10**9, 10**9, 10**6), concurrency=1)  # fmt: skip
    except SealError as error:
        return ModeReport(mode, call_format, False, None, str(error))
    specials = special_tokens(tokenizer)
    longest, tools_shown, unequal, turns_unequal, kept = 0, True, [], [], {}
    for episode, rollout in zip(episodes, rollouts):
        _, info = BfclEnv(config, interface, catalog=catalog).reset(episode.task)
        tools = info["tools"] if mode == "chat_template" else None
        longest = max(longest, len(rollout.trajectory.prompt_ids))
        if tools:
            prompt = tokenizer.decode(rollout.trajectory.prompt_ids, skip_special_tokens=False)
            tools_shown &= all(t["function"]["name"] in prompt for t in tools)
        messages = rollout.record["messages"]
        if not native:  # text messages continue the reasoning block the prompt opened
            opener = prompt_opener(render_or_explain(tokenizer, messages[:2], tools=tools, generation_prompt=True, chat_template=template))
            messages = [{**m, "content": opener + m["content"]} if m["role"] == "assistant" else m for m in messages]
        rendered = render_or_explain(tokenizer, messages, tools=tools, generation_prompt=False, chat_template=template)
        decoded, rewritten = _as_history(rollout.trajectory, tokenizer, chat.stops.history)
        if not _equal_to_rendering(decoded, rendered, specials):
            unequal.append(episode.task.id)
        kept |= rewritten
        # the turn layout: each message's prompt is the model's own template's rendering of what came before
        positions = [i for i, m in enumerate(rollout.record["messages"]) if m["role"] == "assistant"]
        own = [render_or_explain(tokenizer, rollout.record["messages"][:i], tools=_tools_at(interface, episode.task, step["turn"], mode),
                                 generation_prompt=True)  # the own template (chat_template None), reasoning where it reads it
               for i, step in zip(positions, rollout.record["steps"])]  # fmt: skip
        if [tokenizer.decode(t[0], skip_special_tokens=False) for t in rollout.trajectory.turns] != own:
            turns_unequal.append(episode.task.id)
    success = sum(r.record["reward"] for r in rollouts) / max(1, len(rollouts))
    reasons = []
    if success < 1:
        failed = [e.task.id for e, r in zip(episodes, rollouts) if r.record["reward"] != 1]
        reasons.append(f"the ground truth did not succeed on {', '.join(failed)}")
    if unequal:
        reasons.append(f"samples differ from the template's rendering on {', '.join(unequal)}")
    if not tools_shown:
        reasons.append("the tools do not reach the prompt; use prompt_mode: bfcl_qwen_fc")
    layouts = [] if reasons else ["episode"] + ([] if turns_unequal else ["turn"])
    return ModeReport(mode, call_format, not reasons, "trl_training" if template else "own", "; ".join(reasons) or None,
                      len(rollouts), success, longest, tools_shown if mode == "chat_template" else None,
                      forgets if native else None, layouts, kept or None)  # fmt: skip


def _tools_at(interface: Interface, task: Task, turn: int, mode: str) -> list[dict[str, Any]] | None:
    """The tools a ``chat_template`` prompt carries in user turn ``turn`` (miss_func reveals add some)."""
    if mode != "chat_template":
        return None
    return interface.tool_specs([*task.functions, *(d for t in range(turn + 1) for d in task.held_out.get(t, ()))])


def check(tokenizer: Any, task_set: TaskSet | None = None, task_ids: tuple[str, ...] = CHECK_TASKS) -> dict[str, Any]:
    """``seal templates check``'s answer: ``{"works", "family", "tasks", "stops", "generation_config_stops",
    "modes": [ModeReport, ...]}``; ``stops``: where a message ends (:func:`seal_rl.stops.message_stops`)."""
    task_set = task_set or TaskSet.load()
    tasks = [task_set.get(t) for t in task_ids]
    modes = [check_mode(tokenizer, mode, call_format, tasks, task_set) for mode, call_format in MODES]
    stops = message_stops(tokenizer)
    return {"works": any(m.works for m in modes), "family": family(tokenizer), "tasks": list(task_ids),
            "stops": [tokenizer.decode([i]) for i in sorted(stops.ids)],
            "generation_config_stops": [tokenizer.decode([i]) for i in stops.configured], "modes": [asdict(m) for m in modes]}  # fmt: skip

