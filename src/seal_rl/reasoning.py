"""Reasoning kept apart from calls.

Reasoning models (Qwen3, DeepSeek-R1, GLM-4, Nemotron 3) write their thinking in a ``<think>``
block before the answer. The thinking is not the answer: it is never parsed for tool calls, never
verified and never diagnosed (a call the model only considered is not a call it made). BFCL's own
handlers for these models do the same: the response is split at ``</think>`` and only what
follows is decoded.

The message's full text stays in the conversation, so that the chat template renders (or drops)
the reasoning as it does for the model, and the sample's tokens stay the generated ones.
"""

from __future__ import annotations

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
REASONING_FIELDS = ("reasoning_content", "thinking")
"""where a structured message carries its reasoning (Qwen3/GLM templates read the first, gpt-oss the second)"""


def split_reasoning(text: str) -> tuple[str, str]:
    """``(reasoning, answer)`` of one model message.

    The reasoning runs from the first ``<think>`` (or from the start, when the message closes a
    block the generation prompt opened, as DeepSeek-R1's and Qwen3-Thinking's templates do) to the
    last ``</think>``; the answer is the rest. An opened block that never closes (a message cut
    by the token budget while thinking) is all reasoning. A message without either tag is all answer.
    """
    opening = text.find(THINK_OPEN)
    closing = text.rfind(THINK_CLOSE)
    if closing >= 0 and (opening < 0 or opening < closing):
        start = opening if opening >= 0 else 0
        reasoning = text[start + len(THINK_OPEN) if opening >= 0 else 0 : closing]
        return reasoning.strip("\n"), (text[:start] + text[closing + len(THINK_CLOSE) :]).strip("\n")
    if opening >= 0:
        return text[opening + len(THINK_OPEN) :].strip("\n"), text[:opening].strip("\n")
    return "", text


def answer(text: str) -> str:
    """The part of a model message that is its answer (:func:`split_reasoning`)."""
    return split_reasoning(text)[1]
