"""The capability profile C_t: windowed failure statistics of the current policy (SEAL Eq. 14).

    C_t = Agg({Z(τ_j)})

Each round (a training step, or one evaluation run) adds the diagnosed episodes it played; the
profile keeps the last ``window`` rounds and aggregates over them:

* per label: turns carrying it, prevalence (share of countable turns — excluded labels are
  counted but not in the denominator), trajectories carrying it and their mean reward;
* per category, per ``category::label``, per turn position, per task and, for labels whose
  evidence names a tool, per tool.

A profile is immutable (:meth:`CapabilityProfile.add_round` returns a new one), deterministic
(sorted keys), serialisable to JSON, and only ever resumed from an explicit path.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from seal_rl.apatch import LabelEvidence
from seal_rl.diagnose import EXCLUDED_LABELS, Diagnosis, diagnose, evidence_message, stored_diagnosis
from seal_rl.errors import SealError


@dataclass(frozen=True)
class EpisodeLabels:
    """What the profile needs of one diagnosed episode."""

    task_id: str
    category: str
    reward: float
    diagnosis: Diagnosis
    reference_labels: tuple[str, ...] = ()


@dataclass(frozen=True)
class RoundCounts:
    """Counters of one round. Keys of nested maps are strings so the JSON form is the same object."""

    round: int
    episodes: int = 0
    reward_sum: float = 0.0
    labels: dict[str, int] = field(default_factory=dict)
    label_trajectories: dict[str, int] = field(default_factory=dict)
    label_reward_sum: dict[str, float] = field(default_factory=dict)
    categories: dict[str, dict[str, int]] = field(default_factory=dict)
    positions: dict[str, dict[str, int]] = field(default_factory=dict)
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)
    tools: dict[str, dict[str, int]] = field(default_factory=dict)
    label_occurrence_reward_sum: dict[str, float] = field(default_factory=dict)
    reference: dict[str, int] = field(default_factory=dict)
    reference_occurrence_reward_sum: dict[str, float] = field(default_factory=dict)
    inherited: dict[str, int] = field(default_factory=dict)
    """labels of turns whose failure was carried over from an earlier failed turn (not in ``labels``)"""

    @classmethod
    def of(cls, round_index: int, episodes: Iterable[EpisodeLabels]) -> RoundCounts:
        labels, trajectories, rewards, occurrence_rewards = Counter(), Counter(), Counter(), Counter()
        reference, reference_rewards, inherited = Counter(), Counter(), Counter()
        categories: dict[str, Counter] = {}
        positions: dict[str, Counter] = {}
        tasks: dict[str, dict[str, Any]] = {}
        tools: dict[str, Counter] = {}
        n, reward_sum = 0, 0.0
        for episode in episodes:
            n += 1
            reward_sum += episode.reward
            own = [t for t in episode.diagnosis.labels if not t.evidence.get("inherited")]
            names = [t.label for t in own]  # inherited failures were counted on the turn that caused them
            inherited.update(t.label for t in episode.diagnosis.labels if t.evidence.get("inherited"))
            labels.update(names)
            for name in names:
                occurrence_rewards[name] += episode.reward
            reference.update(episode.reference_labels)
            for name in episode.reference_labels:
                reference_rewards[name] += episode.reward
            for name in set(names):
                trajectories[name] += 1
                rewards[name] += episode.reward
            categories.setdefault(episode.category, Counter()).update(names)
            for t in own:
                positions.setdefault(str(t.turn), Counter())[t.label] += 1
                tool = t.evidence.get("call")
                if isinstance(tool, str):
                    tools.setdefault(t.label, Counter())[tool] += 1
            task = tasks.setdefault(episode.task_id, {"episodes": 0, "reward_sum": 0.0, "labels": Counter()})
            task["episodes"] += 1
            task["reward_sum"] += episode.reward
            task["labels"].update(names)
        return RoundCounts(
            round=round_index,
            episodes=n,
            reward_sum=reward_sum,
            labels=dict(sorted(labels.items())),
            label_trajectories=dict(sorted(trajectories.items())),
            label_reward_sum=dict(sorted(rewards.items())),
            categories={k: dict(sorted(v.items())) for k, v in sorted(categories.items())},
            positions={k: dict(sorted(v.items())) for k, v in sorted(positions.items(), key=lambda kv: int(kv[0]))},
            tasks={k: {**v, "labels": dict(sorted(v["labels"].items()))} for k, v in sorted(tasks.items())},
            tools={k: dict(sorted(v.items())) for k, v in sorted(tools.items())},
            label_occurrence_reward_sum=dict(sorted(occurrence_rewards.items())),
            reference=dict(sorted(reference.items())),
            reference_occurrence_reward_sum=dict(sorted(reference_rewards.items())),
            inherited=dict(sorted(inherited.items())),
        )


@dataclass(frozen=True)
class LabelStats:
    """A label over the profile window."""

    turns: int
    prevalence: float
    trajectories: int
    mean_reward: float


def _merge(maps: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in maps:
        for key, value in m.items():
            if isinstance(value, Mapping):
                out[key] = _merge([out.get(key, {}), value])
            else:
                out[key] = out.get(key, 0) + value
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class CapabilityProfile:
    """C_t over the last ``window`` rounds."""

    window: int = 1
    rounds: tuple[RoundCounts, ...] = ()

    def __post_init__(self) -> None:
        if self.window < 1:
            raise SealError(f"The profile window must be at least 1 round, got {self.window}.")

    @property
    def round(self) -> int:
        """The newest round in the window (0 when empty)."""
        return self.rounds[-1].round if self.rounds else 0

    def add_round(self, round_index: int, episodes: Iterable[EpisodeLabels]) -> CapabilityProfile:
        """A new profile with this round added and rounds older than the window dropped."""
        if self.rounds and round_index <= self.round:
            raise SealError(f"Round {round_index} is not after the profile's last round {self.round}.")
        kept = (*self.rounds, RoundCounts.of(round_index, episodes))[-self.window :]
        return CapabilityProfile(self.window, kept)

    # -- aggregates over the window ----------------------------------------------------------

    def merged(self, name: str) -> dict[str, Any]:
        return _merge(getattr(r, name) for r in self.rounds)

    @property
    def episodes(self) -> int:
        return sum(r.episodes for r in self.rounds)

    def label_stats(self) -> dict[str, LabelStats]:
        """Per label: turns, prevalence among countable turns, trajectories, their mean reward."""
        labels = self.merged("labels")
        trajectories = self.merged("label_trajectories")
        rewards = self.merged("label_reward_sum")
        countable = sum(n for label, n in labels.items() if label not in EXCLUDED_LABELS)
        return {
            label: LabelStats(
                turns=n,
                prevalence=n / countable if countable and label not in EXCLUDED_LABELS else 0.0,
                trajectories=trajectories.get(label, 0),
                mean_reward=rewards.get(label, 0.0) / trajectories[label] if trajectories.get(label) else 0.0,
            )
            for label, n in labels.items()
        }

    def apatch_evidence(self, preset: str, excluded: frozenset[str]) -> dict[str, LabelEvidence]:
        """Per label of the preset's label set: occurrences, prevalence among countable
        occurrences, and the mean trajectory reward over occurrences (the closed-loop inputs)."""
        counts = self.merged("labels" if preset == "seal" else "reference")
        rewards = self.merged("label_occurrence_reward_sum" if preset == "seal" else "reference_occurrence_reward_sum")
        countable = sum(n for label, n in counts.items() if label not in excluded)
        return {
            label: LabelEvidence(n, n / countable if countable and label not in excluded else 0.0, rewards.get(label, 0.0) / n)
            for label, n in counts.items()
            if n
        }

    def tools_with(self, label: str) -> list[str]:
        """Tools named in the evidence of this label within the window, most frequent first."""
        counts = self.merged("tools").get(label, {})
        return [tool for tool, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]

    # -- persistence -------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        return {"window": self.window, "rounds": [r.__dict__ for r in self.rounds]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CapabilityProfile:
        try:
            return cls(int(data["window"]), tuple(RoundCounts(**r) for r in data["rounds"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise SealError(f"Not a capability profile ({exc}).") from None

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n")

    @classmethod
    def load(cls, path: Path) -> CapabilityProfile:
        """Resume from a profile file written by :meth:`save` (never found implicitly)."""
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise SealError(f"Profile file {path} does not exist.") from None
        except ValueError as exc:
            raise SealError(f"Profile file {path} is not valid JSON ({exc}).") from None
        return cls.from_json(data)


@dataclass(frozen=True)
class RunProfile:
    """The failure profile of one run: a one-round profile plus the commonest messages per label."""

    profile: CapabilityProfile
    top_messages: dict[str, list[tuple[str, int]]]


def describe_run(records: Iterable[Mapping[str, Any]], top: int = 3, priority: str | None = None) -> RunProfile:
    """Diagnose (or reuse stored labels of) a run's records and aggregate them; with ``priority``
    every record is diagnosed afresh under that priority preset."""
    episodes, messages = [], {}
    for record in records:
        diagnosis = diagnose(record, priority) if priority else stored_diagnosis(record) or diagnose(record)
        reference = tuple(record.get("reference_labels") or ())
        episodes.append(EpisodeLabels(record["task_id"], record["category"], record["reward"], diagnosis, reference))
        for label in diagnosis.labels:
            message = evidence_message(label)
            if message:
                messages.setdefault(label.label, Counter())[message] += 1
    tops = {label: counter.most_common(top) for label, counter in sorted(messages.items())}
    return RunProfile(CapabilityProfile(window=1).add_round(1, episodes), tops)

