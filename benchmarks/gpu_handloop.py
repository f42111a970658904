"""A hand-written bf16 training loop of the digits SFT recipe: the reference fastgen's steps/s is compared with in
``benchmarks/gpu_check.sh``.

The same network (``instantiate(config.model.net)`` of ``Digits/config_sft_digits``, loaded through fastgen's
config loader, float32 weights), the same batch (64 digits of the ``DigitsDataset`` train split, drawn by random
indices on the host and copied to the device each step, as a data loader would), the same optimizer
(``instantiate(config.model.net_optimizer)``: Adam, lr 1e-3) and the same SFT loss as ``SFTModel.single_train_step``
(``t = sample_t``, ``x_t = add_noise(x0, eps, t)``, ``loss = mean(loss_weight(t) * mean_pixels((net(x_t, t) -
target)^2))``), with forward and loss under ``torch.autocast(bfloat16)``, then ``backward``, ``step``,
``zero_grad(set_to_none=True)``. No trainer, no callbacks, no condition dropout, plain torch random numbers.

Two variants run one after the other in this process, each with a fresh network and optimizer:

* ``plain`` - the loop above and nothing else: bare PyTorch speed;
* ``clip_ema`` - plus what the recipe's callbacks add to every step: global-norm gradient clipping to 1.0 (one
  host sync for the norm, as ``GradClipCallback``) and an EMA copy updated with one ``torch._foreach_lerp_``
  (power EMA, gamma 6.94, as ``EMACallback``).

Each variant runs ``--iters`` steps; the last ``--window`` are timed (the device synchronised at both ends), the
same window the trainer's last ``iteration N/N ... it/s`` log line covers. Output (parsed by gpu_check.sh)::

    hand loop plain: 123.4 steps/s (steps 201-300 of 300, batch 64, cuda, bf16 autocast, loss 0.1234)
    hand loop clip_ema: 110.2 steps/s (...)

Usage::

    python benchmarks/gpu_handloop.py [--device cuda|cpu] [--iters 300] [--window 100] [--variants plain,clip_ema]
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import torch

RECIPE = "Digits/config_sft_digits"
EMA_GAMMA = 6.94  # the recipe's power EMA (fastgen.callbacks.ema.DEFAULT_GAMMA)
CLIP_NORM = 1.0  # the recipe's grad_clip.grad_norm


def _parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (a quick self-test)")
    parser.add_argument("--iters", type=int, default=300, help="steps per variant (default 300)")
    parser.add_argument("--window", type=int, default=None,
                        help="timed steps at the end of each variant (default: a third of --iters)")
    parser.add_argument("--variants", default="plain,clip_ema", help="comma-separated: plain, clip_ema")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "none"),
                        help="autocast dtype (default bfloat16; none: float32)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.window = args.window or max(args.iters // 3, 1)
    if args.iters < 1 or not 1 <= args.window <= args.iters:
        parser.error("need 1 <= --window <= --iters")
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = set(args.variants) - {"plain", "clip_ema"}
    if unknown:
        parser.error(f"unknown variant(s): {', '.join(sorted(unknown))}")
    return args


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_variant(variant: str, config: object, device: torch.device, iters: int, window: int,
                dtype: torch.dtype | None, seed: int, images: torch.Tensor, labels: torch.Tensor) -> dict:
    from fastgen.configs.instantiate import instantiate

    torch.manual_seed(seed)
    net = instantiate(config.model.net).to(device=device, dtype=torch.float32)
    net.train()
    scheduler = net.noise_scheduler
    params = [p for p in net.parameters() if p.requires_grad]
    optimizer = instantiate(config.model.net_optimizer, params=params)
    extras = variant == "clip_ema"
    ema = [p.detach().clone() for p in params] if extras else []
    batch = int(config.dataloader_train.batch_size)
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)
    loss = torch.zeros((), device=device)
    start = 0.0
    for step in range(1, iters + 1):
        if step == iters - window + 1:
            _sync(device)
            start = time.perf_counter()
        idx = torch.randint(0, images.shape[0], (batch,))
        x0 = images[idx].to(device, non_blocking=True)
        cond = labels[idx].to(device, non_blocking=True)
        with autocast:
            t = scheduler.sample_t(batch, device=device)
            eps = torch.randn_like(x0)
            x_t = scheduler.add_noise(x0, eps, t)
            pred = net(x_t, t, condition=cond)
            target = scheduler.target(x0, eps, t)
            per_sample = (pred.float() - target.float()).square().flatten(1).mean(dim=1)
            loss = (scheduler.loss_weight(t.float()) * per_sample).mean()
        loss.backward()
        if extras:
            total = torch.nn.utils.clip_grad_norm_(params, CLIP_NORM, foreach=True)
            if not math.isfinite(float(total)):  # the one host sync per step GradClipCallback makes too
                raise RuntimeError(f"non-finite gradient norm at step {step}")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if extras:
            beta = (1.0 - 1.0 / step) ** (EMA_GAMMA + 1.0)
            torch._foreach_lerp_(ema, [p.detach() for p in params], 1.0 - beta)
    _sync(device)
    elapsed = time.perf_counter() - start
    value = float(loss.detach())
    if not math.isfinite(value):
        raise RuntimeError(f"the hand-written loop ({variant}) diverged: loss {value}")
    return {"variant": variant, "steps_per_s": window / elapsed, "first": iters - window + 1, "last": iters,
            "iters": iters, "batch": batch, "loss": value}


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    from fastgen.configs.config_utils import load_config
    from fastgen.datasets.digits import DigitsDataset

    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            print("FAIL: hand loop: --device cuda but no CUDA GPU is visible", file=sys.stderr)
            return 2
        torch.cuda.set_device(device.index or 0)
        device = torch.device("cuda", torch.cuda.current_device())
    dtype = None if args.dtype == "none" else getattr(torch, args.dtype)
    config = load_config(RECIPE)
    dataset = DigitsDataset(split="train")
    images, labels = dataset.images, dataset.labels
    for variant in args.variants:
        r = run_variant(variant, config, device, args.iters, args.window, dtype, args.seed, images, labels)
        print(f"hand loop {variant}: {r['steps_per_s']:.1f} steps/s (steps {r['first']}-{r['last']} of {r['iters']}, "
              f"batch {r['batch']}, {device.type}, {args.dtype} autocast, loss {r['loss']:.4f})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
