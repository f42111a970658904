"""RankConsistencyCallback: the fingerprint's formula and properties, two real gloo ranks, a real Trainer run."""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from fastgen_testing import finish_rank, gloo_results, tiny_toy_config
from torch import nn

from fastgen.callbacks.param_count import ParamCountCallback
from fastgen.callbacks.rank_consistency import RankConsistencyCallback
from fastgen.distributed.fingerprint import _DTYPE_CODES, fingerprint_tensors, tensor_fingerprint
from fastgen.trainer import Trainer
from fastgen.utils.errors import FastGenRuntimeError

M64 = (1 << 64) - 1
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool]


def fp(t: torch.Tensor, chunk_words: int = 65536) -> int:
    return int(tensor_fingerprint(t, chunk_words)) & M64


def sample(dtype: torch.dtype, shape: tuple[int, ...] = (37, 29), seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype == torch.int64:
        return torch.randint(-(2**62), 2**62, shape, generator=g)
    return torch.randn(shape, generator=g).to(dtype)


# ---- the documented formula, written out in plain Python ------------------------------------------------------
def _mix64(z: int) -> int:
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & M64
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def reference_fingerprint(t: torch.Tensor, k: int) -> int:
    """The module docstring's formula, element by element (slow; small tensors only)."""
    word = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    bits = 8 * t.element_size()
    mask = (1 << bits) - 1
    a = 0x9E3779B97F4A7C17 & mask
    words = [x & mask for x in t.contiguous().reshape(-1).view(word).tolist()]
    lanes = words[:k]
    for c in range(1, (len(words) + k - 1) // k):
        for j, x in enumerate(words[c * k:(c + 1) * k]):
            lanes[j] = ((lanes[j] * a) & mask) ^ x
    total = 0
    for j, h in enumerate(lanes):
        ext = h - (1 << bits) if word != torch.uint8 and h >= 1 << (bits - 1) else h
        if bits == 64:
            ext = h ^ (h >> 32)
        weight = _mix64(((j + 1) * 0x9E3779B97F4A7C15) & M64) | 1
        total += ext * weight
    total += t.numel() * 0xD6E8FEB86659FD93 + _DTYPE_CODES[t.dtype] * 0xA0761D6478BD642F
    return total & M64


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [7, 64, 65536])
def test_fingerprint_is_the_documented_formula(dtype: torch.dtype, k: int) -> None:
    t = sample(dtype, (9, 23))  # 207 words: several chunks and a short last chunk for k = 7 and 64
    assert fp(t, k) == reference_fingerprint(t, k)
    assert fp(t.t(), k) == reference_fingerprint(t.t(), k)  # the non-contiguous (staged) path


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [16, 65536])
def test_fingerprint_properties(dtype: torch.dtype, k: int) -> None:
    t = sample(dtype)
    assert fp(t, k) == fp(t.clone(), k)
    # one flipped bit anywhere (first, middle, last element; low and high bits) changes it
    for index in (0, t.numel() // 2, t.numel() - 1):
        for bit in (0, 8 * t.element_size() - 1):
            flipped = t.clone()
            word = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
            flat = flipped.view(-1).view(word)
            if dtype == torch.bool:
                flat[index] ^= 1  # a bool's only valid bit
            else:
                flat[index] ^= torch.tensor(1 << bit if bit < 8 * t.element_size() - 1 else -(1 << bit), dtype=word)
            assert fp(flipped, k) != fp(t, k), (index, bit)
    # permuted elements: two swapped elements, a rotation, and a row swap
    flat = t.reshape(-1)
    i, j = 3, flat.numel() - 5
    if bool(flat[i] != flat[j]):
        swapped = flat.clone()
        swapped[i], swapped[j] = flat[j], flat[i]
        assert fp(swapped, k) != fp(flat, k)
    assert fp(torch.roll(flat, 1), k) != fp(flat, k)
    assert fp(t[[1, 0, *range(2, t.shape[0])]], k) != fp(t, k)
    # non-contiguous views fingerprint like their contiguous copies
    for view in (t.t(), t[::2, 1::3], t.unsqueeze(0).expand(3, -1, -1), t.t()[5:, :-4]):
        assert not view.is_contiguous()
        assert fp(view, k) == fp(view.contiguous(), k)


def test_fingerprint_swaps_of_common_values_and_edge_cases() -> None:
    # values with many trailing zero bits (1.0, 2.0, 0.5) swapped within and across chunks
    base = torch.zeros(300)
    base[10], base[200] = 1.0, 2.0
    moved = base.clone()
    moved[10], moved[200] = 2.0, 1.0
    for k in (8, 100, 65536):
        assert fp(base, k) != fp(moved, k)
    across = torch.zeros(300)
    across[10 + 8], across[200] = 1.0, 2.0  # same lane, neighbouring chunk for k = 8
    assert fp(across, 8) != fp(base, 8)
    # dtype, size and shape-independence where documented
    assert fp(torch.zeros(4)) != fp(torch.zeros(5))
    assert fp(torch.zeros(4, dtype=torch.int32)) != fp(torch.zeros(4, dtype=torch.float32))
    assert fp(torch.ones(6).view(2, 3)) == fp(torch.ones(6))
    assert fp(torch.empty(0)) == fp(torch.empty(0, 3))
    assert fp(torch.tensor(3.0)) == fp(torch.tensor([3.0]))
    x = torch.randn(5, 4, dtype=torch.complex128)
    assert fp(x.t()) == fp(x.t().contiguous()) and fp(x) != fp(x.conj().resolve_conj())
    # sign flips: two negated doubles (64-bit words) and a negated tensor spanning an odd number of chunks
    d = torch.randn(10, dtype=torch.float64)
    negated = d.clone()
    negated[[2, 7]] *= -1
    assert fp(negated) != fp(d)
    f = torch.randn(3 * 16)
    assert fp(-f, 16) != fp(f, 16)
    many = fingerprint_tensors([torch.ones(3), torch.arange(5), torch.zeros(2, 2)])
    assert many.dtype == torch.int64 and many.tolist() == [int(tensor_fingerprint(t)) for t in
                                                           (torch.ones(3), torch.arange(5), torch.zeros(2, 2))]


def test_fingerprint_is_bounded_in_memory_for_a_large_tensor() -> None:
    # 4 chunks of the default size: the same result as the reference with the same chunking would give, and
    # the scratch does not grow with the tensor.
    from fastgen.distributed import fingerprint as rc

    big = torch.randn(4 * 65536 + 11)
    before = {key: s.wide.numel() for key, s in rc._SCRATCH.items()}
    assert fp(big) == fp(big.clone()) != fp(big.flip(0))
    after = {key: s.wide.numel() for key, s in rc._SCRATCH.items()}
    assert all(n <= 65536 for n in after.values()) and set(before) <= set(after)


# ---- two real gloo ranks ------------------------------------------------------------------------------------------
def _tiny_model() -> SimpleNamespace:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
    net[1].running_mean.copy_(torch.randn(8))
    ema = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
    return SimpleNamespace(model_dict={"net": net, "ema": ema})


def _rank_main(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=30))
    result: dict[str, object] = {}
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor

        model = _tiny_model()
        callback = RankConsistencyCallback(every_n=1, check_params=True)
        result["identical"] = callback.check(model, iteration=5)

        # A sharded DTensor parameter whose shards differ by design is skipped, not reported.
        mesh = init_device_mesh("cpu", (world,))
        sharded = distribute_tensor(torch.arange(8.0).reshape(4, 2), mesh, [Shard(0)])
        model.model_dict["net"][0].register_parameter("sharded", nn.Parameter(sharded))
        result["with_sharded"] = callback.check(model, iteration=6)

        if rank == 1:  # drift: one element of one buffer, by the smallest representable step
            mean = model.model_dict["net"][1].running_mean
            mean[3] = torch.nextafter(mean[3], torch.tensor(float("inf")))
        try:
            callback.check(model, iteration=7)
            result["drift"] = None
        except FastGenRuntimeError as exc:
            result["drift"] = str(exc)

        if rank == 1:  # a rank with a different set of tensors: a clear error, not a hang
            model.model_dict["ema"].register_buffer("extra", torch.zeros(2))
        try:
            callback.check(model, iteration=8)
            result["sets"] = None
        except FastGenRuntimeError as exc:
            result["sets"] = str(exc)
    finally:
        finish_rank(out_dir, rank, result)


