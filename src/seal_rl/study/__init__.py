"""``seal study``: does SEAL help on this model and these tasks? Arms over seeds, from one start.

A study (docs/guides/preflight-and-studies.md) trains every arm — SEAL, vanilla GRPO, the ablations — from the same start
with the same recipe, tasks, budgets and seeds, changing only each arm's interface and A-Patch
sections (and its own ``set`` overrides), validates each run on held-out tasks every round, tests the
trained models at the end, and compares each arm with the baseline arm, paired over (task, seed).

One concept per module: ``design`` (the study file, checked before anything starts), ``records``
(what of a run outlives its machine), ``summary`` (pooled outcomes, Wilson intervals and paired
comparisons), ``page`` (the tables, curves and HTML page), ``runner`` (running it resumably, and the
pilot: ``seal preflight`` on every arm) and ``plan`` (``seal plan``'s time and memory per arm).
"""

from seal_rl.study.design import load_study, narrow_to_pilot, study_name
from seal_rl.study.page import render, study_summary, write_page
from seal_rl.study.runner import PILOT_SIGNAL, StudyRun, pilot_verdict, run_pilot, run_study

__all__ = ["PILOT_SIGNAL", "StudyRun", "load_study", "narrow_to_pilot", "pilot_verdict", "render", "run_pilot", "run_study",
           "study_name", "study_summary", "write_page"]  # fmt: skip
