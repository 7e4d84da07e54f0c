"""The SEAL paper's case studies E.1–E.4, replayed: rewards and per-turn diagnosis labels.

Each ``tests/cases/E<n>_<model>.jsonl`` holds the assistant messages of one transcript of the
paper's appendix E (base model, or the SEAL-trained model), rebuilt from the PDF; what the PDF
abridged is listed in ``tests/cases/README.md``. Turns are 0-based here: the paper's "User Query 1"
is turn 0.

The expected labels are what the paper's account of each case supports under these diagnosis
rules (quoted sentences are from the paper's "Failure analysis" / "Success analysis" paragraphs,
or from the appendix summary in docs where said):

* an execution-level label (invalid_tool_call, argument_mismatch, recovery_failure) only when the
  failed call plausibly caused the turn's failure: the same tool never succeeds later in the turn,
  or the turn's missing ground-truth output or differing state belongs to that tool's class;
  otherwise the checker-level label;
* missing_tool_call when the model never made an accepted call to a tool the ground-truth turn
  needed, even if it made other calls;
* a turn whose differences are all carried over from an earlier failed turn keeps the checker's
  label with ``evidence["inherited"] is True``;
* passing turns: pass.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from seal_rl.diagnose import diagnose
from seal_rl.env import BfclEnv
from seal_rl.evaluate import play
from seal_rl.policies import ReplayPolicy

CASES = Path(__file__).parent / "cases"


@dataclass(frozen=True)
class Turn:
    label: str
    inherited: bool = False
    """all of the turn's differences are carried over from an earlier failed turn"""


@dataclass(frozen=True)
class Case:
    task_id: str
    reward: float
    turns: dict[int, Turn]


PASS = Turn("pass")

