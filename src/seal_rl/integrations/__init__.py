"""seal-rl's BFCL multi-turn environment, verifier and diagnosis where other trainers look for one.

* :mod:`seal_rl.integrations.trl` — a ``rollout_func`` for TRL's own ``GRPOTrainer``: whole BFCL
  episodes played with the trainer's generation, token-exact, with the reward, the turn labels and
  the A-Patch weight as fields for the reward functions.
* :mod:`seal_rl.integrations.openenv` — the environment as an OpenEnv environment (its types, the
  environment, the app ``seal serve-openenv`` runs, and the client); needs openenv, which has its
  own venv (``make install-openenv``).

docs/guides/integrations.md shows each path with an example.
"""
