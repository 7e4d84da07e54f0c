"""``seal report RUN``: a self-contained ``report.html`` for an evaluation or a training run, and
``seal compare A B --html OUT`` for two evaluation runs.

Everything is inline (PNG charts as data URIs, CSS, a few lines of JavaScript for filters and the
task-id search), so the file opens offline and can be mailed around. Pages are Jinja2 templates
with autoescaping: every value read from a run is HTML-escaped (model output is hostile input).
Trajectory browsers keep at most :data:`~seal_rl.report.page.EPISODE_CAP` episodes, spread
evenly over the run, and say so; every rate and chart counts all of them.

* :mod:`~seal_rl.report.evaluation` — evaluation runs (``results.jsonl``).
* :mod:`~seal_rl.report.training` — training runs (``metrics.jsonl``, ``trajectories.jsonl``);
  its interface timeline is :mod:`~seal_rl.report.interface`.
* :mod:`~seal_rl.report.compare` — two evaluation runs side by side.
* :mod:`~seal_rl.report.ood` — a τ²-bench or BFCL memory run.
* :mod:`~seal_rl.report.episodes` — one episode as the agent saw it.
* :mod:`~seal_rl.report.page` — templates, styles, script and charts every page shares.
"""

from __future__ import annotations

from pathlib import Path

from seal_rl.errors import SealError
from seal_rl.report.compare import compare_report, write_compare_report
from seal_rl.report.evaluation import eval_report
from seal_rl.report.page import LABEL_COLOURS
from seal_rl.report.training import training_report

REPORT_FILE = "report.html"

__all__ = ["LABEL_COLOURS", "REPORT_FILE", "compare_report", "eval_report", "training_report", "write_compare_report", "write_report"]


def write_report(run_dir: Path) -> Path:
    """Write ``RUN/report.html`` for an evaluation or training run directory and return its path."""
    run_dir = Path(run_dir)
    from seal_rl.ood.profile import ood_benchmark

    benchmark = ood_benchmark(run_dir)
    if benchmark is not None:
        from seal_rl.report.ood import ood_report

        page = ood_report(run_dir, benchmark)
    elif (run_dir / "metrics.jsonl").exists():
        page = training_report(run_dir)
    elif (run_dir / "results.jsonl").exists():
        page = eval_report(run_dir)
    else:
        raise SealError(f"{run_dir} is neither an evaluation run (results.jsonl) nor a training run (metrics.jsonl).")
    target = run_dir / REPORT_FILE
    target.write_text(page, encoding="utf-8", errors="backslashreplace")  # lone surrogates shown as \udXXX
    return target
