"""The players of a τ² conversation from their specs: ``seal eval``'s ``--policy`` (the agent) and
``--user``, and a training family's ``family_settings.user``.

``oracle`` (scripted), ``hf:`` / ``vllm:`` (a local model served to τ² through litellm's ``seal-rl``
provider, :mod:`seal_rl.environments.tau2_models`; the agent and a user with the same spec share one
engine, so the weights load once) and ``openai:MODEL@URL`` (litellm's own OpenAI provider, the key
from ``--api-key-env``). Replays and ``bfcl-result:`` files are BFCL's and have no τ² conversation
to play. Every spec is checked, and every model loaded, before the first conversation starts.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from seal_rl.env import EnvConfig
from seal_rl.environments.tau2_models import Engine, serving
from seal_rl.errors import SealError
from seal_rl.policies import ModelPolicy, OraclePolicy, ServerPolicy, VLLMPolicy, parse_policy

USER_TEMPERATURE = 0.0
"""τ²'s user simulator temperature (``tau2.config.DEFAULT_LLM_TEMPERATURE_USER``)"""


@dataclass(frozen=True)
class Player:
    """Who plays one side: ``oracle``, or a litellm model (``llm``, ``llm_args``) for τ²'s LLM classes
    (a local model's ``llm`` is its name under litellm's ``seal-rl`` provider while :func:`players` lasts)."""

    spec: str
    llm: str | None = None
    llm_args: dict[str, Any] = field(default_factory=dict)

    @property
    def scripted(self) -> bool:
        return self.spec == "oracle"


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


def _local_engine(side: str, spec: str, policy: Any, settings: Any, env_config: EnvConfig, temperature: float, out: Path | None,
                  overwrite: bool, precision: dict[str, Any]) -> Engine:  # fmt: skip
    """A local model's (``hf:``, ``vllm:``) engine, its dtype chosen as ``seal eval`` chooses it and recorded in
    ``precision`` (``out``: the run directory whose ``config.json`` a resumed run keeps its dtype from)."""
    from seal_rl.evaluate import make_generator, run_precision

    key = "precision" if side == "agent" else "user_precision"
    chosen = run_precision(policy, settings, out or Path(), overwrite or out is None, key=key)
    if chosen.record is not None:
        precision[key] = chosen.record
    generator, chat, _ = make_generator(policy, replace(settings, dtype=chosen.dtype, temperature=temperature), env_config, [])
    print(f"{side}: {chosen.why}", file=sys.stderr)
    return Engine(generator, chat, prompt_mode=env_config.prompt_mode, call_format=env_config.call_format,
                  max_new_tokens=settings.max_new_tokens, scheduler=settings.rollout_scheduler)  # fmt: skip


@contextmanager
def players(agent_spec: str, user_spec: str | None, settings: Any, *, prompt_mode: str, call_format: str, out: Path,
            overwrite: bool, user_temperature: float = USER_TEMPERATURE) -> Iterator[tuple[Player, Player, dict[str, Any]]]:  # fmt: skip
    """``(agent, user, precision)`` for the run, with local models loaded, served to litellm (and closed
    afterwards); ``precision``: what each local model's weights load in, as ``config.json`` records it."""
    from seal_rl.environments.tau2_bench import load_tau2

    agent_policy, user_policy, user_spec = check_specs(agent_spec, user_spec)
    if isinstance(agent_policy, OraclePolicy):
        yield Player("oracle"), Player("oracle"), {}
        return
    env_config = EnvConfig(prompt_mode=prompt_mode, call_format=call_format)
    engines: dict[str, Engine] = {}
    precision: dict[str, Any] = {}
    try:
        made: list[Player | str] = []
        for side, spec, policy, temperature in (("agent", agent_spec, agent_policy, settings.temperature),
                                                ("user", user_spec, user_policy, user_temperature)):  # fmt: skip
            if isinstance(policy, ServerPolicy):
                made.append(_server_player(spec, policy, settings, temperature))
                continue
            name = f"{spec}@{temperature}"  # one engine per model and temperature: the weights load once
            if name not in engines:
                engines[name] = _local_engine(side, spec, policy, settings, env_config, temperature, out, overwrite, precision)
            made.append(name)
        with serving(load_tau2().litellm, engines) as names:
            sides = [p if isinstance(p, Player) else Player(spec, llm=names[p], llm_args={"temperature": t})
                     for p, spec, t in zip(made, (agent_spec, user_spec), (settings.temperature, user_temperature))]  # fmt: skip
            yield sides[0], sides[1], precision
    finally:
        for engine in engines.values():
            engine.close()


@contextmanager
def user_player(spec: str, settings: Any = None) -> Iterator[Player]:
    """A training family's simulated user (``family_settings.user``) for the duration: ``oracle``, an
    ``openai:MODEL@URL`` server, or a local ``hf:`` / ``vllm:`` model loaded here and served to litellm.
    ``settings``: the user's :class:`~seal_rl.evaluate.ModelSettings` (default: τ²'s temperature 0)."""
    from seal_rl.environments.tau2_bench import load_tau2
    from seal_rl.evaluate import ModelSettings

    if spec == "oracle":
        yield Player("oracle")
        return
    settings = settings or ModelSettings(temperature=USER_TEMPERATURE)
    policy = _policy(spec, "family_settings.user")
    if isinstance(policy, OraclePolicy):
        raise SealError("family_settings.user 'oracle' takes no options.")
    if isinstance(policy, ServerPolicy):
        args = {"api_base": policy.url, "api_key": os.environ.get(settings.api_key_env) or "EMPTY",
                "temperature": settings.temperature, "timeout": settings.timeout, "max_tokens": settings.max_new_tokens}  # fmt: skip
        yield Player(spec, llm=f"openai/{policy.model}", llm_args=args)
        return
    engine = _local_engine("user", spec, policy, settings, EnvConfig(), settings.temperature, None, True, {})
    try:
        with serving(load_tau2().litellm, {"user": engine}) as names:
            yield Player(spec, llm=names["user"], llm_args={"temperature": settings.temperature})
    finally:
        engine.close()
