"""A tiny random decoder with a tokenizer trained on the spot, for smoke runs, the CPU learning
recipe and tests.

Nothing is downloaded: the byte-level BPE tokenizer is trained (``tokenizers``) on BFCL's own
text (system blocks, tool docs, questions, ground-truth calls rendered as ``<tool_call>`` blocks)
and carries a Qwen2.5-style chat template with tool support; the model is a randomly initialised
``LlamaForCausalLM`` (Qwen2.5's layout without attention biases) built from a config.

Why Llama and not Qwen2: transformers 5 loads the tokenizer of any ``model_type: qwen2`` directory
as ``Qwen2Tokenizer``, which replaces the trained pre-tokenizer with Qwen's word-splitting regex;
our tokenizer's merges cross word boundaries (see :func:`build_tokenizer`) and would be lost.
"""

from __future__ import annotations

import json
from pathlib import Path

from seal_rl.tasks import TaskSet

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Added but not special, as in Qwen2.5: decoding with skip_special_tokens keeps them.
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

# The Qwen2.5 chat template's layout (system + tools block, tool results as <tool_response>).
# It renders a conversation as a prefix of the same conversation plus later messages.
CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}"
    "{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'user' or message['role'] == 'assistant' or (message['role'] == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _corpus(task_set: TaskSet) -> list[str]:
    """BFCL text as the environment shows it: system blocks (base and observation-lite), questions,
    ground-truth calls. Repeated blocks are kept: BPE then merges the commonest ones furthest."""
    from seal_rl.interface import Interface, InterfaceState
    from seal_rl.tools import ToolCatalog, get_format
    from seal_rl.verify import ground_truth_calls

    hermes = get_format("hermes")
    catalog = ToolCatalog()
    interfaces = [Interface("bfcl_qwen_fc", InterfaceState.initial(p), catalog=catalog) for p in ("vanilla", "paper")]
    texts = [CHAT_TEMPLATE]
    seen_docs = set()
    for task in task_set:
        for doc in task.all_functions():
            if doc["name"] not in seen_docs:
                seen_docs.add(doc["name"])
                texts.append(json.dumps(doc))
        texts += [m["content"] for interface in interfaces for m in interface.system(task.functions)]
        texts += [m["content"] for turn in task.questions for m in turn]
        texts += [hermes.render(list(turn)) for turn in ground_truth_calls(task) if turn]
    return texts


def build_tokenizer(vocab_size: int = 2048, task_set: TaskSet | None = None):
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on BFCL text, with the chat template.

    Merges may cross word boundaries (no regex pre-split): BFCL's repeated boilerplate (tool docs,
    call markup) becomes long tokens, so prompts are several times shorter than with word-level
    splitting (median ~1.4k instead of ~5.4k tokens at 16k vocab), which keeps CPU training affordable.
    Any text still encodes (byte-level).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split("\n", behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])  # fmt: skip
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_corpus(task_set or TaskSet.load()), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
    )
    tokenizer.add_tokens(TOOL_TOKENS)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_config(
    *,
    vocab_size: int = 2048,
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    max_position_embeddings: int = 32768,
) -> dict:
    """The ``config.json`` numbers of the tiny model :func:`build_tiny_model` builds, without building
    it (``seal train`` plans its memory from them before the model exists). ``vocab_size`` is the
    tokenizer's, which the built model may undercut by a few tokens when BPE runs out of merges."""
    return {
        "model_type": "llama",
        "vocab_size": vocab_size + len(TOOL_TOKENS),
        "hidden_size": hidden_size,
        "intermediate_size": hidden_size * 2,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "max_position_embeddings": max_position_embeddings,
        "tie_word_embeddings": True,
        "dtype": "float32",
    }


def build_tiny_model(
    out_dir: Path,
    *,
    vocab_size: int = 2048,
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    max_position_embeddings: int = 32768,
    seed: int = 0,
    task_set: TaskSet | None = None,
) -> Path:
    """Save a random tiny Llama-architecture model and its tokenizer to ``out_dir`` (a few MB) and return it."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = build_tokenizer(vocab_size, task_set)
    torch.manual_seed(seed)
    numbers = tiny_config(vocab_size=vocab_size, hidden_size=hidden_size, layers=layers, heads=heads, kv_heads=kv_heads,
                          max_position_embeddings=max_position_embeddings)  # fmt: skip
    del numbers["model_type"], numbers["dtype"]  # LlamaConfig's own; the model is built in torch's default float32
    config = LlamaConfig(
        **{**numbers, "vocab_size": len(tokenizer)},
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=True
    )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
