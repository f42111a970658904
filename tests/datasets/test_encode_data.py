"""``fastgen encode-data`` (issue 34, point 2, local folders): captioned images -> shards whose latents and text
embeddings are the codec's, skipped inputs counted, complete shards kept on a re-run, two ranks writing the same
shards one process writes, and the recipes' WebDataset loader reading the result."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from fastgen_testing import run_cli
from multirank import fastgen
from tiny_pipelines import tiny_sd_pipeline

CAPTIONS = ["a red cat", "a blue dog", "two birds", "a green frog", "the sea"]


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("weights") / "sd"
    tiny_sd_pipeline().save_pretrained(folder)
    return folder


def photos(folder: Path) -> Path:
    """Five captioned images of different sizes, one image without a caption, one file that is not an image."""
    import PIL.Image

    rng = np.random.default_rng(0)
    folder.mkdir()
    for i, caption in enumerate(CAPTIONS):
        size = (20 + 4 * i, 16 + 2 * i)
        PIL.Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(folder / f"img{i}.png")
        (folder / f"img{i}.txt").write_text(caption + "\n")
    PIL.Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(folder / "nocaption.png")
    (folder / "broken.jpg").write_bytes(b"not a jpeg")
    (folder / "broken.txt").write_text("never read")
    return folder


def members(tar_path: Path) -> dict[str, bytes]:
    with tarfile.open(tar_path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def npy(data: bytes) -> np.ndarray:
    return np.load(io.BytesIO(data), allow_pickle=False)


def test_encode_data_writes_the_codecs_latents_and_embeddings(weights: Path, tmp_path: Path) -> None:
    src, dst = photos(tmp_path / "photos"), tmp_path / "shards"
    args = ["encode-data", str(src), str(dst), "--weights", str(weights), "--resolution", "16", "--shard-size", "3",
            "--batch-size", "2", "--device", "cpu"]
    result = run_cli(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "wrote 5 samples in 3 shard(s)" in result.stdout and "2 input(s) skipped" in result.stdout
    index = json.loads((dst / "index.json").read_text())
    assert index["family"] == "sd" and index["samples"] == 5 and index["skipped"] == 2
    assert [s["samples"] for s in index["shards"]] == [2, 3, 0]  # sorted inputs: broken img0 img1 | img2-4 | nocaption
    assert index["normalisation"]["scaling_factor"] == pytest.approx(0.18215)

    from fastgen.datasets.sources import center_crop_resize
    from fastgen.networks.codecs import load_codec

    codec = load_codec(weights)
    found = {}
    for shard in sorted(dst.glob("*.tar")):
        found.update(members(shard))
    for i, caption in enumerate(CAPTIONS):
        key = f"{i + 1:09d}"  # broken.jpg is input 0
        pixels = torch.from_numpy(center_crop_resize(src / f"img{i}.png", 16)).permute(2, 0, 1)[None].float() / 127.5 - 1
        torch.testing.assert_close(torch.from_numpy(npy(found[f"{key}.latent.npy"])), codec.encode_images(pixels)[0],
                                   atol=1e-5, rtol=1e-5)
        assert torch.equal(torch.from_numpy(npy(found[f"{key}.text.npy"])), codec.encode_prompts([caption])["text"][0])
        assert found[f"{key}.txt"].decode() == caption
        assert json.loads(found[f"{key}.json"])["source"] == f"img{i}.png"
    empty = np.load(dst / "empty_prompt.npz", allow_pickle=False)
    assert torch.equal(torch.from_numpy(empty["text"]), codec.encode_prompts([""])["text"][0])

    # the latent recipes' loader reads them as they are
    from fastgen.configs.data import webdataset_loader
    from fastgen.configs.instantiate import instantiate

    loader = instantiate(webdataset_loader([f"WDS:{dst}"], batch_size=2,
                                           fields={"real": "latent.npy", "condition": "text.npy"}))
    batch = next(iter(loader))
    assert batch["real"].shape == (2, 4, 8, 8) and batch["condition"].shape == (2, 12, 16)

    # a re-run keeps the complete shards and rewrites a missing one exactly
    before = {p.name: p.stat().st_mtime_ns for p in dst.glob("shard-*")}
    lost = (dst / "shard-000001.tar").read_bytes()
    (dst / "shard-000001.tar").unlink()
    (dst / "shard-000001.json").unlink()
    again = run_cli(*args, cwd=tmp_path)
    assert again.returncode == 0 and "rank 0 wrote 1 shard(s), kept 2" in again.stdout, again.stderr[-2000:]
    assert (dst / "shard-000001.tar").read_bytes() == lost
    assert all((dst / name).stat().st_mtime_ns == t for name, t in before.items() if "000001" not in name)

    strict = run_cli(*args[:2], str(tmp_path / "strict"), *args[3:], "--strict", cwd=tmp_path)
    errors = [line for line in strict.stderr.splitlines() if line.startswith("error:")]
    assert strict.returncode == 2 and len(errors) == 1 and "broken.jpg: cannot read the image" in errors[0], strict.stderr
    assert "Traceback" not in strict.stderr and "accelerate" not in strict.stderr  # libraries' chatter kept out


def test_two_ranks_write_the_shards_one_process_writes(weights: Path, tmp_path: Path) -> None:
    src = photos(tmp_path / "photos")
    common = ["--weights", str(weights), "--resolution", "16", "--shard-size", "2", "--device", "cpu"]
    # one thread, as torchrun gives each worker: a float reduction then sums in the same order, bit for bit
    one = run_cli("encode-data", str(src), str(tmp_path / "one"), *common, cwd=tmp_path, env={"OMP_NUM_THREADS": "1"})
    assert one.returncode == 0, one.stderr[-2000:]
    two = fastgen("encode-data", str(src), str(tmp_path / "two"), *common, "--nproc-per-node", "2", cwd=tmp_path,
                  timeout=240)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "rank 0 wrote 2 shard(s), kept 0" in two.stdout  # of 4: shards 0 and 2; rank 1 wrote 1 and 3
    names = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "two").iterdir()) and len(list((tmp_path / "one").glob("*.tar"))) == 4
    for name in names:
        if name.endswith(".tar"):
            assert members(tmp_path / "one" / name) == members(tmp_path / "two" / name), name
    assert json.loads((tmp_path / "two" / "index.json").read_text())["samples"] == 5


def test_bad_input_is_one_line(weights: Path, tmp_path: Path) -> None:
    for args, message in (
            (["encode-data", str(tmp_path / "none"), str(tmp_path / "o"), "--weights", str(weights)], "no such folder"),
            (["encode-data", str(tmp_path), "gs://bucket/o", "--weights", str(weights)], "or s3:// prefixes"),
            (["encode-data", str(tmp_path), str(tmp_path / "o"), "--weights", "s3://bucket/w"],
             "a local diffusers pipeline folder"),
            (["encode-data", "s3://b/photos", str(tmp_path / "o"), "--weights", str(weights)], "not a valid S3 bucket"),
            (["encode-data", str(tmp_path), str(tmp_path / "o"), "--weights", str(weights), "--frames", "0"],
             "--frames and --frame-stride"),
            (["encode-data", str(tmp_path), str(tmp_path / "o"), "--weights", str(weights), "--resolution", "12x"],
             "a square side (512) or WIDTHxHEIGHT"),
            (["encode-data", str(tmp_path), str(tmp_path / "o"), "--weights", str(weights), "--resolution", "64x4"],
             "--resolution must be at least 8"),
            (["encode-data", str(tmp_path), str(tmp_path / "o"), "--weights", str(tmp_path)], "holds no images")):
        result = run_cli(*args, cwd=tmp_path)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == 2 and len(lines) == 1 and message in lines[0], (args, result.stderr)


# ---------------------------------------------------------------------------------- WebDataset, S3 and video sources
def png_bytes(seed: int, size: tuple[int, int] = (20, 16)) -> bytes:
    import PIL.Image

    buffer = io.BytesIO()
    image = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    PIL.Image.fromarray(image).save(buffer, format="PNG")
    return buffer.getvalue()


def input_shards(folder: Path) -> list[Path]:
    """Two WebDataset shards of 3 samples: png + txt; in the second, one sample lacks its caption, one its image."""
    from fastgen.datasets.webdataset import write_shards

    samples = [{"__key__": f"s{i}", "png": png_bytes(i), "txt": CAPTIONS[i].encode()} for i in range(4)]
    samples.append({"__key__": "nocap", "png": png_bytes(9)})
    samples.append({"__key__": "noimage", "txt": b"a lost caption"})
    return write_shards(samples, folder, samples_per_shard=3)


def check_webdataset_output(dst: Path, weights: Path) -> None:
    from fastgen.datasets.sources import center_crop_resize
    from fastgen.networks.codecs import load_codec

    index = json.loads((dst / "index.json").read_text())
    assert [s["samples"] for s in index["shards"]] == [3, 1] and index["skipped"] == 2
    codec = load_codec(weights)
    found = {**members(dst / "shard-000000.tar"), **members(dst / "shard-000001.tar")}
    for i, key in enumerate(["000000_000000", "000000_000001", "000000_000002", "000001_000000"]):
        pixels = center_crop_resize(io.BytesIO(png_bytes(i)), 16)
        x = torch.from_numpy(pixels).permute(2, 0, 1)[None].float() / 127.5 - 1
        torch.testing.assert_close(torch.from_numpy(npy(found[f"{key}.latent.npy"])), codec.encode_images(x)[0],
                                   atol=1e-5, rtol=1e-5)
        assert found[f"{key}.txt"].decode() == CAPTIONS[i]
    reasons = json.loads((dst / "shard-000001.json").read_text())["skipped"]
    assert any("no caption" in r for r in reasons) and any("no image or video member" in r for r in reasons)


def test_webdataset_shards_are_encoded_one_output_shard_each(weights: Path, tmp_path: Path) -> None:
    input_shards(tmp_path / "wds")
    dst = tmp_path / "out"
    result = run_cli("encode-data", str(tmp_path / "wds"), str(dst), "--weights", str(weights), "--resolution", "16",
                     "--device", "cpu", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    check_webdataset_output(dst, weights)


def test_webdataset_shards_in_s3_are_read_from_there(weights: Path, tmp_path: Path, s3_server) -> None:  # noqa: ANN001
    client = s3_server.client()
    for shard in input_shards(tmp_path / "wds"):
        client.upload_file(str(shard), s3_server.bucket, f"encode-src/{shard.name}")
    dst = tmp_path / "out"
    result = run_cli("encode-data", f"s3://{s3_server.bucket}/encode-src/", str(dst), "--weights", str(weights),
                     "--resolution", "16", "--device", "cpu", cwd=tmp_path, env=s3_server.environment())
    assert result.returncode == 0, result.stderr[-2000:]
    check_webdataset_output(dst, weights)


@pytest.fixture(scope="module")
def wan_weights(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_pipelines import tiny_family_pipeline

    from fastgen.configs.instantiate import instantiate
    from fastgen.configs.net_diffusers import TINY_WAN, wan_transformer

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("wan") / "wan"
    tiny_family_pipeline("wan", instantiate(wan_transformer(TINY_WAN)).backbone.model).save_pretrained(folder)
    return folder


def test_videos_become_frames_and_video_latents(wan_weights: Path, weights: Path, tmp_path: Path) -> None:
    """Wan at 24x16 (w x h): 5 frames at stride 2 of each 24x20 clip (its centred 24x16 rows, per frame) -> (C, 3,
    h, w) latents equal the codec's of those frames; a clip too short for them is skipped, and so is a video given
    to an image family (SD)."""
    from fastgen.networks.codecs import load_codec
    from fastgen.pipelines.media import read_mp4, write_mp4

    src = tmp_path / "clips"
    src.mkdir()
    rng = np.random.default_rng(0)
    for name, count in (("long", 11), ("short", 6)):
        write_mp4(src / f"{name}.mp4", rng.integers(0, 256, (count, 20, 24, 3), dtype=np.uint8), fps=8)
        (src / f"{name}.txt").write_text(f"a {name} clip")
    dst = tmp_path / "out"
    result = run_cli("encode-data", str(src), str(dst), "--weights", str(wan_weights), "--resolution", "24x16",
                     "--frames", "5", "--frame-stride", "2", "--device", "cpu", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    index = json.loads((dst / "index.json").read_text())
    assert index["samples"] == 1 and index["frames"] == {"count": 5, "stride": 2} and index["resolution"] == [24, 16]
    assert "3 frames at stride 2" in json.loads((dst / "shard-000000.json").read_text())["skipped"][0]
    found = members(dst / "shard-000000.tar")
    frames = np.stack([f[2:18] for f in read_mp4(src / "long.mp4")[0:9:2]])  # rows 2..18: already 24x16
    video = torch.from_numpy(frames).permute(3, 0, 1, 2)[None].float() / 127.5 - 1
    expected = load_codec(wan_weights).encode_images(video)[0]
    assert expected.shape[1:] == (3, 8, 12)  # the tiny VAE halves time (5 frames -> 3) and space
    torch.testing.assert_close(torch.from_numpy(npy(found["000000000.latent.npy"])), expected, atol=1e-5, rtol=1e-5)
    assert json.loads(found["000000000.json"])["frames"] == [0, 2, 5]
    assert json.loads(found["000000000.json"])["crop"] == [0, 2, 24, 16]

    sd = run_cli("encode-data", str(src), str(tmp_path / "sd"), "--weights", str(weights), "--resolution", "16",
                 "--device", "cpu", "--strict", cwd=tmp_path)
    assert sd.returncode == 2 and "this family's codec encodes images" in sd.stderr, sd.stderr
    wrong = run_cli("encode-data", str(src), str(tmp_path / "w"), "--weights", str(wan_weights), "--frames", "4",
                    cwd=tmp_path)
    assert wrong.returncode == 2 and "1 + 4 k frames" in wrong.stderr, wrong.stderr



def test_cogvideox_videos_become_frame_latents(tmp_path: Path) -> None:
    """CogVideoX: 5 frames at stride 2 of a clip -> ``(C, 3, h, w)`` latents (the tiny VAE halves time) equal to the
    codec's, i.e. ``scaling_factor`` times the VAE's mode, channel major; text of 226 T5 tokens; ``--frames`` off
    the VAE's ``1 + k n`` is one line naming CogVideoX."""
    from tiny_pipelines import tiny_family_pipeline

    from fastgen.configs.instantiate import instantiate
    from fastgen.configs.net_diffusers import TINY_COGVIDEOX, cogvideox_transformer
    from fastgen.datasets.sources import center_crop_resize_array
    from fastgen.networks.codecs import load_codec
    from fastgen.pipelines.media import read_mp4, write_mp4

    torch.manual_seed(0)
    weights = tmp_path / "cogvideox"
    tiny_family_pipeline("cogvideox", instantiate(cogvideox_transformer(TINY_COGVIDEOX)).backbone.model).save_pretrained(weights)
    src = tmp_path / "clips"
    src.mkdir()
    write_mp4(src / "clip.mp4", np.random.default_rng(0).integers(0, 256, (11, 20, 24, 3), dtype=np.uint8), fps=8)
    (src / "clip.txt").write_text("a clip")
    dst = tmp_path / "out"
    result = run_cli("encode-data", str(src), str(dst), "--weights", str(weights), "--resolution", "16",
                     "--frames", "5", "--frame-stride", "2", "--device", "cpu", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    index = json.loads((dst / "index.json").read_text())
    assert index["family"] == "cogvideox" and index["samples"] == 1 and index["latent_shape"] == [1, 3, 8, 8]
    found = members(dst / "shard-000000.tar")
    frames = np.stack([center_crop_resize_array(f, 16) for f in read_mp4(src / "clip.mp4")[0:9:2]])
    video = torch.from_numpy(frames).permute(3, 0, 1, 2)[None].float() / 127.5 - 1
    codec = load_codec(weights)
    expected = codec.encode_images(video)[0]
    with torch.no_grad():
        raw = codec.vae.encode(video).latent_dist.mode()[0]
    torch.testing.assert_close(expected, raw * codec.vae.config.scaling_factor)
    torch.testing.assert_close(torch.from_numpy(npy(found["000000000.latent.npy"])), expected, atol=1e-5, rtol=1e-5)
    assert npy(found["000000000.text.npy"]).shape == (226, 16)
    wrong = run_cli("encode-data", str(src), str(tmp_path / "w"), "--weights", str(weights), "--frames", "4",
                    cwd=tmp_path)
    assert wrong.returncode == 2 and "CogVideoX's VAE encodes 1 + 2 k frames" in wrong.stderr, wrong.stderr

def test_shards_are_written_to_s3_and_a_rerun_keeps_them(weights: Path, tmp_path: Path, s3_server) -> None:  # noqa: ANN001
    """DST s3://: every file lands in S3 byte for byte as a local DST gets it (tars before their sidecars); a
    re-run finds the sidecars there and rewrites nothing; no scratch copy is left."""
    src = photos(tmp_path / "photos")
    common = ["--weights", str(weights), "--resolution", "16", "--shard-size", "3", "--device", "cpu"]
    local = run_cli("encode-data", str(src), str(tmp_path / "local"), *common, cwd=tmp_path)
    assert local.returncode == 0, local.stderr[-2000:]
    url = f"s3://{s3_server.bucket}/encode-dst/run1"
    env = {**s3_server.environment(), "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir()
    first = run_cli("encode-data", str(src), url, *common, cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stderr[-2000:]
    client = s3_server.client()
    listed = client.list_objects_v2(Bucket=s3_server.bucket, Prefix="encode-dst/run1/")["Contents"]
    names = sorted(o["Key"].rsplit("/", 1)[-1] for o in listed)
    assert names == sorted(p.name for p in (tmp_path / "local").iterdir())
    for name in names:
        if name.endswith(".tar"):
            body = client.get_object(Bucket=s3_server.bucket, Key=f"encode-dst/run1/{name}")["Body"].read()
            assert body == (tmp_path / "local" / name).read_bytes()
    index = json.loads(client.get_object(Bucket=s3_server.bucket, Key="encode-dst/run1/index.json")["Body"].read())
    assert index["samples"] == 5 and index["latent_shape"] == [4, 8, 8]
    again = run_cli("encode-data", str(src), url, *common, cwd=tmp_path, env=env)
    assert again.returncode == 0 and "wrote 0 shard(s), kept 3" in again.stdout, again.stdout + again.stderr
    assert not any((tmp_path / "tmp").iterdir())
