"""Run directories written by hand for the report tests: every field the report reads, in the
shapes seal eval / seal train write them, with no model and no environment (fast)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from seal_rl.interface import InterfaceState


def episode(task_id: str, category: str, *, reward: float = 0.0, index: Any = 1, sample: Any = 0, text: str = "done",
            end_reason: str = "completed", labels: tuple[str, ...] = ("pass",), **extra: Any) -> dict[str, Any]:
    """One finished episode: per label a turn with a question and a text answer (no calls)."""
    messages = [{"role": "system", "content": "# Tools"}]
    steps = []
    for turn, _ in enumerate(labels):
        messages += [{"role": "user", "content": f"question {turn}"}, {"role": "assistant", "content": text}]
        steps.append({"turn": turn, "event": "next_turn" if turn + 1 < len(labels) else "end"})
    return {
        "index": index, "task_id": task_id, "category": category, "reward": reward, "end_reason": end_reason,
        "turns_reached": len(labels), "num_turns": len(labels), "model_calls": len(labels), "messages": messages,
        "steps": steps, "trace": [], "verdict": {"reward": reward}, "sample": sample,
        "diagnosis": {"labels": [{"turn": t, "label": z, "evidence": {}} for t, z in enumerate(labels)],
                      "progress": 0.0, "progress_with_abstentions": 0.0},
        "reference_labels": list(labels), **extra,
    }  # fmt: skip


def write_eval_run(out: Path, records: list[dict[str, Any]], config: dict[str, Any] | None = None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    (out / "config.json").write_text(json.dumps(config or {"policy": "hand-written"}))
    return out


def write_training_run(out: Path, *, rounds: int = 4, per_round: int = 4, zero_signal: bool = False,
                       trl_lines: bool = False, time_json: bool = True, text: str = "done") -> Path:  # fmt: skip
    """A SEAL run directory: metrics.jsonl, trajectories.jsonl, interface/step_N.json, time.json and
    a checkpoint's trainer_state.json. Round r uses the base interface for r = 1 and, from round 2,
    the active_respond guideline and the tool list, switched on by missing_tool_call pressure."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text("env:\n  prompt_mode: bfcl_qwen_fc\n  call_format: hermes\n")
    (out / "interface").mkdir()
    metrics, rows, history = [], [], []
    on = InterfaceState(preset="seal", guidelines=("active_respond",), tool_list=True, pressure=("missing_tool_call",))
    for r in range(1, rounds + 1):
        used = InterfaceState(preset="seal", round=r - 1) if r == 1 else InterfaceState(**{**on.to_json(), "round": r - 1})
        (out / "interface" / f"step_{r}.json").write_text(json.dumps({"used": used.to_json(), "next": used.to_json(), "changes": {}}))
        rewards = [0.0] * per_round if zero_signal else [float(i % 2) for i in range(per_round)]
        for i, reward in enumerate(rewards):
            task = "multi_turn_base_105" if i % 2 else "multi_turn_miss_param_105"
            row = episode(task, "base" if i % 2 else "miss_param", reward=reward, text=text,
                          labels=("pass",) if reward else ("missing_tool_call",))  # fmt: skip
            del row["steps"]  # training rows have no steps: the report infers them from the trace
            rows.append({**row, "round": r, "step": r - 1, "group": f"{r}:{task}", "labels": row["reference_labels"],
                         "apatch_weight": 1.0 + 0.1 * i, "advantage_before": reward - 0.5, "advantage_after": 1.1 * (reward - 0.5)})  # fmt: skip
        metrics.append({
            "round": r, "step": r - 1, "kind": "rollout", "rollout/reward_mean": sum(rewards) / len(rewards),
            "rollout/groups_zero_variance": 1.0 if zero_signal else 0.0, "labels/share": {"pass": 0.5, "missing_tool_call": 0.5},
            "apatch/scale_mean": 1.1, "apatch/scale_min": 1.0, "apatch/scale_max": 1.3,
            "apatch/label_weights": {"pass": 1.0, "missing_tool_call": 1.5}, "interface/active": used.active_components,
            "time/seconds": {"generation": 2.0 * r, "environment": 1.0 * r, "optimisation": 10.0 * (r - 1)},
        })  # fmt: skip
        trl = {"loss": 0.0 if zero_signal else 0.5 / r, "kl": 0.01 * r, "entropy": 2.0, "grad_norm": 0.0 if zero_signal else 1.0,
               "clip_ratio/region_mean": 0.0, "completions/mean_length": 40.0, "frac_reward_zero_std": 1.0 if zero_signal else 0.0}  # fmt: skip
        history.append({**trl, "step": r})
        if trl_lines:
            metrics.append({"kind": "train", "step": r, **{f"train/{k}": v for k, v in trl.items()}})
    (out / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    (out / "trajectories.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    if time_json:
        (out / "time.json").write_text(json.dumps({"round": rounds, "step": rounds, "time/seconds": {
            "generation": 2.0 * rounds, "environment": 1.0 * rounds, "optimisation": 10.0 * rounds}}))  # fmt: skip
    checkpoint = out / "checkpoints" / f"checkpoint-{rounds}"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": rounds, "log_history": history}))
    return out
