"""``fastgen encode-data``: a folder of captioned images -> WebDataset shards of latents and text embeddings
(``fastgen.datasets.encode``), through the VAE and text encoders of a diffusers weights folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from fastgen.cli.common import interactive, out, setup_logging
from fastgen.cli.launching import (
    nnodes_option,
    node_rank_option,
    nproc_per_node_option,
    rdzv_endpoint_option,
    rdzv_id_option,
    wants_launch,
)

EPILOG = """\b
Examples:

\b
  # photos/cat.jpg + photos/cat.txt (its caption), ... -> shards of SD 1.5 latents and CLIP embeddings
  fastgen encode-data photos/ data/sd15_latents --weights /weights/stable-diffusion-v1-5 --resolution 512

\b
  # the same on 8 GPUs (each rank writes its own shards); a killed run is re-run with the same command
  fastgen encode-data photos/ data/flux_latents --weights /weights/FLUX.1-dev --resolution 1024 --nproc-per-node 8

\b
  # then train on them
  fastgen train -c SD/config_dmd2_sd15 - model.pretrained_model_path=/weights/stable-diffusion-v1-5 \\
      'dataloader_train.datatags=[WDS:data/sd15_latents]'

DST gets shard-NNNNNN.tar (latent.npy, text.npy and the family's extras - pooled.npy for Flux, text_mask.npy for
Wan -, txt, json per sample), shard-NNNNNN.json (complete shards: kept on a re-run), empty_prompt.npz and
index.json. Images that cannot be read or have no caption are skipped and counted (--strict: an error).
Local folders only for now: S3, WebDataset and video sources are not supported yet.
"""


def encode_data(
    src: str = typer.Argument(..., metavar="SRC", help="A folder of images with same-name .txt captions."),
    dst: str = typer.Argument(..., metavar="DST", help="The shards folder to write (created; complete shards are kept)."),
    weights: str = typer.Option(..., "--weights", help="A diffusers pipeline folder (model_index.json, vae/, text encoders)."),
    resolution: int = typer.Option(512, "--resolution", help="Square side the images are centre-cropped and resized to."),
    batch_size: int = typer.Option(8, "--batch-size", help="Images encoded at once per rank."),
    shard_size: int = typer.Option(1000, "--shard-size", help="Inputs per shard."),
    strict: bool = typer.Option(False, "--strict", help="An unreadable or uncaptioned input is an error, not skipped."),
    device: str = typer.Option("auto", "--device", help="auto (CUDA when available), cpu, cuda or cuda:N."),
    dtype: str = typer.Option("float32", "--dtype", help="The encoders' dtype: float32, bfloat16 or float16."),
    nproc_per_node: Optional[int] = nproc_per_node_option("encode with", needs=" (each rank writes its own shards)"),
    nnodes: str = nnodes_option(),
    node_rank: int = node_rank_option(),
    rdzv_endpoint: Optional[str] = rdzv_endpoint_option(),
    rdzv_id: Optional[str] = rdzv_id_option(),
    log_level: str = typer.Option("WARNING", "--log_level", "--log-level", help="DEBUG, INFO, WARNING or ERROR."),
) -> None:
    """Encode captioned images into latent + text-embedding shards for the latent recipes."""
    from fastgen.utils.errors import UsageError

    setup_logging(log_level)
    for value in (src, dst, weights):
        if "://" in value:
            raise UsageError(f"{value}: encode-data reads and writes local folders for now (copy from S3 first)")
    source, target, folder = Path(src).expanduser(), Path(dst).expanduser(), Path(weights).expanduser()
    from fastgen.datasets.encode import captioned_images, check_sizes
    from fastgen.networks.codecs import codec_family
    from fastgen.utils.dtypes import FLOAT_DTYPES

    # bad input fails here, once, before any model is loaded or any worker started
    if dtype not in FLOAT_DTYPES:
        raise UsageError(f"--dtype {dtype}: choose one of {', '.join(FLOAT_DTYPES)}")
    check_sizes(resolution, shard_size, batch_size)
    sources = captioned_images(source)
    codec_family(folder)
    if wants_launch(nproc_per_node, nnodes):
        from fastgen.cli.launching import launch_this_command

        launch_this_command(nproc_per_node or 1, nnodes, node_rank, rdzv_endpoint, rdzv_id)
        return
    _encode(sources, source, target, folder, resolution, batch_size, shard_size, strict, device, FLOAT_DTYPES[dtype])


def _encode(sources: list[Any], source: Path, target: Path, folder: Path, resolution: int, batch_size: int, shard_size: int,
            strict: bool, device: str, dtype: Any) -> None:
    """One rank's share (``RANK`` of ``WORLD_SIZE`` under torchrun) of ``sources``, then rank 0's index."""
    import os

    from fastgen.cli.download_data import BarProgress, LineProgress

    from fastgen.datasets.encode import encode_folder, write_index
    from fastgen.evaluation.sampling import resolve_device
    from fastgen.networks.codecs import load_codec

    inputs = len(sources)
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    if world > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo")
    codec = load_codec(folder, dtype=dtype).to(resolve_device(device))
    progress = (BarProgress() if interactive() else LineProgress()) if rank == 0 else None
    if progress is not None:
        shards = -(-inputs // shard_size)
        mine = sum(min(shard_size, inputs - s * shard_size) for s in range(0, shards, world))
        progress.start(f"encoding {source} with the {codec.family} codec", total=mine, unit="images")
    try:
        done = encode_folder(codec, sources, target, resolution, shard_size, batch_size, rank, world, strict,
                             None if progress is None else progress.advance)
    finally:
        if progress is not None:
            progress.finish()
    if world > 1:
        dist.barrier()
    if rank == 0:
        index = write_index(codec, target, folder, resolution, inputs, shard_size)
        out().print(f"wrote {index['samples']} samples in {len(index['shards'])} shard(s) to {target} "
                    f"({index['skipped']} input(s) skipped; rank 0 wrote {done['written']} shard(s), kept "
                    f"{done['kept']})", soft_wrap=True)
    if world > 1:
        dist.destroy_process_group()


def register(app: typer.Typer) -> None:
    app.command("encode-data", epilog=EPILOG)(encode_data)
