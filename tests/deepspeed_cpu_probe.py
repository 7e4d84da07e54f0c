"""DeepSpeed ZeRO-3 on a CPU machine: 2 processes, DeepSpeed's CPU accelerator, gloo.

Not a pytest test (no ``test_`` prefix; needs ``deepspeed``, which is in the ``gpu`` extra only).
It trains a tiny random Llama for a few optimizer steps under ZeRO-3 through accelerate's
DeepSpeed plugin, saves the full model from every rank (``zero3_save_16bit_model``:
``accelerator.get_state_dict`` gathers the partitioned weights collectively), reloads it with
``AutoModelForCausalLM.from_pretrained`` and checks that it is the trained model.

    DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 tests/deepspeed_cpu_probe.py OUT_DIR [--ds-adam] [--bf16]

(or ``accelerate launch --num_processes 2 tests/deepspeed_cpu_probe.py OUT_DIR``; the plugin is
built here, so no DeepSpeed flags are needed). ``--ds-adam`` uses DeepSpeed's own optimizer from
the config (its CPU op is JIT-compiled with the system C++ compiler) instead of torch's AdamW.
See docs/guides/deepspeed-cpu.md for versions and timings.
"""

from __future__ import annotations

import argparse
import os
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--ds-adam", action="store_true", help="DeepSpeed's optimizer (JIT-compiled CPU op)")
    parser.add_argument("--bf16", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    started = time.perf_counter()

    from accelerate import Accelerator
    from accelerate.utils import DeepSpeedPlugin, InitProcessGroupKwargs
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    ds_config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True},
        "bf16": {"enabled": args.bf16},
        "steps_per_print": 10**9,
    }
    if args.ds_adam:
        ds_config["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0}}
    # backend="gloo" is needed: without CUDA, accelerate finds no backend, lets DeepSpeed initialise
    # the process group by itself and then believes it runs alone (num_processes 1, every rank the
    # main process): every rank writes the model, which then holds empty ZeRO placeholders.
    # `cpu=True` is no way out: accelerate turns DeepSpeed off on CPU.
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=ds_config),
                              kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")])
    assert accelerator.num_processes == int(os.environ.get("WORLD_SIZE", 1)), accelerator.num_processes
    rank = accelerator.process_index
    import deepspeed
    import torch.distributed as dist

    backend = dist.get_backend() if dist.is_initialized() else None
    accelerator.print(f"deepspeed {deepspeed.__version__}, accelerator {deepspeed.get_accelerator().device_name()}, "
                      f"backend {backend}, world {accelerator.num_processes}, {accelerator.distributed_type}")

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(config)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if args.ds_adam:
        from accelerate.utils import DummyOptim

        optimizer = DummyOptim(model.parameters())
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.print(f"engine: {type(model).__name__}, optimizer: {type(optimizer.optimizer).__name__}, "
                      f"zero stage {model.zero_optimization_stage()}, prepared in {time.perf_counter() - started:.1f}s")
    # Each rank owns a shard of every parameter (ZeRO-3): the local tensors are empty placeholders.
    local = sum(p.ds_tensor.numel() for p in model.module.parameters())
    full = sum(p.ds_numel for p in model.module.parameters())
    print(f"rank {rank}: holds {local} of {full} parameters", flush=True)

    generator = torch.Generator().manual_seed(100 + rank)
    batch = torch.randint(0, config.vocab_size, (2, 32), generator=generator)
    losses = []
    for _ in range(args.steps):
        loss = model(input_ids=batch, labels=batch).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    with torch.no_grad():
        final_loss = model(input_ids=batch, labels=batch).loss.item()
    print(f"rank {rank}: losses {[round(x, 3) for x in losses]} -> {final_loss:.3f}", flush=True)
    assert final_loss < losses[0], "training did not lower the loss"

    # The final save, on every rank: get_state_dict gathers the ZeRO-3 shards (a collective).
    saving = time.perf_counter()
    state_dict = accelerator.get_state_dict(model)
    # Rank 0 gets the full 16-bit state dict, the others None. save_pretrained empties the dict it
    # is given (transformers 5.23), hence the copy for the checks below.
    print(f"rank {rank}: gathered state dict with {len(state_dict or {})} tensors", flush=True)
    gathered = {k: v.detach().clone() for k, v in (state_dict or {}).items()}
    accelerator.unwrap_model(model).save_pretrained(
        args.out, is_main_process=accelerator.is_main_process, save_function=accelerator.save, state_dict=state_dict,
    )
    accelerator.wait_for_everyone()
    accelerator.print(f"saved {args.out} in {time.perf_counter() - saving:.1f}s: {sorted(os.listdir(args.out))}")

    if accelerator.is_main_process:
        # While accelerate's DeepSpeed config is registered, from_pretrained builds the model under
        # deepspeed.zero.Init, a collective: called on one rank it waits for the others for ever.
        from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled, unset_hf_deepspeed_config

        assert is_deepspeed_zero3_enabled()
        unset_hf_deepspeed_config()
        reloaded = AutoModelForCausalLM.from_pretrained(args.out, dtype=torch.float32)
        reloaded_sd = reloaded.state_dict()
        assert set(reloaded_sd) == set(initial), set(reloaded_sd) ^ set(initial)
        for name, value in reloaded_sd.items():
            assert value.shape == initial[name].shape, (name, value.shape)
            assert torch.equal(value, gathered[name].float()), name
        changed = sum(not torch.equal(reloaded_sd[k], initial[k]) for k in initial)
        with torch.no_grad():
            reloaded_loss = reloaded(input_ids=batch, labels=batch).loss.item()
        print(f"reloaded: {changed}/{len(initial)} tensors changed by training; loss {reloaded_loss:.4f} "
              f"(engine {final_loss:.4f})", flush=True)
        assert changed == len(initial)
        assert abs(reloaded_loss - final_loss) < (5e-2 if args.bf16 else 1e-4)
    accelerator.wait_for_everyone()
    accelerator.print(f"OK in {time.perf_counter() - started:.1f}s")
    accelerator.end_training()


if __name__ == "__main__":
    main()
