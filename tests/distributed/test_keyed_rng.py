"""The keyed, counter-based noise generator (``fastgen.distributed.keyed_rng``): the hash, the statistics of its
normals / uniforms / integers, what the keys are (and are not) a function of, dtypes and devices."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

import fastgen.distributed.keyed_rng as keyed_rng
from fastgen.distributed.keyed_rng import (
    GLOBAL_NOISE,
    KeyedNoise,
    TorchNoise,
    as_noise_source,
    lowbias32,
    lowbias32_int,
)


def ids(n: int, start: int = 0) -> torch.Tensor:
    return torch.arange(start, start + n, dtype=torch.int64)


def numpy_lowbias32(x: np.ndarray) -> np.ndarray:
    """An independent reference: the C function on numpy uint32, whose arithmetic wraps mod 2^32 by definition."""
    x = x.astype(np.uint32)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint32(16)
        x *= np.uint32(0x7FEB352D)
        x ^= x >> np.uint32(15)
        x *= np.uint32(0x846CA68B)
        x ^= x >> np.uint32(16)
    return x


# ---- the hash ------------------------------------------------------------------------------------------------
def test_lowbias32_matches_the_c_function_on_uint32() -> None:
    values = np.concatenate([np.arange(1000), np.random.default_rng(0).integers(0, 2**32, 20_000),
                             [2**31 - 1, 2**31, 2**32 - 1]]).astype(np.int64)
    expected = numpy_lowbias32(values).astype(np.int64)
    got = lowbias32(torch.from_numpy(values.copy()))
    assert np.array_equal(got.numpy(), expected)
    assert [lowbias32_int(int(v)) for v in values[:300]] == expected[:300].tolist()
    assert int(got.min()) >= 0 and int(got.max()) < 2**32


def test_lowbias32_is_a_permutation_on_a_sample() -> None:
    x = torch.arange(0, 2**20, dtype=torch.int64) * 4093  # distinct inputs give distinct outputs
    assert lowbias32(x.clone()).unique().numel() == x.numel()


# ---- statistics ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def normals() -> torch.Tensor:
    """512 samples x 2048 elements of one draw (1M normals), float64 out."""
    return KeyedNoise(7, ids(512, start=10_000), step=3).randn((512, 2048), dtype=torch.float64)


def test_normals_have_mean_0_variance_1_and_normal_moments(normals: torch.Tensor) -> None:
    flat = normals.flatten()
    n = flat.numel()
    assert abs(float(flat.mean())) < 5 / math.sqrt(n)
    assert abs(float(flat.var()) - 1.0) < 5 * math.sqrt(2 / n)
    assert abs(float(stats.skew(flat.numpy()))) < 5 * math.sqrt(6 / n)
    assert abs(float(stats.kurtosis(flat.numpy()))) < 5 * math.sqrt(24 / n)


def test_normals_pass_a_kolmogorov_smirnov_test_and_have_normal_tails(normals: torch.Tensor) -> None:
    flat = normals.flatten().numpy()
    assert stats.kstest(flat, "norm").pvalue > 1e-3
    n = flat.size
    for k in (2.0, 3.0, 4.0):
        expected = 2 * stats.norm.sf(k)
        assert abs((np.abs(flat) > k).mean() - expected) < 5 * math.sqrt(expected / n) + 1e-7


def correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1])


def test_no_correlation_between_neighbouring_ids_elements_draws_and_steps(normals: torch.Tensor) -> None:
    bound = 5 / math.sqrt(normals[1:].numel())
    assert abs(correlation(normals[:-1], normals[1:])) < bound  # sample ids i, i + 1
    assert abs(correlation(normals[:, :-1], normals[:, 1:])) < bound  # elements e, e + 1 (Box-Muller pairs too)
    assert abs(correlation(normals[:, 0::2], normals[:, 1::2])) < bound  # the two normals of one pair
    assert abs(correlation(normals[:, 1:-1:2], normals[:, 2::2])) < bound  # across pair boundaries
    noise = KeyedNoise(7, ids(512, start=10_000), step=3)
    first, second = noise.randn((512, 2048), dtype=torch.float64), noise.randn((512, 2048), dtype=torch.float64)
    assert abs(correlation(first, second)) < bound  # draw k, k + 1 of one step
    assert torch.equal(first, normals)  # draw 0 again
    later = KeyedNoise(7, ids(512, start=10_000), step=4).randn((512, 2048), dtype=torch.float64)
    assert abs(correlation(normals, later)) < bound  # the same samples at the next step


def test_uniforms_fill_equal_buckets_and_pairs_fill_a_grid() -> None:
    u = KeyedNoise(1, ids(256), step=0).rand((256, 4096), dtype=torch.float64)
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    counts = torch.histc(u, bins=100, min=0.0, max=1.0)
    assert stats.chisquare(counts.numpy()).pvalue > 1e-3
    grid = (u[:, 0::2] * 16).long() * 16 + (u[:, 1::2] * 16).long()  # neighbouring elements jointly uniform
    assert stats.chisquare(torch.bincount(grid.flatten(), minlength=256).numpy()).pvalue > 1e-3
    across = (u[:-1, :512] * 16).long() * 16 + (u[1:, :512] * 16).long()  # neighbouring sample ids jointly uniform
    assert stats.chisquare(torch.bincount(across.flatten(), minlength=256).numpy()).pvalue > 1e-3


def test_integers_are_uniform_below_high() -> None:
    values = KeyedNoise(2, ids(1024), step=9).randint(10, (1024, 100))
    assert values.dtype == torch.int64 and int(values.min()) == 0 and int(values.max()) == 9
    assert stats.chisquare(torch.bincount(values.flatten(), minlength=10).numpy()).pvalue > 1e-3
    with pytest.raises(ValueError, match="high"):
        KeyedNoise(2, ids(4), step=0).randint(2**31, (4,))


# ---- keys ----------------------------------------------------------------------------------------------------
def test_a_row_depends_on_its_sample_id_not_on_the_rest_of_the_batch() -> None:
    """The property world-size invariance rests on: a sample draws the same noise in any batch that holds it."""
    full = KeyedNoise(0, ids(8), step=5).randn((8, 3, 4, 4))
    for part in (ids(8)[0::2], ids(8)[1::2], torch.tensor([6, 1, 3])):
        assert torch.equal(KeyedNoise(0, part, step=5).randn((len(part), 3, 4, 4)), full[part])


def test_repeated_batches_are_keyed_by_sample_and_copy() -> None:
    """A draw of 3B rows (``Tensor.repeat`` layout: copy k of sample i at row k B + i) gives every copy its own
    noise, keyed by (sample, copy), so a half batch draws the same copies."""
    full = KeyedNoise(0, ids(4), step=1).randn((12, 5))
    half = KeyedNoise(0, ids(4)[2:], step=1).randn((6, 5))
    for k in range(3):
        assert torch.equal(half[2 * k:2 * k + 2], full[4 * k + 2:4 * k + 4])
    assert not torch.equal(full[0], full[4]) and not torch.equal(full[4], full[8])
    with pytest.raises(ValueError, match="multiple of the batch"):
        KeyedNoise(0, ids(4), step=1).randn((6, 5))


def test_rows_view_cycles_the_batch_and_shares_the_draw_counter() -> None:
    noise = KeyedNoise(0, ids(4), step=1)
    pool = noise.rows(6)  # slot j: sample j % 4, copy j // 4
    picked = pool.randint(1000, (6,))
    assert noise.draws == 1
    again = KeyedNoise(0, ids(4), step=1).randint(1000, (8,))  # the same draw index, 2 copies of the batch
    assert torch.equal(picked, again[:6])
    halves = [KeyedNoise(0, part, step=1).rows(3).randint(1000, (3,)) for part in (ids(4)[:2], ids(4)[2:])]
    assert torch.equal(halves[0][:2], picked[:2]) and torch.equal(halves[1][:2], picked[2:4])


def test_every_key_word_changes_the_noise() -> None:
    base = KeyedNoise(0, ids(4), step=1, stream="train").randn((4, 64))
    for other in (KeyedNoise(1, ids(4), step=1), KeyedNoise(0, ids(4, start=4), step=1),
                  KeyedNoise(0, ids(4), step=2), KeyedNoise(0, ids(4), step=1, stream="val"),
                  KeyedNoise(2**40, ids(4), step=1), KeyedNoise(0, ids(4) + 2**40, step=1)):
        changed = other.randn((4, 64))
        assert not torch.isclose(changed, base).any(dim=1).all()  # every row differs


def test_shared_draws_are_the_same_for_any_batch_and_count_with_the_step() -> None:
    """Per-step choices: every rank (any sample ids) draws the same value; the draw counter is the step's."""
    rank0, rank1 = KeyedNoise(3, ids(4), step=7), KeyedNoise(3, ids(4, start=4), step=7)
    for noise in (rank0, rank1):
        noise.randn((4, 2))  # a per-sample draw first: the shared draw is the step's second
    a, b = rank0.shared.randint(4, ()), rank1.shared.randint(4, ())
    assert a.shape == () and torch.equal(a, b)
    choices = torch.stack([KeyedNoise(3, ids(4), step=s).shared.randint(4, ()) for s in range(200)])
    assert set(choices.tolist()) == {0, 1, 2, 3}
    assert torch.equal(rank0.shared.rand((3, 2)), rank1.shared.rand((3, 2)))


