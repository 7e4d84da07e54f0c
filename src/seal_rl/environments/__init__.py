"""Environment families: the protocol SEAL's closed loop plays, BFCL and τ²-bench as families, and
the base class for your own environment (:class:`Family`; docs/guides/your-environment.md).

Vocabulary (docs/concepts/architecture.md): a **family** is a kind of environment (BFCL, τ²'s airline, your
own); its **tasks** are what an **episode** is played on; the **policy** writes the agent's
messages through a **generator**; the **user** answers the agent's text (a scripted or simulated
user, or none); the **verifier** scores the finished episode; **Ψ** labels it; **Ω** is the
interface the policy sees.
"""

from seal_rl.environments.family import BfclFamily, Family, FamilyTask, TaskSource, oracle_messages
from seal_rl.environments.load import BUILT_IN, check_family, load_family
from seal_rl.environments.outcome import Outcome, ToolError
from seal_rl.environments.protocol import Environment

__all__ = ["BUILT_IN", "BfclFamily", "Environment", "Family", "FamilyTask", "Outcome", "TaskSource", "ToolError",
           "check_family", "load_family", "oracle_messages"]  # fmt: skip
