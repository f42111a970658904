"""``model.torch_compile_mode``: training steps/s of the compiled DiT (digits SFT recipe) ÷ the eager one, on CPU.

Two copies of the method (same seed, same weights) train on the same batches; one has its trained network
compiled block by block (``fastgen.distributed.parallelize.apply_compile``, ``mode`` below). After ``--warmup`` steps
each (compilation happens in the compiled copy's first steps and is not timed), the two alternate step by step
(eager, compiled, eager, ...) for ``--steps`` steps per round, so a drift in machine speed hits both; each round
reports steps/s of each and their ratio, and the run ends with the median ratio. Reported as measured (no goal):
on a 2-core CPU the small digits DiT is dominated by per-op overhead, which inductor's fused kernels remove.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/compile_speed.py [--mode default] [--batch 128] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def build(recipe: str, mode: str | None, batch: int):
    from fastgen.configs.config_utils import load_config
    from fastgen.configs.instantiate import instantiate
    from fastgen.distributed.parallelize import apply_compile

    config = load_config(recipe)
    config.model.torch_compile_mode = mode
    torch.manual_seed(0)
    model = instantiate(config.model_class, config=config.model)
    model.init_weights()
    apply_compile(model)
    model.init_optimizers()
    model.train()
    config.dataloader_train.batch_size = batch
    return model, config


def step(model, data: dict, iteration: int) -> None:
    with model.bind_batch(data, iteration, seed=0):
        loss_dict, _ = model.single_train_step(data, iteration)
    loss_dict["total_loss"].backward()
    for optimizer in model.optimizer_dict.values():
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="Digits/config_sft_dit_digits")
    parser.add_argument("--mode", default="default")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from fastgen.configs.instantiate import instantiate

    eager, config = build(args.recipe, None, args.batch)
    compiled, _ = build(args.recipe, args.mode, args.batch)
    loader = instantiate(config.dataloader_train)
    batches = [next(loader) for _ in range(args.warmup + args.steps * args.rounds)]
    started = time.perf_counter()
    for i in range(args.warmup):
        step(eager, batches[i], i)
        step(compiled, batches[i], i)
    print(f"{args.recipe}, batch {args.batch}, mode {args.mode}, {torch.get_num_threads()} threads; warm-up with "
          f"compilation {time.perf_counter() - started:.0f} s\n")
    print("| round | eager steps/s | compiled steps/s | compiled / eager |\n|---:|---:|---:|---:|")
    ratios = []
    index = args.warmup
    for round_index in range(args.rounds):
        spent = {"eager": 0.0, "compiled": 0.0}
        for _ in range(args.steps):
            for name, model in (("eager", eager), ("compiled", compiled)):
                start = time.perf_counter()
                step(model, batches[index], index)
                spent[name] += time.perf_counter() - start
            index += 1
        rates = {k: args.steps / v for k, v in spent.items()}
        ratios.append(rates["compiled"] / rates["eager"])
        print(f"| {round_index} | {rates['eager']:.2f} | {rates['compiled']:.2f} | {ratios[-1]:.2f} |")
    print(f"median ratio: {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
