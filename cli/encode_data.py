"""``fastgen encode-data``: captioned images or videos (a folder, or WebDataset shards local or in S3) ->
WebDataset shards of latents and text embeddings (``fastgen.datasets.encode``), through the VAE and text encoders
of a diffusers weights folder."""

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
  # WebDataset shards of jpg/png/mp4 + txt, from S3 (credentials: --credentials-dir/s3.json or AWS_*);
  # videos for Wan: 33 frames, every 2nd, the centred 832x480 (16:9-ish) region of each
  fastgen encode-data s3://bucket/clips/ data/wan_latents --weights /weights/Wan2.1-T2V-1.3B-Diffusers \\
      --resolution 832x480 --frames 33 --frame-stride 2

\b
  # LTX-2: clips with sound -> video latents, audio latents (log-mel through its audio VAE) and Gemma-3 text;
  # 121 frames (8 k + 1) of 768x512 at 24 fps, their 5.04 s of sound; clips without an audio track are skipped
  fastgen encode-data clips/ data/ltx2_19b_latents --weights /weights/LTX-2 --resolution 768x512 --frames 121 \\
      --dtype bfloat16 --nproc-per-node 8

\b
  # then train on them
  fastgen train -c SD/config_dmd2_sd15 - model.pretrained_model_path=/weights/stable-diffusion-v1-5 \\
      'dataloader_train.datatags=[WDS:data/sd15_latents]'

