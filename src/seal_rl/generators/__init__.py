"""Generators: what answers the episode driver's requests (the :class:`~seal_rl.rollout.Generator` protocol).

* :class:`HFGenerator` — transformers ``generate`` on token ids (CPU or GPU).
* :class:`VLLMGenerator` — TRL's colocated vLLM engine (``trainer.vllm_generation``) during training.
* :class:`VLLMEngineGenerator` — a local vLLM engine (``seal eval --policy vllm:PATH``).
* :class:`~seal_rl.generators.vllm_server.VLLMServerGenerator` — ``vllm serve`` generation servers
  during training (``generator: server``); ``server_launch`` starts one, ``server_worker`` is its
  side of a weight sync.
* :class:`OpenAIGenerator` — any OpenAI-compatible server, streaming (``--policy openai:``).
* :class:`ScriptedGenerator` — agents that answer from a script (replay files, the oracle).
* :class:`SimulatedGenerator`, :class:`SimulatedServer` — canned text after a fixed (batched) or
  random (streaming) latency: for driver benchmarks.
"""

from seal_rl.generators.hf import HFGenerator
from seal_rl.generators.openai_compatible import OpenAIGenerator, ServerSettings
from seal_rl.generators.scripted import ScriptedGenerator
from seal_rl.generators.simulated import SimulatedGenerator, SimulatedServer
from seal_rl.generators.vllm_engines import VLLMEngineGenerator, VLLMGenerator

__all__ = [
    "HFGenerator", "OpenAIGenerator", "ScriptedGenerator", "ServerSettings", "SimulatedGenerator",
    "SimulatedServer", "VLLMEngineGenerator", "VLLMGenerator",
]
