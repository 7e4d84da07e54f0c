"""Chat-template families: which of TRL's templates a model's is, and the prompt mode and call
format that ``auto`` picks for it.

The family is the TRL 1.16 template (``trl/chat_templates/*.jinja``, read from the installed
package) that the tokenizer's template equals, when it equals one: TRL's copies are the hub
models' own templates, which is also how TRL's ``add_response_schema`` recognises a family.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

VISION_TEMPLATES = ("idefics3", "llava_next", "qwen2_5_vl", "qwen3_vl", "smolvlm", "lfm2_2_5_vl")


def trl_templates() -> dict[str, str]:
    """TRL's text chat templates, ``{name: source}``, read from the installed package (training
    variants and vision-language templates left out)."""
    import trl

    folder = Path(trl.__file__).parent / "chat_templates"
    return {p.stem: p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.jinja"))
            if not p.stem.endswith("_training") and p.stem not in VISION_TEMPLATES}  # fmt: skip


def family(tokenizer: Any) -> str | None:
    """The TRL template the tokenizer's chat template is, or ``None``."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = template.get("default")
    return next((name for name, source in trl_templates().items() if source == template), None)


AUTO = "auto"
DEFAULT_MODE = ("bfcl_qwen_fc", "hermes")
"""unknown families: BFCL's Qwen FC prompt, which writes the tools itself (works with any template
that renders a system message)"""
FAMILY_MODES: dict[str, tuple[str, str]] = {
    # the paper's: BFCL's Qwen FC handler prompt, <tool_call> blocks (the Qwen family's own format)
    **{name: DEFAULT_MODE for name in ("qwen2_5", "qwen3", "qwen3_instruct_2507", "qwen3_5_think", "qwen3_5_nothink",
                                       "qwen3_6", "qwen3_8")},
    # the model's own tool calls, through its template and response parser
    **{name: ("chat_template", "native") for name in ("gptoss", "llama3_1", "llama3_2", "glm4moe", "gemma4", "gemma4_v2",
                                                      "gemma4_v3", "gemma4_v4", "gemma4_v5", "lfm2_v2", "lfm2_2_5",
                                                      "lfm2_2_5_v2")},
    "lfm2": ("chat_template", "pythonic"),  # LFM2 writes Python-style calls; TRL has no response parser for it
}  # fmt: skip
"""the prompt mode and call format ``auto`` picks per TRL template family (``tests/test_templates.py``
checks that each works)"""


def resolve_auto(env: dict[str, Any], tokenizer: Any | None) -> tuple[dict[str, Any], str | None]:
    """``env`` with ``prompt_mode`` / ``call_format`` ``auto`` replaced by the family's choice
    (:data:`FAMILY_MODES`; :data:`DEFAULT_MODE` for an unknown template or no tokenizer), and a
    line saying what was picked (None when nothing was ``auto``). A value set explicitly is kept."""
    if AUTO not in (env.get("prompt_mode"), env.get("call_format")):
        return env, None
    name = family(tokenizer) if tokenizer is not None else None
    picked = FAMILY_MODES.get(name, DEFAULT_MODE) if name else DEFAULT_MODE
    resolved = dict(env)
    if resolved.get("prompt_mode", AUTO) == AUTO:
        resolved["prompt_mode"] = picked[0]
    if resolved.get("call_format", AUTO) == AUTO:  # BFCL's Qwen prompt asks for hermes whatever the family
        resolved["call_format"] = "hermes" if resolved["prompt_mode"] == "bfcl_qwen_fc" else picked[1]
    source = f"the {name} template family" if name else "a template of no known family"
    return resolved, (f"auto: prompt_mode {resolved['prompt_mode']}, call_format {resolved['call_format']} "
                      f"(for {source}; set prompt_mode / call_format to choose)")  # fmt: skip