EXPECTED: dict[str, Case] = {
    # ---- E.1 File-System State Tracking (multi_turn_base_24) -------------------------------------
    "E1_base": Case("multi_turn_base_24", 0.0, {
        # "The base model locates the relevant file names only after an initial failure": diff on
        # the guessed names fails and is never retried in turn 0; the missing output is diff's.
        0: Turn("recovery_failure"),
        # "[it] continues to issue invalid path-style arguments to mv. This indicates that it does
        # not convert the execution error into a revised state-aware plan." mv never succeeds.
        1: Turn("recovery_failure"),
        # Appendix summary: "Its later ticket retrieval call is itself correct." The only difference
        # is the file system left wrong in turn 1.
        2: Turn("state_mismatch", inherited=True),
        # Not in the paper's base transcript (README: assumed the SEAL model's resolve_ticket call);
        # the failure analysis names only the mv turn, so the file system is again all that differs.
        3: Turn("state_mismatch", inherited=True),
    }),
    "E1_seal": Case("multi_turn_base_24", 1.0, {
        # "The SEAL-trained model uses observable directory contents to infer the actual file names,
        # then respects the local-directory constraint by moving into archives before renaming."
        0: PASS, 1: PASS, 2: PASS, 3: PASS,
    }),
    # ---- E.2 Recovering from API Parameter Mismatch (multi_turn_miss_param_150) ------------------
    "E2_base": Case("multi_turn_miss_param_150", 0.0, {
        # "The base model treats guessed airport codes as final and does not use the
        # airport-resolution tools after the route error." get_flight_cost never succeeds.
        0: Turn("recovery_failure"),
        # Turn 1 has no ground truth (the amount is missing); the base model asks in plain text.
        1: Turn("correct_abstention"),
        # "It also sets the GBP amount directly as the budget limit, missing the required currency
        # conversion." compute_exchange_rate is never called: missing_tool_call under the rules
        # (the appendix summary's wording, "a state error", would be state_mismatch; see README).
        2: Turn("missing_tool_call"),
    }),
    "E2_seal": Case("multi_turn_miss_param_150", 1.0, {
        # "The SEAL-trained model recovers by using the missing airport-resolution tools and later
        # converts GBP to USD before calling set_budget_limit." The route error is recovered from.
        0: PASS,
        1: Turn("correct_abstention"),
        2: PASS,
    }),
    # ---- E.3 Cross-Domain Tool Composition (multi_turn_base_147) ---------------------------------
    "E3_base": Case("multi_turn_base_147", 0.0, {
        # "The base model substitutes Apple for Omega Industries after the guessed symbol fails,
        # thereby changing the user's target entity." The failed lookup is not recovered from: the
        # missing ground-truth output is get_stock_info('OMEG')'s, the failed tool's own class.
        0: Turn("recovery_failure"),
        # "It also posts a new tweet rather than adding the new mention to the existing tweet."
        # mention is never called; its own new tweet is a difference of this turn (not inherited).
        1: Turn("missing_tool_call"),
    }),
    "E3_seal": Case("multi_turn_base_147", 1.0, {
        # "The SEAL-trained model treats the failed symbol lookup as recoverable evidence, resolves
        # the company name to OMEG, retrieves the correct price" -- a failed lookup recovered from
        # is not a recovery_failure.
        0: PASS,
        # "and updates the existing tweet with the dedicated mention tool."
        1: PASS,
    }),
    # ---- E.4 Vehicle-Control State Maintenance (multi_turn_long_context_88) ----------------------
    "E4_base": Case("multi_turn_long_context_88", 0.0, {
        # The failed liter_to_gallon(gallon=...) is followed by the right gallon_to_liter call; the
        # paper's account names no failure here.
        0: PASS,
        # "The base model verbally computes the remaining capacity but never executes fillFuelTank."
        # fillFuelTank is never called (other calls were made): missing_tool_call under the rules.
        1: Turn("missing_tool_call"),
        # "The later engine check therefore reports fuelLevel = 13.2, revealing that the required
        # state update did not occur" (the fuel difference is carried over from turn 1), and the
        # appendix summary: it "handles a brake-pedal error the same way the SEAL model does; its
        # real remaining failure is a missing tweet, not the error handling." post_tweet is never
        # called; the tweet is this turn's own difference, so the turn is not wholly inherited.
        2: Turn("missing_tool_call"),
    }),
    "E4_seal": Case("multi_turn_long_context_88", 1.0, {
        # "The SEAL-trained model executes the state-changing fillFuelTank call before later checking
        # the engine state." Its brake-pedal error is recovered from within turn 2.
        0: PASS, 1: PASS, 2: PASS,
    }),
}  # fmt: skip

# Phrases of the paper's user queries that the pinned task's questions must contain (turn: phrases).
PAPER_QUERIES = {
    "multi_turn_base_24": {0: ["draft", "final report", "difference"],
                           1: ["temp_notes.txt", "archives", "notes_2024.txt"],
                           2: ["987654", "Retrieve"],
                           3: ["resolve", "Fixed through manual troubleshooting techniques."]},
    "multi_turn_miss_param_150": {0: ["Rivermist", "Stonebrook", "economy", "6th day of October in 2026"],
                                  1: ["anchor my daily spend at a specific amount"],
                                  2: ["15400 GBP", "abc123token"]},
    "multi_turn_base_147": {0: ["Omega Industries", "price", "#TechBoom", "@industryexperts"],
                            1: ["@technewsworld", "amplify"]},
    "multi_turn_long_context_88": {0: ["13.2 gallons", "liters"],
                                   1: ["filling the tank to the max", "doors", "parking brake"],
                                   2: ["'START'", "fuel level", "post a tweet", "#RoadTrip #Adventure #Exploring"]},
}  # fmt: skip

