"""Every text chat template TRL ships, through seal-rl's sample builder: each prompt mode and call
format either plays the ground truth to reward 1 with samples equal to the template's own
rendering, or is refused with a message that says what is wrong and what to set — never a raw
exception, never tools silently missing. Also: reasoning is kept apart from calls, and
``seal templates check``'s contract.

The templates are read from the installed TRL (``trl/chat_templates/*.jinja``), never copied here;
each is set on the tiny BPE tokenizer together with the special tokens it writes (what a real
tokenizer of that family carries), the family's published eos and, where it writes one, a
begin-of-text token; the tokenizer is saved beside a generation config listing the family's
published stop tokens (tests/published_stops.py) and loaded from that folder, as a model ships.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from seal_rl.errors import SealError, SealWarning
from seal_rl.reasoning import split_reasoning
from seal_rl.stops import message_stops
from seal_rl.templates import MODES, check, family, trl_templates
from seal_rl.trajectory import ChatTokens, episode_template
from tests.published_stops import PUBLISHED

ROOT = Path(__file__).resolve().parents[1]
# Special tokens as templates write them: <|im_start|>, <｜User｜> (DeepSeek's full-width bars),
# <start_of_turn>, Gemma 4's <|turn> / <turn|>, GLM's [gMASK] and <sop>, <think>, <tool_call>.
SPECIAL = re.compile(r"<\|[^|>\s]{1,40}\|>|<\|[a-z_]{1,20}>|<[a-z_]{1,20}\|>|<｜[^｜]{1,40}｜>|<(?:start|end)_of_turn>|<turn\|>|<\|turn>|</?think>|\[/?INST\]"
                     r"|</?tool_call>|\[gMASK\]|<sop>|<bos>|<eos>")  # fmt: skip
BOS = ("<|begin_of_text|>", "<｜begin▁of▁sentence｜>", "<bos>", "<|startoftext|>")
# The families the issue asks to work in some mode for training, and those whose own tool calls
# (call_format native: parsed by transformers' response templates through TRL) must work.
MUST_WORK = ("qwen2_5", "qwen3", "qwen3_instruct_2507", "qwen3_5_think", "qwen3_5_nothink", "qwen3_6", "llama3_1",
             "llama3_2", "gptoss", "gemma3", "phi3_5", "deepseek_r1_distill", "glm4moe", "lfm2")  # fmt: skip
NATIVE_WORKS = ("qwen2_5", "qwen3", "qwen3_5_think", "qwen3_6", "llama3_1", "llama3_2", "gptoss", "glm4moe", "gemma4",
                "gemma4_v2", "lfm2_2_5")  # fmt: skip
FIXES = ("prompt_mode: bfcl_qwen_fc", "no prompt mode works", "Use a template that only appends", "call_format: hermes")


def family_tokenizer(base, name: str, folder: Path):
    """The tiny tokenizer carrying TRL's ``name`` template, that family's special tokens and its
    published eos, saved to ``folder`` beside a generation config that lists the family's
    published stops (tests/published_stops.py), and loaded from there: a model directory as it ships."""
    from transformers import AutoTokenizer, GenerationConfig

    if not (folder / "tokenizer_config.json").is_file():
        text = trl_templates()[name]
        eos, stops, _ = PUBLISHED[name]
        tokenizer = copy.deepcopy(base)
        tokenizer.add_special_tokens({"additional_special_tokens": sorted(set(SPECIAL.findall(text)) | {eos, *stops})})
        tokenizer.chat_template = text
        if "bos_token" in text:
            tokenizer.bos_token = next((t for t in BOS if t in text), "<|endoftext|>")
        tokenizer.eos_token = eos
        tokenizer.save_pretrained(folder)
        GenerationConfig(eos_token_id=tokenizer.convert_tokens_to_ids(stops)).save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="module")
def base_tokenizer(task_set):
    from seal_rl.tiny import build_tokenizer

    return build_tokenizer(4096, task_set)


@pytest.fixture(scope="module")
def families(base_tokenizer, tmp_path_factory):
    """``families(name)``: the family's tokenizer as its model ships (:func:`family_tokenizer`)."""
    root = tmp_path_factory.mktemp("families")
    return lambda name: family_tokenizer(base_tokenizer, name, root / name)


@pytest.fixture(scope="module")
def reports(families, task_set):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SealWarning)
        return {name: check(families(name), task_set) for name in trl_templates()}


