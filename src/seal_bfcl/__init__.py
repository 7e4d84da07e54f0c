"""seal-rl's BFCL multi-turn environment under the name verifiers finds it by.

verifiers resolves an environment id to a top-level module (``vf-eval seal-bfcl`` imports
``seal_bfcl``) and reads the ``vf.Taskset`` and ``vf.Env`` subclasses its ``__all__`` exports. They
live in :mod:`seal_rl.integrations.verifiers`; this package only gives them that name.
"""

from seal_rl.integrations.verifiers import (
    BfclData, BfclEnvConfig, BfclTask, BfclTaskset, BfclTasksetConfig, BfclVerifiersEnv, load_environment,
)  # fmt: skip

__all__ = ["BfclData", "BfclEnvConfig", "BfclTask", "BfclTaskset", "BfclTasksetConfig", "BfclVerifiersEnv",
           "load_environment"]  # fmt: skip
