"""Where a model message ends: the stop tokens a model ships with.

A model says where a message ends in three places, and for several families they differ:

* its tokenizer's ``eos_token`` (gpt-oss ``<|return|>``, Gemma 3 ``<eos>``, Phi-3.5 ``<|endoftext|>``);
* its ``generation_config.json``, whose ``eos_token_id`` is an id or a list, and often the only
  place that names the turn terminator (Gemma 3 ``<end_of_turn>``, Phi-3.5 ``<|end|>``, gpt-oss
  ``<|call|>``, Llama 3.1 ``<|eom_id|>``);
* its chat template, which writes a terminator after a model message's content.

:func:`message_stops` joins the three, once per renderer. Generation stops on any of them (hf
``generate``'s ``eos_token_id``, vLLM's ``stop_token_ids``), the sample builder recognises a
message that ended itself by them, scripted transcripts end a message with the template's own
terminator, and ``seal templates check`` plays its transcripts so. The generation config is read
from the directory the tokenizer was loaded from (``tokenizer.name_or_path``), where a model
ships it; a tokenizer built in memory has only its eos and its template.

**A terminator the template rewrites in history.** gpt-oss ends the message it generates last with
``<|return|>`` and writes ``<|end|>`` for the same message once another follows ("``<|return|>``
should never be an input to the model", its template says). The episode layout keeps the
generated token (token in, token out): the sample is exactly what the policy sampled and what
its next call was prompted with during training, so the log-probabilities the loss recomputes
are those of the sampler's contexts. At inference the next prompt shows ``<|end|>``; the ``turn``
layout prompts every message with the model's own template, as at inference. :attr:`Stops.history`
names each such pair and ``seal templates check`` reports the ones its samples kept.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seal_rl.errors import SealError

GENERATION_CONFIG = "generation_config.json"
MARK = "\u2063SEAL\u2063"
"""an invisible marker no model writes, to find where a message's content ends in a rendering"""
PROBE_TOOL = {"type": "function", "function": {"name": "probe_tool_x7", "description": "A probe.",
              "parameters": {"type": "object", "properties": {"probe_arg": {"type": "string"}}, "required": []}}}  # fmt: skip
PROBE_CALL = {"id": "call_0", "type": "function", "function": {"name": "probe_tool_x7", "arguments": {"probe_arg": "v"}}}
_OPENING = ({"role": "system", "content": "S"}, {"role": "user", "content": "Q"})


@dataclass(frozen=True)
class Stops:
    """A model's end-of-message tokens (see the module docstring)."""

    ids: frozenset[int]
    """generation stops on any of these: the generation config's, the tokenizer's eos, the template's terminators"""
    end_id: int | None
    """the token a model ends a plain message with: the template's terminator after a last message
    where it is one of :attr:`ids` (Gemma 3 ``<end_of_turn>``, gpt-oss ``<|return|>``), else the eos"""
    ends: frozenset[str] = frozenset()
    """every text that ends a model message: the stops, and what the template writes right after a
    message's content as the last message, as an earlier one, and after a call"""
    history: dict[str, str] = field(default_factory=dict)
    """a stop the template writes differently once another message follows: ``{generated: written}``
    (gpt-oss ``{"<|return|>": "<|end|>"}``); the episode keeps the generated token"""
    configured: tuple[int, ...] = ()
    """what the model directory's generation config lists (empty without one)"""


def message_stops(tokenizer: Any, chat_template: str | None = None) -> Stops:
    """The stops of ``tokenizer``'s model, with the terminators ``chat_template`` (default: the
    tokenizer's own) writes; see the module docstring."""
    specials = special_tokens(tokenizer)
    configured = tuple(configured_stops(tokenizer))
    eos = tokenizer.eos_token_id
    last, earlier, call = template_terminators(tokenizer, chat_template, specials)
    written = {t for t in (last, call) if t}
    ids = {*configured, *({eos} if eos is not None else ()), *(_single_id(tokenizer, t) for t in written)} - {None}
    last_id = _single_id(tokenizer, last) if last else None
    end_id = last_id if last_id in ids else eos if eos is not None else min(configured, default=None)
    stop_texts = {tokenizer.decode([i]) for i in ids}
    history = {text: earlier for text in sorted(stop_texts) if earlier and text != earlier and text != call}
    return Stops(frozenset(ids), end_id, frozenset((stop_texts | {last, earlier, call}) - {""}), history, configured)  # type: ignore[arg-type]