def test_the_templates_are_read_from_the_installed_trl():
    import trl

    names = trl_templates()
    assert {"qwen2_5", "qwen3", "gptoss", "llama3_1", "gemma3", "phi3_5"} <= set(names)
    assert not any(n.endswith("_training") for n in names)
    folder = Path(trl.__file__).parent / "chat_templates"
    assert all((folder / f"{n}.jinja").read_text(encoding="utf-8") == t for n, t in names.items())


def test_every_template_works_or_is_refused_with_the_fix(reports):
    """No exception (check() would have raised); each mode works (reward 1, samples equal to the
    rendering, tools in the prompt) or says why and what to set."""
    assert len(reports) >= 30
    for name, report in reports.items():
        assert report["family"] == name
        assert [(m["mode"], m["call_format"]) for m in report["modes"]] == list(MODES)
        for mode in report["modes"]:
            if mode["works"]:
                assert mode["success"] == 1.0 and mode["episodes"] == 4, (name, mode)
                assert mode["layouts"] == ["episode", "turn"], (name, mode)  # each turn prompted by the own template
                assert mode["tools_in_prompt"] is not False, (name, mode)
                assert mode["reason"] is None
            else:
                assert mode["reason"] and any(fix in mode["reason"] for fix in FIXES), (name, mode)
        assert report["works"] == any(m["works"] for m in report["modes"])


def test_the_families_people_train_work_in_some_mode(reports):
    works = {name: [f"{m['mode']}/{m['call_format']}" for m in reports[name]["modes"] if m["works"]] for name in MUST_WORK}
    assert all(works.values()), {n: w for n, w in works.items() if not w}
    # Qwen2.5 works everywhere with its own template; Qwen3's rewrites history, so TRL's training variant is used
    assert len(works["qwen2_5"]) == len(MODES)
    native = {name: next(m for m in reports[name]["modes"] if m["call_format"] == "native") for name in NATIVE_WORKS}
    assert all(m["works"] for m in native.values()), {n: m["reason"] for n, m in native.items() if not m["works"]}
    # gpt-oss drops past analysis however it is rendered: the episode keeps it as generated, and says so
    assert native["gptoss"]["forgets_reasoning"] is True and native["qwen3"]["forgets_reasoning"] is False
    assert {m["template"] for m in reports["qwen3"]["modes"] if m["works"]} == {"trl_training"}
    assert {m["template"] for m in reports["qwen2_5"]["modes"]} == {"own"}
    # gpt-oss writes a generated <|return|> as <|end|> in history: the episode keeps the token, and the check says so
    assert {(m["mode"], m["call_format"]): m["kept_as_generated"] for m in reports["gptoss"]["modes"] if m["works"]} == \
        {("bfcl_qwen_fc", "hermes"): {"<|return|>": "<|end|>"}, ("chat_template", "native"): {"<|return|>": "<|end|>"}}
    assert all(m["kept_as_generated"] is None for name in ("qwen2_5", "gemma3", "phi3_5", "llama3_1") for m in reports[name]["modes"])


# -- stop tokens as models ship them -------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_every_family_stops_where_its_model_ships_it(name, families):
    """The stops are the generation config's list and the tokenizer's eos, and the scripted end of a
    message is what the template writes after a last message (Gemma 3 <end_of_turn>, not its eos <eos>)."""
    eos, published, source = PUBLISHED[name]
    tokenizer = families(name)
    stops = message_stops(tokenizer)
    assert {eos, *published} <= {tokenizer.decode([i]) for i in stops.ids}, source
    assert stops.configured == tuple(dict.fromkeys(tokenizer.convert_tokens_to_ids(published)))
    assert stops.end_id in stops.ids
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}], tokenize=False)
    end = tokenizer.decode([stops.end_id])
    assert end in rendered[rendered.rindex("A") :] or end == eos  # GLM-4 writes nothing after a last message
    assert end == {"gemma3": "<end_of_turn>", "gptoss": "<|return|>", "phi3_5": "<|end|>", "llama3_1": "<|eot_id|>",
                   "glm4moe": "<|endoftext|>"}.get(name, end)  # fmt: skip