def test_blocked_cpu_generation_equals_one_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU path hashes in cache-sized blocks; the numbers must not depend on the block size (odd widths too)."""
    def draw(shape: tuple[int, ...]) -> list[torch.Tensor]:
        noise = KeyedNoise(0, ids(shape[0]), step=0)
        return [noise.randn(shape), noise.rand(shape), noise.randint(7, shape)]

    expected = {shape: draw(shape) for shape in ((6, 3, 5, 5), (6, 2), (6, 101))}
    for block in (2, 7, 64, 1000):
        monkeypatch.setattr(keyed_rng, "CPU_BLOCK", block)
        for shape, values in expected.items():
            for got, want in zip(draw(shape), values):
                assert torch.equal(got, want)


# ---- dtypes and devices --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_dtypes(dtype: torch.dtype) -> None:
    noise = KeyedNoise(0, ids(64), step=0)
    z, u = noise.randn((64, 256), dtype=dtype), noise.rand((64, 256), dtype=dtype)
    assert z.dtype == u.dtype == dtype and z.shape == u.shape == (64, 256)
    assert torch.isfinite(z).all() and abs(float(z.float().mean())) < 0.05 and abs(float(z.float().std()) - 1) < 0.05
    assert float(u.min()) >= 0 and float(u.max()) < 1
    reference = KeyedNoise(0, ids(64), step=0).randn((64, 256), dtype=torch.float64)
    torch.testing.assert_close(z.double(), reference, atol=2e-6 if dtype == torch.float32 else 0.05, rtol=0.01)


def test_uniforms_stay_below_one_after_rounding() -> None:
    top = torch.tensor([2**32 - 1, 2**32 - 2**8], dtype=torch.float64) * 2.0**-32
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        assert float(keyed_rng._below_one(top, dtype).max()) < 1.0


def test_draws_land_on_the_requested_device_and_default_to_the_ids_device() -> None:
    noise = KeyedNoise(0, ids(4), step=0)
    assert noise.randn((4, 2)).device.type == "cpu" and noise.randint(3, (4,), device="cpu").device.type == "cpu"
    assert noise.randn_like(torch.zeros(4, 3, dtype=torch.float64)).dtype == torch.float64


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_draws_equal_cpu_draws() -> None:
    cpu, cuda = KeyedNoise(0, ids(32), step=4), KeyedNoise(0, ids(32).cuda(), step=4)
    assert torch.equal(cpu.randint(1000, (32, 77)), cuda.randint(1000, (32, 77)).cpu())
    torch.testing.assert_close(cpu.randn((32, 3, 8, 8)), cuda.randn((32, 3, 8, 8)).cpu(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cpu.rand((64,)), cuda.rand((64,)).cpu())


# ---- the fallback ----------------------------------------------------------------------------------------------
def test_torch_noise_is_torchs_generator() -> None:
    torch.manual_seed(5)
    expected = [torch.randn(3, 2), torch.rand(4, dtype=torch.float64), torch.randint(9, (5,))]
    torch.manual_seed(5)
    got = [GLOBAL_NOISE.randn((3, 2)), GLOBAL_NOISE.rand(4, dtype=torch.float64), GLOBAL_NOISE.randint(9, (5,))]
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert GLOBAL_NOISE.rows(7) is GLOBAL_NOISE and GLOBAL_NOISE.shared is GLOBAL_NOISE
    generator = torch.Generator().manual_seed(1)
    wrapped = as_noise_source(generator)
    assert isinstance(wrapped, TorchNoise) and wrapped.generator is generator
    assert as_noise_source(None) is GLOBAL_NOISE
    keyed = KeyedNoise(0, ids(2), step=0)
    assert as_noise_source(keyed) is keyed


def test_bad_sample_ids_are_refused() -> None:
    for bad in (torch.zeros(2, 2, dtype=torch.int64), torch.zeros(0, dtype=torch.int64), torch.zeros(3)):
        with pytest.raises(ValueError, match="sample_ids"):
            KeyedNoise(0, bad, step=0)
    with pytest.raises(ValueError, match="batch dimension"):
        KeyedNoise(0, ids(2), step=0).randn(())