def configured_stops(tokenizer: Any) -> list[int]:
    """The ``eos_token_id`` of the generation config beside the tokenizer's files (an id or a list),
    checked: ids the vocabulary has. Empty when the tokenizer was not loaded from a directory, or
    the directory has no generation config."""
    folder = Path(str(getattr(tokenizer, "name_or_path", "") or ""))
    path = folder / GENERATION_CONFIG
    if not str(folder) or not path.is_file():
        return []
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
    except (OSError, ValueError, AttributeError) as exc:
        raise SealError(f"{path} is not a readable generation config ({exc}); fix or remove it.") from None
    values = value if isinstance(value, list) else [] if value is None else [value]
    size = len(tokenizer)
    bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < size]
    if bad:
        raise SealError(f"{path}: eos_token_id {bad!r} is not a token id of this tokenizer (0..{size - 1}); fix or remove it.")
    return list(dict.fromkeys(values))


def template_terminators(tokenizer: Any, chat_template: str | None = None, specials: list[str] | None = None) -> tuple[str, str, str]:
    """The special tokens the template writes right after a model message's content — as the last
    message, as an earlier one — and the one that ends a message with a call (where the call's
    own rendering ends in a closing tag or nothing, GLM-4's ``</tool_call>``, the token the
    template writes next, ``<|observation|>``). ``""`` where it writes none or cannot render the probe."""
    specials = special_tokens(tokenizer) if specials is None else specials

    def render(messages: list[dict[str, Any]]) -> str | None:
        for conversation in (messages, messages[1:]):  # without the system message where the template has no such role
            try:
                return tokenizer.apply_chat_template(conversation, tools=[PROBE_TOOL], tokenize=False, add_generation_prompt=False,
                                                     chat_template=chat_template)  # fmt: skip
            except Exception:  # noqa: BLE001, S112 - a template that rejects a probe only has fewer facts
                continue
        return None

    def after_mark(text: str | None) -> str:
        return leading_special(text[text.rindex(MARK) + len(MARK) :], specials) if text and MARK in text else ""

    marked = {"role": "assistant", "content": "A" + MARK}
    ended = render([*_OPENING, marked])
    last = after_mark(ended)
    earlier = after_mark(render([*_OPENING, marked, {"role": "user", "content": "Q2"}]))
    # what the template writes after every conversation's end (Phi-3.5: <|endoftext|>) is not a call's terminator
    closing = ended[ended.rindex(MARK) + len(MARK) + len(last) :].strip() if ended and MARK in ended else ""
    call_message = {"role": "assistant", "content": "", "tool_calls": [PROBE_CALL]}
    rendered = render([*_OPENING, call_message])
    body = rendered.rstrip() if rendered else ""
    body = body[: -len(closing)].rstrip() if closing and body.endswith(closing) else body
    call = trailing_special(body, specials)
    if not call or _closes_a_tag(call, specials):
        result = {"role": "tool", "name": "probe_tool_x7", "tool_call_id": "call_0", "content": "R"}
        extended = render([*_OPENING, call_message, result])
        call = leading_special(extended[len(rendered) :], specials) if rendered and extended and extended.startswith(rendered) else ""
    return last, earlier, call


def special_tokens(tokenizer: Any) -> list[str]:
    """The tokenizer's special and added tokens, longest first (so a prefix match finds the whole token)."""
    return sorted({*tokenizer.all_special_tokens, *getattr(tokenizer, "added_tokens_encoder", {})}, key=len, reverse=True)


def leading_special(text: str, specials: list[str]) -> str:
    """The special token ``text`` starts with (``specials`` longest first: :func:`special_tokens`), or ``""``."""
    return next((s for s in specials if s and text.startswith(s)), "")


def trailing_special(text: str, specials: list[str]) -> str:
    """The special token ``text`` ends with, or ``""``."""
    return next((s for s in specials if s and text.endswith(s)), "")


def _closes_a_tag(token: str, specials: list[str]) -> bool:
    """``</tool_call>`` closes ``<tool_call>``: markup inside a message, not its end."""
    return token.startswith("</") and "<" + token[2:] in specials


def _single_id(tokenizer: Any, token: str) -> int | None:
    ids = tokenizer(token, add_special_tokens=False)["input_ids"]
    return ids[0] if len(ids) == 1 else None
