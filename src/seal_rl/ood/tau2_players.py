"""The players of a τ² run from their command-line specs (``--policy`` for the agent, ``--user``).

``oracle`` (both sides scripted), ``hf:`` / ``vllm:`` (a local model; the agent and a user with the
same spec share one engine, so the weights load once) and ``openai:MODEL@URL`` (litellm's own
OpenAI provider, the key from ``--api-key-env``). Replays and ``bfcl-result:`` files are BFCL's
and have no τ² conversation to play. Every spec is checked, and every model loaded, before the
first conversation starts.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from seal_rl.env import EnvConfig
from seal_rl.errors import SealError
from seal_rl.ood.tau2_models import Engine
from seal_rl.ood.tau2_run import Player
from seal_rl.policies import ModelPolicy, OraclePolicy, ServerPolicy, VLLMPolicy, parse_policy

USER_TEMPERATURE = 0.0
"""τ²'s user simulator temperature (``tau2.config.DEFAULT_LLM_TEMPERATURE_USER``)"""


def _policy(spec: str, side: str) -> Any:
    """The policy of ``spec`` for ``side`` (``--policy`` or ``--user``), or one line on what τ² can play."""
    try:
        chosen = parse_policy(spec)
    except SealError as exc:
        raise SealError(f"{side} {spec!r}: {exc}") from None
    if isinstance(chosen, OraclePolicy) and spec != "oracle":
        raise SealError(f"{side} {spec!r}: τ²'s oracle takes no options; use {side} oracle.")
    if not isinstance(chosen, (OraclePolicy, ModelPolicy, VLLMPolicy, ServerPolicy)):
        raise SealError(f"{side} {spec!r} cannot play τ²-bench: choose oracle, hf:MODEL, vllm:MODEL or openai:MODEL@URL.")
    return chosen


def check_specs(agent_spec: str, user_spec: str | None) -> tuple[Any, Any, str]:
    """Both sides' policies and the user's spec; one line for a spec τ² cannot play or a missing
    ``--user`` (a model agent needs a user simulator; the oracle agent defaults to the scripted user)."""
    agent = _policy(agent_spec, "--policy")
    if user_spec is None:
        if not isinstance(agent, OraclePolicy):
            raise SealError("A model agent needs a user simulator: pass --user POLICY (hf:MODEL, vllm:MODEL or "
                            "openai:MODEL@URL; e.g. --user hf:qwen2.5-coder-0.5b-instruct).")  # fmt: skip
        user_spec = "oracle"
    user = _policy(user_spec, "--user")
    if isinstance(agent, OraclePolicy) != isinstance(user, OraclePolicy):
        raise SealError("The scripted oracle plays both sides or neither: pass --policy oracle with --user oracle.")
    return agent, user, user_spec


def _server_player(spec: str, policy: ServerPolicy, settings: Any, temperature: float) -> Player:
    args: dict[str, Any] = {"api_base": policy.url, "temperature": temperature, "timeout": settings.timeout,
                            "num_retries": settings.max_retries, "max_tokens": settings.max_new_tokens}  # fmt: skip
    key = os.environ.get(settings.api_key_env)
    args["api_key"] = key or "EMPTY"  # local servers take any key; never written to a file
    return Player(spec, llm=f"openai/{policy.model}", llm_args=args)


@contextmanager
def players(agent_spec: str, user_spec: str | None, settings: Any, *, prompt_mode: str, call_format: str, out: Path,
            overwrite: bool, user_temperature: float = USER_TEMPERATURE) -> Iterator[tuple[Player, Player, dict[str, Any]]]:  # fmt: skip
    """``(agent, user, precision)`` for the run, with local models loaded (and closed afterwards);
    ``precision``: what each local model's weights load in, as ``config.json`` records it."""
    from seal_rl.evaluate import make_generator, run_precision

    agent_policy, user_policy, user_spec = check_specs(agent_spec, user_spec)
    if isinstance(agent_policy, OraclePolicy):
        yield Player("oracle"), Player("oracle"), {}
        return
    env_config = EnvConfig(prompt_mode=prompt_mode, call_format=call_format)
    engines: dict[tuple[str, float], Engine] = {}
    precision: dict[str, Any] = {}
    try:
        made = []
        for side, spec, policy, temperature in (("agent", agent_spec, agent_policy, settings.temperature),
                                                ("user", user_spec, user_policy, user_temperature)):  # fmt: skip
            if isinstance(policy, ServerPolicy):
                made.append(_server_player(spec, policy, settings, temperature))
                continue
            key = "precision" if side == "agent" else "user_precision"
            chosen = run_precision(policy, settings, out, overwrite, key=key)
            if chosen.record is not None:
                precision[key] = chosen.record
            if (spec, temperature) not in engines:  # one engine per model and temperature
                side_settings = replace(settings, dtype=chosen.dtype, temperature=temperature)
                generator, chat, _ = make_generator(policy, side_settings, env_config, [])
                print(f"{side}: {chosen.why}", file=sys.stderr)
                engines[spec, temperature] = Engine(generator, chat, prompt_mode=prompt_mode, call_format=call_format,
                                       max_new_tokens=settings.max_new_tokens, scheduler=settings.rollout_scheduler)  # fmt: skip
            made.append(Player(spec, engine=engines[spec, temperature], llm_args={"temperature": temperature}))
        yield made[0], made[1], precision
    finally:
        for engine in engines.values():
            engine.close()