def test_the_generation_configs_stops_are_read_from_the_model_directory(families, tmp_path):
    """Without its generation_config.json, Llama 3.1 would not stop at <|end_of_text|> or <|eom_id|>;
    gpt-oss would not stop at <|endoftext|>: only the generation config names them."""
    import shutil

    for name, only_configured in (("llama3_1", {"<|end_of_text|>", "<|eom_id|>"}), ("gptoss", {"<|endoftext|>"})):
        shipped = families(name)
        bare = shutil.copytree(shipped.name_or_path, tmp_path / name)
        (bare / "generation_config.json").unlink()
        from transformers import AutoTokenizer

        stops = {d: {shipped.decode([i]) for i in message_stops(t).ids} for d, t in (("shipped", shipped), ("bare", AutoTokenizer.from_pretrained(bare)))}
        assert only_configured <= stops["shipped"] and not only_configured & stops["bare"], (name, stops)
    (bare / "generation_config.json").write_text('{"eos_token_id": [10000000]}')
    with pytest.raises(SealError, match="is not a token id of this tokenizer"):
        message_stops(AutoTokenizer.from_pretrained(bare))


def test_generation_stops_on_a_stop_only_the_generation_config_names(families, tiny_model_dir, task_set, tmp_path):
    """hf ``generate`` through seal-rl's generator ends a message at Llama 3.2's <|eom_id|>, which only
    its generation config names: a model that always writes it stops after one token, where the same
    model with the generation config left out writes it until max_new_tokens."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from seal_rl.generators.hf import HFGenerator
    from seal_rl.rollout import Request

    shipped = families("llama3_2")
    bare = shutil.copytree(shipped.name_or_path, tmp_path / "bare")
    (bare / "generation_config.json").unlink()
    stop = shipped.convert_tokens_to_ids("<|eom_id|>")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.resize_token_embeddings(len(shipped))
    head = torch.nn.Linear(model.config.hidden_size, len(shipped), bias=True)
    torch.nn.init.zeros_(head.weight)
    torch.nn.init.constant_(head.bias, -10.0)
    head.bias.data[stop] = 10.0  # every step's most likely token
    model.lm_head = head
    prompt = shipped.apply_chat_template([{"role": "user", "content": "Hello"}], add_generation_prompt=True, tokenize=False)
    request = Request(0, task_set.get("multi_turn_base_0"), [], [], {}, shipped(prompt, add_special_tokens=False)["input_ids"], 5)
    generated = {name: HFGenerator(model, tokenizer, temperature=0.0).generate([request], seed=0)[0].token_ids
                 for name, tokenizer in (("shipped", shipped), ("bare", AutoTokenizer.from_pretrained(bare)))}  # fmt: skip
    assert generated == {"shipped": [stop], "bare": [stop] * 5}


def test_known_problems_are_refused_not_raised(families):
    """Gemma rejects a system role, gpt-oss a tool message after a plain-text message, DeepSeek-V3
    ignores tools: each is a SealError naming what to set, before any model is involved."""
    cases = {("gemma", "bfcl_qwen_fc"): "System role not supported", ("gptoss", "chat_template"): "prompt_mode: bfcl_qwen_fc",
             ("deepseekv3", "chat_template"): "ignores `tools`"}  # fmt: skip
    for (name, mode), expected in cases.items():
        with pytest.raises(SealError, match=re.escape(expected)) as raised:
            episode_template(families(name), mode)
        assert "Traceback" not in str(raised.value) and "\n" not in str(raised.value)


def test_a_history_rewriting_template_is_replaced_by_trls_training_variant_and_said_so(families):
    from trl.chat_template_utils import get_training_chat_template

    tokenizer = families("qwen3")
    with pytest.warns(SealWarning, match="training variant"):
        chat = ChatTokens.for_episodes(tokenizer, "bfcl_qwen_fc")
    assert chat.chat_template == get_training_chat_template(tokenizer)
    plain = families("qwen2_5")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ChatTokens.for_episodes(plain, "bfcl_qwen_fc").chat_template is None


@pytest.mark.parametrize(
    ("text", "reasoning", "answer"),
    [
        ("<think>\nplan <tool_call>x</tool_call>\n</think>\n\nreal", "plan <tool_call>x</tool_call>", "real"),
        ("plan\n</think>\n\nreal", "plan", "real"),  # the generation prompt opened the block
        ("<think>\nstill thinking", "still thinking", ""),  # cut while thinking: no answer
        ("no reasoning here", "", "no reasoning here"),
        ("before <think>t</think> after", "t", "before  after"),
    ],
)
def test_split_reasoning(text, reasoning, answer):
    assert split_reasoning(text) == (reasoning, answer)


def test_a_call_inside_reasoning_is_not_made(task_set):
    """The environment parses the answer only: a call written in <think> is not executed or verified."""
    from seal_rl.env import BfclEnv, EnvConfig

    task = task_set.get("multi_turn_base_0")
    env = BfclEnv(EnvConfig())
    env.reset(task)
    thought = '<think>\nmaybe <tool_call>\n{"name": "ls", "arguments": {}}\n</tool_call>\n</think>\n\nI will not call a tool.'
    env.step(thought)
    assert env.trace == []
    assert [m["content"] for m in env.messages if m["role"] == "assistant"] == [thought]  # the conversation keeps it all


HARMONY_PROMPT_END = "<|start|>assistant"


@pytest.mark.parametrize(
    ("name", "written"),
    [
        ("gptoss", '<|channel|>analysis<|message|>Maybe <tool_call>\n{"name": "ls", "arguments": {}}\n</tool_call> first.<|end|>'
                   '<|start|>assistant to=functions.cd<|channel|>commentary json<|message|>{"folder": "document"}<|call|>'),
        ("qwen3", '<think>\nMaybe <tool_call>\n{"name": "ls", "arguments": {}}\n</think>\n\n'
                  '<tool_call>\n{"name": "cd", "arguments": {"folder": "document"}}\n</tool_call><|im_end|>'),
    ],
)
def test_native_calls_are_parsed_from_the_models_own_format_and_reasoning_is_not_a_call(name, written, families, task_set):
    """A model message in its family's own format (gpt-oss harmony: analysis, then a call on the
    commentary channel; Qwen3: <think>, then <tool_call>) becomes a structured message: the call
    executes, the call-shaped text inside the reasoning does not, the reasoning is kept in its
    field, and the text after the message is what the template writes there."""
    from seal_rl.env import BfclEnv, EnvConfig

    tokenizer = families(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SealWarning)
        chat = ChatTokens.for_episodes(tokenizer, "chat_template", "native")
    env = BfclEnv(EnvConfig(prompt_mode="chat_template", call_format="native"))
    opening, info = env.reset(task_set.get("multi_turn_base_0"))
    chat.tools = info["tools"]
    trajectory = chat.start(opening)
    generated = chat.encode(written)
    message = chat.response(generated, trajectory.prompt_ids, info["tools"])
    observation, *_ = env.step(message)
    assert [(e.name, e.arguments, e.accepted) for e in env.trace] == [("cd", {"folder": "document"}, True)]
    kept = env.messages[len(opening)]
    assert kept["tool_calls"][0]["function"] == {"name": "cd", "arguments": {"folder": "document"}}
    assert "ls" in kept.get("thinking", kept.get("reasoning_content", ""))
    assert observation[0]["role"] == "tool" and observation[0]["tool_call_id"] == kept["tool_calls"][0]["id"]
    following = \
        tokenizer.decode(chat.continuation(opening, kept, generated, observation), skip_special_tokens=False)
    rendered = chat.render([*opening, kept, *observation], generation_prompt=True)
    sample = tokenizer.decode(trajectory.prompt_ids + generated, skip_special_tokens=False) + following
    assert sample == rendered  # the model wrote the template's rendering, so the sample is exactly it


def test_native_needs_a_response_parser_and_the_chat_template_mode(families):
    with pytest.raises(SealError, match="call_format: hermes"):
        ChatTokens.for_episodes(families("phi3_5"), "chat_template", "native")
    with pytest.raises(SealError, match="prompt_mode chat_template"):
        episode_template(families("qwen2_5"), "bfcl_qwen_fc", native=True)


def test_seal_templates_check_contract(families, tmp_path):
    qwen3 = Path(families("qwen3").name_or_path)
    gemma = Path(families("gemma").name_or_path)
    run = [sys.executable, "-m", "seal_rl", "templates", "check"]
    works = subprocess.run([*run, str(qwen3), "--json"], capture_output=True, text=True, cwd=ROOT)
    assert works.returncode == 0, works.stderr
    report = json.loads(works.stdout)
    assert report["works"] is True and report["family"] == "qwen3"
    assert set(report["stops"]) == {"<|im_end|>", "<|endoftext|>"} and report["generation_config_stops"] == PUBLISHED["qwen3"][1]
    assert all({"mode", "works", "reason"} <= set(m) for m in report["modes"])
    none = subprocess.run([*run, str(gemma), "--json"], capture_output=True, text=True, cwd=ROOT)
    assert none.returncode == 1 and json.loads(none.stdout)["works"] is False
    reasons = {m["call_format"]: m["reason"] for m in json.loads(none.stdout)["modes"] if m["mode"] == "chat_template"}
    assert "System role not supported" in reasons.pop("hermes") and "no response parser" not in reasons
    assert "call_format: hermes" in reasons["native"]  # nor can its own calls be read
    table = subprocess.run([*run, str(qwen3)], capture_output=True, text=True, cwd=ROOT)
    assert table.returncode == 0 and "training variant" in table.stdout and "works with seal-rl" in table.stdout
    assert "a message ends at " in table.stdout and "from the generation config" in table.stdout
    bad = subprocess.run([*run, str(tmp_path / "nowhere")], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "No tokenizer could be loaded" in bad.stderr


def test_family_is_none_for_an_unknown_template(base_tokenizer):
    assert family(base_tokenizer) is None


def family_model(tiny_model_dir: Path, name: str, out: Path) -> Path:
    """The tiny model with TRL's ``name`` template: the family's tokens added, embeddings resized."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    family = family_tokenizer(AutoTokenizer.from_pretrained(tiny_model_dir), name, out)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.resize_token_embeddings(len(family))
    model.config.eos_token_id = family.eos_token_id
    model.generation_config.eos_token_id = family.convert_tokens_to_ids(PUBLISHED[name][1])  # as the family's model ships
    model.save_pretrained(out)
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("name", "native"), [("qwen3", False), ("gptoss", False)])
def test_a_tiny_model_with_a_family_template_trains_a_round_and_evaluates(name, native, tiny_model_dir, base_tokenizer, tmp_path):
    """`seal train --config smoke-cpu` (one round) and `seal eval --policy hf:DIR` exit 0 with
    Qwen3's template (rendered through TRL's training variant) and gpt-oss's, in bfcl_qwen_fc mode
    and with its own harmony calls (chat_template mode, call_format native)."""
    model = family_model(tiny_model_dir, name, tmp_path / name)
    settings = ["--set", "env.prompt_mode=chat_template", "--set", "env.call_format=native"] if native else []
    trained = subprocess.run([sys.executable, "-m", "seal_rl", "train", "--config", "smoke-cpu", "--out", str(tmp_path / "run"),
                              "--set", f"model.path={model}", "--set", "grpo.max_steps=1", *settings],
                             capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-3000:]
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["rollout/episodes"] for m in metrics if m.get("kind") == "rollout"] == [8]
    options = ["--format", "native", "--prompt-mode", "chat_template"] if native else []
    evaluated = subprocess.run([sys.executable, "-m", "seal_rl", "eval", "--policy", f"hf:{model}", "--split", "train",
                                "--tasks", "multi_turn_base_105", "--max-new-tokens", "16", "--out", str(tmp_path / "eval"),
                                *options], capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert len((tmp_path / "eval" / "results.jsonl").read_text().splitlines()) == 1
    if name == "qwen3":
        assert "training variant" in trained.stderr and "training variant" in evaluated.stderr


@pytest.mark.slow
def test_gptoss_as_it_ships_warm_starts_trains_a_round_and_evaluates_with_its_own_calls(tiny_model_dir, tmp_path):
    """gpt-oss's template with its published stops (eos <|return|>; the generation config's <|return|>,
    <|endoftext|>, <|call|>): a tiny model warm-started on one task's ground truth in harmony calls
    (``seal train``: SFT, then a round of SEAL), then ``seal eval --format native``; both exit 0 and
    both execute the calls the model wrote, which end at <|call|> and are parsed from the model's
    own format, and the episodes run to their end (each final answer ended at <|return|>)."""
    import yaml

    model = family_model(tiny_model_dir, "gptoss", tmp_path / "gptoss")
    task = "multi_turn_base_105"
    recipe = {"model": {"path": str(model)}, "data": {"task_ids": [task]},
              "env": {"prompt_mode": "chat_template", "call_format": "native"},
              "warm_start": {"interfaces": ["vanilla", "seal"], "data": [{"source": "oracle", "tasks": [task], "repeat": 2}],
                             "sft": {"learning_rate": 3.0e-3, "warmup_steps": 2, "lr_scheduler_type": "constant_with_warmup",
                                     "max_steps": 80, "per_device_train_batch_size": 4}},
              "grpo": {"num_generations": 2, "tasks_per_step": 1, "tasks_per_update": 1, "per_device_train_batch_size": 2,
                       "learning_rate": 1.0e-4, "max_steps": 1, "bf16": False},
              "budgets": {"max_prompt_tokens": 16384, "max_completion_tokens": 256, "max_new_tokens": 48},
              "interface": {"preset": "seal"}, "apatch": {"preset": "seal"}}  # fmt: skip
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    trained = subprocess.run([sys.executable, "-m", "seal_rl", "train", "--config", str(tmp_path / "recipe.yaml"),
                              "--out", str(tmp_path / "run")], capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert trained.returncode == 0, trained.stderr[-3000:]
    rollouts = [json.loads(line) for line in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()]
    assert len(rollouts) == 2 and any(call["accepted"] for r in rollouts for call in r["trace"])
    evaluated = subprocess.run([sys.executable, "-m", "seal_rl", "eval", "--policy", f"hf:{tmp_path / 'run' / 'model'}",
                                "--split", "train", "--tasks", task, "--format", "native", "--prompt-mode", "chat_template",
                                "--max-new-tokens", "48", "--out", str(tmp_path / "eval")], capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    result, = [json.loads(line) for line in (tmp_path / "eval" / "results.jsonl").read_text().splitlines()]
    assert [c["name"] for c in result["trace"] if c["accepted"]] and result["end_reason"] == "completed", result["end_reason"]
    assert any(m.get("tool_calls") for m in result["messages"])  # parsed from harmony, not text


def test_evaluation_prompts_are_the_models_own_rendering(families, task_set):
    """Qwen3's episodes are rendered with TRL's training variant (past reasoning kept); evaluation
    prompts each message with Qwen3's own template, which drops the reasoning of earlier turns,
    as inference does. Training keeps prompting with the sample itself."""
    from seal_rl.env import BfclEnv, EnvConfig
    from seal_rl.rollout import Budgets, Generation, run_episodes

    tokenizer = families("qwen3")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SealWarning)
        training = ChatTokens.for_episodes(tokenizer, "bfcl_qwen_fc")
    task = task_set.get("multi_turn_base_0")  # several user turns: a text answer moves to the next
    answer = "<think>\nsecret plan\n</think>\n\nDone."

    class Answering:
        def __init__(self):
            self.prompts = []

        def generate(self, requests, seed):
            self.prompts += [tokenizer.decode(r.prompt_ids, skip_special_tokens=False) for r in requests]
            return [Generation(answer, training.encode(answer) + [tokenizer.eos_token_id]) for _ in requests]

    seen = {}
    for name, chat in (("training", training), ("evaluation", training.for_inference())):
        generator = Answering()
        run_episodes([(1, task, {})], generator, lambda: BfclEnv(EnvConfig()), chat=chat, budgets=Budgets(10**6, 10**6, 10**4))
        seen[name] = generator.prompts
    assert len(seen["training"]) == len(seen["evaluation"]) == task.num_turns
    assert "secret plan" in seen["training"][1]  # the sample keeps the first turn's reasoning
    assert "secret plan" not in seen["evaluation"][1] and "Done." in seen["evaluation"][1]  # Qwen3 drops it
    assert seen["training"][0] == seen["evaluation"][0]  # the opening prompt is the same


@pytest.mark.parametrize(("name", "native"), [("qwen3", False), ("gptoss", True)])
def test_max_thinking_tokens_cuts_a_message_still_reasoning_and_ends_the_episode(name, native, families, task_set):
    """Reasoning (a <think> block; gpt-oss's analysis channel) longer than max_thinking_tokens:
    the sample keeps the first max_thinking_tokens tokens, nothing executes, the episode ends with
    thinking_budget. Shorter reasoning, or no cap, changes nothing."""
    from seal_rl.env import BfclEnv, EnvConfig
    from seal_rl.rollout import Budgets, Generation, run_episodes

    tokenizer = families(name)
    mode, call_format = ("chat_template", "native") if native else ("bfcl_qwen_fc", "hermes")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SealWarning)
        chat = ChatTokens.for_episodes(tokenizer, mode, call_format)
    thought = "list the files first then move the report " * 3
    if native:
        text = (f"<|channel|>analysis<|message|>{thought}<|end|><|start|>assistant to=functions.cd<|channel|>commentary "
                'json<|message|>{"folder": "document"}<|call|>')  # fmt: skip
    else:
        text = f'<think>\n{thought}\n</think>\n\n<tool_call>\n{{"name": "cd", "arguments": {{"folder": "document"}}}}\n</tool_call>'
    ids = chat.encode(text) + ([] if native else [tokenizer.eos_token_id])
    thinking = len(chat.encode(thought.strip()))

    def play(cap):
        class Once:
            def generate(self, requests, seed):
                return [Generation(text, ids) for _ in requests]

        env = BfclEnv(EnvConfig(prompt_mode=mode, call_format=call_format, max_model_calls=1))
        rollout, = run_episodes([(1, task_set.get("multi_turn_base_0"), {})], Once(), lambda: env, chat=chat,
                                budgets=Budgets(10**6, 10**6, 10**4, max_thinking_tokens=cap))  # fmt: skip
        return rollout, env

    cut, env = play(thinking - 3)
    assert cut.record["end_reason"] == "thinking_budget" and env.trace == []
    assert cut.trajectory.completion_ids == ids[: thinking - 3] and sum(cut.trajectory.env_mask) == thinking - 3
    for cap in (thinking + 8, 0):
        whole, env = play(cap)
        assert whole.record["end_reason"] == "max_model_calls" and [e.name for e in env.trace] == ["cd"]
    with pytest.raises(SealError, match="max_thinking_tokens"):
        Budgets(max_thinking_tokens=-1)


def test_auto_picks_a_mode_that_works_for_each_known_family(reports, families, base_tokenizer):
    """``auto`` (env.prompt_mode / env.call_format) picks per family; every pick is a mode the
    check says works, explicit settings are kept, and unknown templates get BFCL's Qwen prompt."""
    from seal_rl.families import DEFAULT_MODE, FAMILY_MODES, resolve_auto

    auto = {"prompt_mode": "auto", "call_format": "auto", "max_model_calls": 5}
    for name, (mode, call_format) in FAMILY_MODES.items():
        works = {(m["mode"], m["call_format"]) for m in reports[name]["modes"] if m["works"]}
        assert (mode, call_format) in works, (name, mode, call_format, works)
        env, note = resolve_auto(auto, families(name))
        assert (env["prompt_mode"], env["call_format"], env["max_model_calls"]) == (mode, call_format, 5)
        assert name in note
    assert FAMILY_MODES["gptoss"] == ("chat_template", "native") and FAMILY_MODES["qwen2_5"] == DEFAULT_MODE
    gptoss = families("gptoss")
    assert resolve_auto({**auto, "prompt_mode": "bfcl_qwen_fc"}, gptoss)[0]["call_format"] == "hermes"  # BFCL's prompt asks for hermes
    assert resolve_auto({**auto, "call_format": "json"}, gptoss)[0] == {**auto, "prompt_mode": "chat_template", "call_format": "json"}
    unknown, note = resolve_auto(auto, base_tokenizer)
    assert (unknown["prompt_mode"], unknown["call_format"]) == DEFAULT_MODE and "no known family" in note
    assert resolve_auto({"prompt_mode": "chat_template", "call_format": "json"}, gptoss) == ({"prompt_mode": "chat_template", "call_format": "json"}, None)


def test_auto_in_a_recipe_and_on_the_command_line(tmp_path):
    from seal_rl.train.recipe import load_recipe

    recipe = load_recipe("smoke-cpu", ["env.prompt_mode=auto", "env.call_format=auto"])  # validated without the model
    assert recipe.env["prompt_mode"] == "auto"
    done = subprocess.run([sys.executable, "-m", "seal_rl", "eval", "--policy", "oracle", "--tasks", "multi_turn_base_0",
                           "--prompt-mode", "auto", "--format", "auto", "--out", str(tmp_path)], capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert done.returncode == 0 and "auto: prompt_mode bfcl_qwen_fc, call_format hermes" in done.stderr, done.stderr[-2000:]
    assert json.loads((tmp_path / "config.json").read_text())["env"]["prompt_mode"] == "bfcl_qwen_fc"
