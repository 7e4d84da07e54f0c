"""Generator factories for training tests (recipe ``generator: tests.generators:oracle_mix``)."""

from __future__ import annotations

from pathlib import Path

from seal_rl.environments import load_family, oracle_messages
from seal_rl.faults import oracle_transcript
from seal_rl.policies import ScriptedAgent
from seal_rl.rollout import Generation
from seal_rl.tools import ToolCall, get_format
from seal_rl.verify import ground_truth_calls

INVENTORY = str(Path(__file__).resolve().parents[1] / "examples" / "families" / "inventory.py") + ":Inventory"
"""the example family (docs/guides/your-environment.md)"""


class OracleMix:
    """Even episodes of a round play the ground truth, odd ones answer every turn in text.

    Groups of G=2 consecutive rollouts of a task then get rewards 1 and 0, so GRPO advantages are
    non-zero and A-Patch visibly scales them.
    """

    def __init__(self) -> None:
        self.agents: dict[tuple[str, int], ScriptedAgent] = {}

    def script(self, request) -> list:
        """The messages the request's episode says, chosen at its first request."""
        if request.episode % 2 == 0:
            return oracle_transcript(request.task, ground_truth_calls(request.task), get_format("hermes"))[0]
        return ["I will not call anything."] * request.task.num_turns

    def generate(self, requests, seed):
        out = []
        for request in requests:
            key = (request.task.id, request.episode)
            if key not in self.agents:
                self.agents[key] = ScriptedAgent(self.script(request))
            text = self.agents[key].act(request.observation, request.info)
            out.append(None if text is None else Generation(text))
        return out


def oracle_mix(trainer):
    return OracleMix()


class FirstTurnOrNothing(OracleMix):
    """Even episodes play the ground truth of the first user turn, then answer in text; odd ones
    answer every turn in text. Every episode fails (binary reward 0: no advantage); the progress
    reward gives even episodes 1 / (scorable turns), odd ones 0."""

    def script(self, request) -> list:
        text = ["I will not call anything."] * request.task.num_turns
        if request.episode % 2 == 0:
            first = oracle_transcript(request.task, ground_truth_calls(request.task)[:1], get_format("hermes"))[0]
            text = [*first, *text[1:]]
        return text


def first_turn_or_nothing(trainer):
    return FirstTurnOrNothing()


class OracleOrPlain:
    """Even episodes play the oracle (reward 1), odd ones the oracle with every turn answered in plain
    text (reward 0). Messages are emitted as a model would: their tokens plus end-of-message."""

    def __init__(self, trainer) -> None:
        from seal_rl.sft import TranscriptGenerator
        from seal_rl.trajectory import ChatTokens

        self.chat = ChatTokens(trainer.processing_class)
        self.agents: dict[int, ScriptedAgent] = {}
        self.inner = TranscriptGenerator(self.agents, self.chat)

    def generate(self, requests, seed):
        for request in requests:
            if request.episode not in self.agents:
                faults = 0.0 if request.episode % 2 == 0 else 1.0
                messages, _ = oracle_transcript(request.task, ground_truth_calls(request.task), get_format("hermes"), faults,
                                                kinds=("plain_text",))  # fmt: skip
                self.agents[request.episode] = ScriptedAgent(messages)
        return self.inner.generate(requests, seed)


def oracle_or_plain(trainer):
    return OracleOrPlain(trainer)


FAILING_TASK = "multi_turn_miss_param_105"


class FirstCallFails(OracleMix):
    """OracleMix, except that every episode of ``FAILING_TASK`` gets a generation error on its
    first call (a server that is down): those episodes end with no tokens at all."""

    def generate(self, requests, seed):
        out = super().generate(requests, seed)
        return [Generation("", error="server down") if r.task.id == FAILING_TASK else g for r, g in zip(requests, out)]


def first_call_fails(trainer):
    return FirstCallFails()


LADDER_TASK = "multi_turn_base_4"
"""three user turns, every one scorable; one oracle call message and one answer per turn"""


def ladder_script(task, episode: int) -> list[tuple[str, int]]:
    """Episode e of a group of 4 plays the ground truth of the first 3 - e user turns, then answers
    each remaining turn in text (tagged with its episode): turn outcomes [1,1,1], [1,1,0], [1,0,0],
    [0,0,0]. Returns (message, user turn) in order."""
    passed = 3 - episode % 4
    script = []
    for turn in range(task.num_turns):
        if turn < passed:
            before = oracle_transcript(task, ground_truth_calls(task)[:turn], get_format("hermes"))[0]
            upto = oracle_transcript(task, ground_truth_calls(task)[: turn + 1], get_format("hermes"))[0]
            script += [(m, turn) for m in upto[len(before):]]
        else:
            script.append((f"Episode {episode % 4} answers turn {turn} in text.", turn))
    return script


class TurnLadder(OracleMix):
    """Plays :func:`ladder_script`: a group of 4 whose episodes pass 3, 2, 1 and 0 leading turns."""

    def script(self, request) -> list:
        return [m for m, _ in ladder_script(request.task, request.episode)]


def turn_ladder(trainer):
    return TurnLadder()


class Silence(OracleMix):
    """Every episode answers every turn in text: every group's rewards are equal (nothing to learn)."""

    def script(self, request) -> list:
        return ["I will not call anything."] * request.task.num_turns


def signal_then_silence(trainer):
    """Round 1 plays :class:`OracleMix` (rewards 1 and 0 in every group), later rounds :class:`Silence`."""
    return OracleMix() if trainer.state.global_step == 0 else Silence()


class InventoryMix(OracleMix):
    """For the inventory family: episodes 0, 2, ... of a round solve their task; 1, 5, ... answer in
    plain text (missing_tool_call); 3, 7, ... call ``move`` with a quantity in words (argument_mismatch)."""

    def __init__(self) -> None:
        super().__init__()
        self.family = load_family(INVENTORY)

    def script(self, request) -> list:
        task = request.task
        if request.episode % 2 == 0:
            return oracle_messages(self.family, task, "hermes")
        if request.episode % 4 == 1:
            return ["I have taken care of it."]
        wrong = {"item": task.data["item"], "source": task.data["source"], "target": task.data["target"], "quantity": "three"}
        return [get_format("hermes").render([ToolCall("move", wrong)]), "Done."]


def inventory_mix(trainer):
    return InventoryMix()