def test_two_gloo_ranks_identical_pass_drift_raises(tmp_path: Path) -> None:
    results = gloo_results(_rank_main, tmp_path, timeout=90)
    n_tensors = len(RankConsistencyCallback(check_params=True).named_tensors(_tiny_model()))
    for result in results:
        assert result["identical"] == n_tensors  # and no exception: identical replicas pass
        assert result["with_sharded"] == n_tensors  # the sharded parameter is not checked
        message = result["drift"]
        assert message is not None and "net.1.running_mean" in message
        assert "1 replicated tensor(s) differ" in message
        assert "ranks [0] have" in message and "ranks [1] have" in message
        assert "iteration 7" in message and "net.1.running_var" not in message
        assert result["sets"] is not None and "different sets" in result["sets"]
        assert "ema.extra on ranks [1], not on [0]" in result["sets"]  # names what differs
    assert results[0]["drift"] == results[1]["drift"]  # every rank raises the same error


# ---- a real training run, one process -------------------------------------------------------------------------------
def test_both_callbacks_in_a_real_trainer_run() -> None:
    config = tiny_toy_config("rank_consistency", max_iter=4)
    consistency = RankConsistencyCallback(every_n=2, check_params=True)
    counts = ParamCountCallback()
    trainer = Trainer(config, extra_callbacks={"rank_consistency": consistency, "param_count": counts})
    model = trainer.run()
    scalars = trainer.pop_scalars()
    expected = sum(1 for _ in model.net.named_buffers()) + sum(1 for _ in model.net.named_parameters())
    expected += sum(1 for m in model.ema_nets.values() for _ in [*m.named_buffers(), *m.named_parameters()])
    assert consistency.last_checked == expected > 0
    assert scalars["rank_consistency/checked_tensors"] == float(expected)
    n_net = sum(p.numel() for p in model.net.parameters())
    assert scalars["params/net/total"] == scalars["params/net/trainable"] == float(n_net)
    assert scalars["params/ema/total"] == float(n_net) and scalars["params/ema/trainable"] == 0.0
    assert counts.counts["net"]["total_local"] == n_net


def test_unknown_module_name_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="not in model.model_dict"):
        RankConsistencyCallback(modules=["teacher"]).named_tensors(_tiny_model())
    with pytest.raises(ValueError, match="every_n"):
        RankConsistencyCallback(every_n=0)
    only_ema = RankConsistencyCallback(modules=["ema"]).named_tensors(_tiny_model())
    assert only_ema and all(name.startswith("ema.") for name, _ in only_ema)