SRC: a folder of images / videos with same-name .txt captions, or WebDataset shards (a folder of .tar files or
s3://bucket/prefix) whose samples hold jpg/png/webp/mp4 + txt. DST (a local folder or s3://bucket/prefix) gets shard-NNNNNN.tar
(latent.npy, text.npy and the family's extras - pooled.npy for Flux, text_mask.npy for Wan, audio_latent.npy for
LTX-2 and Cosmos 3 with sound -, txt, json per sample), shard-NNNNNN.json (complete shards: kept on a re-run), empty_prompt.npz and index.json. Inputs that
cannot be read, have no caption, or are too short for --frames are skipped and counted (--strict: an error).
"""


def encode_data(
    src: str = typer.Argument(..., metavar="SRC", help="A folder of images / videos with same-name .txt captions, or WebDataset shards (folder or s3://)."),
    dst: str = typer.Argument(..., metavar="DST", help="The shards folder or s3:// prefix to write (complete shards are kept)."),
    weights: str = typer.Option(..., "--weights", help="A diffusers pipeline folder (model_index.json, vae/, text encoders)."),
    resolution: str = typer.Option("512", "--resolution", metavar="SIDE|WxH", help="Square side the pictures are centre-cropped and resized to, or WIDTHxHEIGHT (e.g. 832x480: the largest centred region of that shape)."),
    batch_size: int = typer.Option(8, "--batch-size", help="Images encoded at once per rank."),
    shard_size: int = typer.Option(1000, "--shard-size", help="Inputs per shard."),
    frames: int = typer.Option(17, "--frames", help="Videos: frames taken from each (Wan, CogVideoX: 4 k + 1; CogVideoX-5b: 49)."),
    frame_stride: int = typer.Option(1, "--frame-stride", help="Videos: take every N-th frame."),
    credentials_dir: str = typer.Option("./credentials/", "--credentials-dir", help="s3:// SRC / DST: the folder whose s3.json holds the credentials (else AWS_* variables)."),
    strict: bool = typer.Option(False, "--strict", help="An unreadable or uncaptioned input is an error, not skipped."),
    device: str = typer.Option("auto", "--device", help="auto (CUDA when available), cpu, cuda or cuda:N."),
    dtype: str = typer.Option("float32", "--dtype", help="The encoders' dtype: float32, bfloat16 or float16."),
    nproc_per_node: Optional[int] = nproc_per_node_option("encode with", needs=" (each rank writes its own shards)"),
    nnodes: str = nnodes_option(),
    node_rank: int = node_rank_option(),
    rdzv_endpoint: Optional[str] = rdzv_endpoint_option(),
    rdzv_id: Optional[str] = rdzv_id_option(),
    no_sound: bool = typer.Option(False, "--no-sound", help="Cosmos 3 with a sound tokenizer: encode the video alone (LTX-2 always needs the sound)."),
    log_level: str = typer.Option("WARNING", "--log-level", help="DEBUG, INFO, WARNING or ERROR."),
) -> None:
    """Encode captioned images into latent + text-embedding shards for the latent recipes."""
    from fastgen.utils.errors import UsageError

    setup_logging(log_level)
    if "://" in weights:
        raise UsageError(f"--weights {weights}: a local diffusers pipeline folder")
    for value in (src, dst):
        if "://" in value and not value.startswith("s3://"):
            raise UsageError(f"{value}: encode-data reads and writes local folders or s3:// prefixes")
    folder = Path(weights).expanduser()
    from fastgen.datasets.encode import Frames, check_sizes
    from fastgen.networks.codecs import codec_family, has_component
    from fastgen.utils.dtypes import FLOAT_DTYPES

    # bad input fails here, once, before any model is loaded or any worker started
    if dtype not in FLOAT_DTYPES:
        raise UsageError(f"--dtype {dtype}: choose one of {', '.join(FLOAT_DTYPES)}")
    size = _resolution(resolution)
    check_sizes(size, shard_size, batch_size)
    if frames < 1 or frame_stride < 1:
        raise UsageError("--frames and --frame-stride must be at least 1")
    if src.startswith("s3://") or dst.startswith("s3://"):
        from fastgen.utils.env import load_credentials

        load_credentials(credentials_dir)
    shards = _shards(src, shard_size)
    family = codec_family(folder)
    if family == "ltx2" and no_sound:  # its networks generate both streams: video-only shards would not train them
        raise UsageError("--no-sound: LTX-2 trains its video and audio streams together, so its shards need the sound")
    if family == "ltx2" and not has_component(folder, "audio_vae"):
        raise UsageError(f"{folder}: the LTX-2 pipeline has no audio_vae, which its shards' sound needs")
    _check_frames(family, folder, frames)
    if wants_launch(nproc_per_node, nnodes):
        from fastgen.cli.launching import launch_this_command

        launch_this_command(nproc_per_node or 1, nnodes, node_rank, rdzv_endpoint, rdzv_id)
        return
    _encode(shards, src, dst, folder, size, batch_size, strict, device, FLOAT_DTYPES[dtype],
            Frames(frames, frame_stride), not no_sound)


def _resolution(text: str) -> int | tuple[int, int]:
    """``--resolution``: ``N`` (a square side) or ``WIDTHxHEIGHT``."""
    from fastgen.utils.errors import UsageError

    parts = text.lower().split("x")
    if len(parts) in (1, 2) and all(part.strip().isdigit() for part in parts):
        values = [int(part) for part in parts]
        return values[0] if len(values) == 1 else (values[0], values[1])
    raise UsageError(f"--resolution {text}: a square side (512) or WIDTHxHEIGHT (832x480)")


def _shards(src: str, shard_size: int) -> list[Any]:
    """The output shards of SRC: a folder's inputs in slices, or WebDataset shards one for one."""
    from fastgen.datasets.encode import captioned_images, folder_shards, is_webdataset_source, webdataset_shards

    if is_webdataset_source(src):
        return webdataset_shards(src)
    return folder_shards(captioned_images(Path(src).expanduser()), shard_size)


def _check_frames(family: str, folder: Path, frames: int) -> None:
    """Wan's (also Cosmos Predict2's), CogVideoX's and LTX-2's VAEs encode 1 + k n frames (``k``: Wan's config's
    ``scale_factor_temporal``, CogVideoX's ``temporal_compression_ratio``, LTX-2's the same or, when its config
    leaves it out, ``patch_size_t`` times 2 per temporal downsampling; ``CogVideoXPipeline`` makes ``(F - 1) // k
    + 1`` latent frames)."""
    keys = {"wan": ("Wan", "scale_factor_temporal"), "cogvideox": ("CogVideoX", "temporal_compression_ratio"),
            "ltx2": ("LTX-2", "temporal_compression_ratio"),
            "cosmos2": ("Cosmos Predict2's Wan", "scale_factor_temporal"),
            "cosmos25": ("Cosmos Predict 2.5's Wan", "scale_factor_temporal")}
    if family not in keys or frames == 1:
        return
    import json

    from fastgen.utils.errors import UsageError

    name, key = keys[family]
    try:
        config = json.loads((folder / "vae" / "config.json").read_text())
    except (OSError, ValueError):
        return
    temporal = config.get(key)
    if temporal is None and family == "ltx2":  # AutoencoderKLLTX2Video derives it: p_t 2^(time downsamplings)
        scaling = config.get("spatio_temporal_scaling") or (True,) * 4
        temporal = int(config.get("patch_size_t") or 1) * 2 ** sum(bool(step) for step in scaling)
    temporal = int(temporal or 4)
    if (frames - 1) % temporal:
        raise UsageError(f"--frames {frames}: {name}'s VAE encodes 1 + {temporal} k frames (e.g. "
                         f"{(frames - 1) // temporal * temporal + 1} or {((frames - 1) // temporal + 1) * temporal + 1})")


def _encode(shards: list[Any], source: str, target: str, folder: Path, resolution: Any, batch_size: int,
            strict: bool, device: str, dtype: Any, frames: Any, sound: bool) -> None:
    """One rank's share (``RANK`` of ``WORLD_SIZE`` under torchrun) of ``shards``, then rank 0's index.
    ``sound``: a codec with a sound encoder (``waveform_rate``) also encodes each clip's audio track."""
    import dataclasses
    import os

    from fastgen.cli.download_data import BarProgress, LineProgress

    from fastgen.datasets.encode import Destination, encode_shards, write_index
    from fastgen.evaluation.sampling import resolve_device
    from fastgen.networks.codecs import codec_class, codec_family, load_codec

    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    if world > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo")
    # a family whose shards hold no text condition (Cosmos Predict 2.5: codec.text_in_shards) needs no text encoder
    text = bool(getattr(codec_class(codec_family(folder)), "text_in_shards", True))
    codec = load_codec(folder, dtype=dtype, text=text).to(resolve_device(device))
    if sound and codec.waveform_rate:
        frames = dataclasses.replace(frames, sound_rate=codec.waveform_rate)
    progress = (BarProgress() if interactive() else LineProgress()) if rank == 0 else None
    if progress is not None:
        sizes = [shard.size for shard in shards[rank::world]]
        total = sum(sizes) if all(size is not None for size in sizes) else None  # WebDataset: unknown until read
        progress.start(f"encoding {source} with the {codec.family} codec", total=total, unit="inputs")
    destination = Destination(target)
    try:
        try:
            done = encode_shards(codec, shards, destination, resolution, batch_size, rank, world, strict,
                                 None if progress is None else progress.advance, frames)
        finally:
            if progress is not None:
                progress.finish()
        if world > 1:
            dist.barrier()
        if rank == 0:
            index = write_index(codec, destination, folder, resolution, len(shards),
                                frames if codec.video else None)
            out().print(f"wrote {index['samples']} samples in {len(index['shards'])} shard(s) to {target} "
                        f"({index['skipped']} input(s) skipped; rank 0 wrote {done['written']} shard(s), kept "
                        f"{done['kept']})", soft_wrap=True)
    finally:
        if destination.s3 is not None:  # the scratch folder of the uploads
            import shutil

            shutil.rmtree(destination.local, ignore_errors=True)
    if world > 1:
        dist.destroy_process_group()


def register(app: typer.Typer) -> None:
    app.command("encode-data", epilog=EPILOG)(encode_data)