# Tool responses the paper prints, which the replay must reproduce (substrings of the tool results).
PAPER_RESPONSES = {
    "E1_base": ['"matches": []', "diff: draft_report or final_report: No such file or directory",
                "mv: path not allowed in destination. Provide only a file or directory name.",
                "mv: cannot move 'archives/temp_notes.txt': No such file or directory",
                '"current_directory_content": ["report_draft.txt", "report_final.txt", "temp_notes.txt", "archives"]',
                '"description": "Issue with workstation not booting properly."'],
    "E1_seal": ['"diff_lines": "- Initial draft content for the report.\\n+ Finalized content for the report."',
                "'temp_notes.txt' moved to 'archives/temp_notes.txt'", "'temp_notes.txt' moved to 'notes_2024.txt'",
                "Ticket 987654 has been resolved successfully."],
    "E2_base": ["No available route for the given airports.", '{"budget_limit": 15400.0}'],
    "E2_seal": ['{"nearest_airport": "RMS"}', '{"nearest_airport": "SBK"}', '{"travel_cost_list": [220.0]}',
                '{"exchanged_value": 22000.0}', '{"budget_limit": 22000.0}'],
    "E3_base": ["Stock with symbol 'OMGA' not found.", '"price": 227.16'],
    "E3_seal": ['{"symbol": "OMEG"}', '"price": 457.23', '{"mention_status": "Users mentioned successfully"}'],
    "E4_base": ["unexpected keyword argument 'gallon'", '{"liter": 49.967411999999996}',
                "Brake pedal needs to be pressed when starting the engine.",
                '{"engineState": "running", "fuelLevel": 13.2, "batteryVoltage": 12.6}'],
    "E4_seal": ['{"fuelLevel": 50.0}', '{"lockStatus": "locked", "remainingUnlockedDoors": 0}',
                "Brake pedal needs to be pressed when starting the engine.",
                '{"engineState": "running", "fuelLevel": 50.0, "batteryVoltage": 12.6}'],
}  # fmt: skip


@pytest.fixture(scope="module")
def records(task_set):
    """Each replay played once through the environment and the verifier."""
    played = {}
    for name in EXPECTED:
        (episode,) = ReplayPolicy(CASES / f"{name}.jsonl").episodes([], task_set, "hermes")
        played[name] = play(BfclEnv(), episode)
    return played


def _replay_line(name: str) -> dict:
    return json.loads((CASES / f"{name}.jsonl").read_text(encoding="utf-8"))


def test_every_replay_has_expectations():
    assert sorted(p.stem for p in CASES.glob("*.jsonl")) == sorted(EXPECTED)


@pytest.mark.parametrize("task_id", sorted(PAPER_QUERIES))
def test_pinned_tasks_ask_the_papers_questions(task_set, task_id):
    task = task_set.get(task_id)
    assert task.num_turns == len(PAPER_QUERIES[task_id])
    for turn, phrases in PAPER_QUERIES[task_id].items():
        question = " ".join(m["content"] for m in task.questions[turn])
        for phrase in phrases:
            assert phrase in question, (turn, phrase)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_replay_plays_every_turn_with_the_papers_tool_responses(records, name):
    record, line = records[name], _replay_line(name)
    assert line["task_id"] == EXPECTED[name].task_id == record["task_id"]
    assert record["end_reason"] == "completed" and record["turns_reached"] == record["num_turns"]
    per_turn = [sum(1 for s in record["steps"] if s["turn"] == t) for t in range(record["num_turns"])]
    assert per_turn == line["messages_per_turn"]  # each turn ends on the message the file says
    results = " ".join(e["result"] or "" for e in record["trace"])
    for response in PAPER_RESPONSES[name]:
        assert response in results


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_reward_matches_the_paper(records, name):
    assert records[name]["reward"] == EXPECTED[name].reward == _replay_line(name)["paper_reward"]


@pytest.mark.parametrize(
    "name, turn", [(name, turn) for name, case in sorted(EXPECTED.items()) for turn in sorted(case.turns)]
)
def test_turn_label_matches_the_papers_account(records, name, turn):
    labels = diagnose(records[name]).labels
    assert len(labels) == len(EXPECTED[name].turns)
    expected, got = EXPECTED[name].turns[turn], labels[turn]
    assert got.label == expected.label, got.evidence
    if expected.inherited:
        assert got.evidence.get("inherited") is True, got.evidence
    elif expected.label != "pass":
        assert got.evidence.get("inherited") is not True, got.evidence
