"""Where each chat-template family's models say a message ends, as the models ship it: the
tokenizer's ``eos_token`` (tokenizer_config.json) and the generation config's ``eos_token_id``
(generation_config.json), as token strings. One entry per text template TRL 1.16 ships
(``trl/chat_templates/*.jinja``), for the hub model named in the source.

Copied from the published files (or, where a family's own files were not found, from its nearest
published sibling, said so); never from what seal-rl computes. The template tests build each
family's tokenizer with these, save it beside a generation config listing the stops, and load it
from that folder, as a model directory ships (tests/test_templates.py).
"""

from __future__ import annotations

DEEPSEEK_EOS = "<\uff5cend\u2581of\u2581sentence\uff5c>"  # <｜end▁of▁sentence｜>, full-width bars
GEMMA4 = ("<turn|>", ["<eos>", "<turn|>", "<|tool_response>"],
          "google/gemma-4-E2B-it tokenizer_config.json (eos <turn|>) and generation_config.json ([1, 106, 50])")  # fmt: skip
NEMOTRON3 = ("<|im_end|>", ["</s>", "<|im_end|>"],
             "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16 tokenizer_config.json (eos <|im_end|>) and generation_config.json ([2, 11])")  # fmt: skip
QWEN = ("<|im_end|>", ["<|im_end|>", "<|endoftext|>"])

PUBLISHED: dict[str, tuple[str, list[str], str]] = {
    # name: (tokenizer eos_token, generation_config eos_token_id as strings, source)
    "cohere": ("<|END_OF_TURN_TOKEN|>", ["<|END_OF_TURN_TOKEN|>"], "CohereLabs/aya-expanse-8b (eos_token_id 255001)"),
    "cohere2": ("<|END_OF_TURN_TOKEN|>", ["<|END_OF_TURN_TOKEN|>"],
                "CohereLabs/c4ai-command-r7b-12-2024 (eos_token_id 255001); TRL's tiny-aya files not found"),
    "deepseek_r1_distill": (DEEPSEEK_EOS, [DEEPSEEK_EOS], "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B (eos_token_id 151643)"),
    "deepseekv3": (DEEPSEEK_EOS, [DEEPSEEK_EOS], "deepseek-ai/DeepSeek-V3 (eos_token_id 1)"),
    "diffusion_gemma": (*GEMMA4[:2], "its Gemma 4 base's files (DiffusionGemma's own not found): " + GEMMA4[2]),
    "gemma": ("<eos>", ["<eos>", "<end_of_turn>"], "google/gemma-2-2b-it generation_config.json ([1, 107])"),
    "gemma3": ("<eos>", ["<eos>", "<end_of_turn>"], "google/gemma-3-4b-it generation_config.json ([1, 106])"),
    **{name: GEMMA4 for name in ("gemma4", "gemma4_v2", "gemma4_v3", "gemma4_v4", "gemma4_v5")},
    "glm4moe": ("<|endoftext|>", ["<|endoftext|>", "<|user|>", "<|observation|>"],
                "zai-org/GLM-4.5 generation_config.json ([151329, 151336, 151338])"),
    "gptoss": ("<|return|>", ["<|return|>", "<|endoftext|>", "<|call|>"],
               "openai/gpt-oss-20b tokenizer_config.json and generation_config.json ([200002, 199999, 200012])"),
    **{name: ("<|im_end|>", ["<|im_end|>"], "LiquidAI/LFM2-1.2B special_tokens_map.json and generation_config.json (7)")
       for name in ("lfm2", "lfm2_v2", "lfm2_2_5", "lfm2_2_5_v2")},
    "llama3": ("<|eot_id|>", ["<|end_of_text|>", "<|eot_id|>"],
               "meta-llama/Meta-Llama-3-8B-Instruct generation_config.json ([128001, 128009])"),
    "llama3_1": ("<|eot_id|>", ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"],
                 "meta-llama/Llama-3.1-8B-Instruct generation_config.json ([128001, 128008, 128009])"),
    "llama3_2": ("<|eot_id|>", ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"],
                 "meta-llama/Llama-3.2-1B-Instruct generation_config.json ([128001, 128008, 128009])"),
    "muse_glimmer": ("<|end_of_text|>", ["<|end_of_text|>", "<|eot|>"],
                     "transformers' convert_muse_glimmer_weights_to_hf.py (eos <|end_of_text|>, eos_token_id [200001, 200008])"),
    **{name: NEMOTRON3 for name in ("nemotron_3_nano", "nemotron_3_super", "nemotron_3_ultra", "nemotron_3_5_lightning")},
    "phi3": ("<|endoftext|>", ["<|endoftext|>", "<|assistant|>", "<|end|>"],
             "microsoft/Phi-3-mini-4k-instruct generation_config.json ([32000, 32001, 32007])"),
    "phi3_5": ("<|endoftext|>", ["<|end|>", "<|assistant|>", "<|endoftext|>"],
               "microsoft/Phi-3.5-mini-instruct generation_config.json ([32007, 32001, 32000])"),
    "qwen2_5": (*QWEN, "Qwen/Qwen2.5-7B-Instruct generation_config.json ([151645, 151643])"),
    "qwen3": (*QWEN, "Qwen/Qwen3-8B generation_config.json ([151645, 151643])"),
    "qwen3_instruct_2507": (*QWEN, "Qwen/Qwen3-4B-Instruct-2507 generation_config.json ([151645, 151643])"),
    "qwen3_5_think": (*QWEN, "Qwen/Qwen3.5 generation_config.json ([248046, 248044])"),
    "qwen3_5_nothink": (*QWEN, "Qwen/Qwen3.5 generation_config.json ([248046, 248044])"),
    "qwen3_6": (*QWEN, "Qwen/Qwen3.6-35B-A3B generation_config.json ([248046, 248044])"),
    "qwen3_8": (*QWEN, "Qwen/Qwen3.8-27B generation_config.json ([248046, 248044])"),
}
