"""The InceptionV3 network of FID (Heusel et al. 2017), in plain torch (no torchvision), loading local weights.

FID is defined with the 2015-12-05 TensorFlow Inception graph, which differs from torchvision's ImageNet
InceptionV3: 1008 classes, average pools that exclude padding (``count_include_pad=False``) in the A, C and E
blocks, and a *max* pool in the last E block's pool branch. This module builds exactly that network, with the
module names of torchvision's ``Inception3``, so the state dict that pytorch-fid distributes,
``pt_inception-2015-12-05-6726825d.pth`` (a port of the TF graph), loads with its own key names:

* ``Conv2d_1a_3x3``, ``Conv2d_2a_3x3``, ``Conv2d_2b_3x3``, ``Conv2d_3b_1x1``, ``Conv2d_4a_3x3`` (stem),
  ``Mixed_5b``/``5c``/``5d`` (A), ``Mixed_6a`` (B), ``Mixed_6b``-``6e`` (C), ``Mixed_7a`` (D), ``Mixed_7b``/``7c`` (E);
* inside them, branches named as torchvision names them (``branch1x1``, ``branch5x5_1``, ``branch3x3dbl_3a``,
  ``branch7x7x3_4``, ``branch_pool``, ...), each a ``BasicConv2d`` with ``conv.weight`` (no bias) and
  ``bn.{weight,bias,running_mean,running_var}`` (BatchNorm eps 1e-3; ``bn.num_batches_tracked`` optional);
* ``fc.weight (1008, 2048)`` and ``fc.bias (1008,)`` - optional: FID reads the 2048-d pool3 features before it.

For example ``Mixed_7c.branch3x3dbl_3b.bn.running_var`` or ``Conv2d_1a_3x3.conv.weight`` (shape
``(32, 3, 3, 3)``). ``load_inception(path)`` loads such a file strictly otherwise and names the first
mismatching keys. Input: RGB in ``[0, 1]``, bilinearly resized to 299x299 (``align_corners=False``) and scaled to
``[-1, 1]``, as pytorch-fid does.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from fastgen.utils.errors import CheckpointError
from fastgen.utils.safe_pickle import torch_load

WEIGHTS_ENV = "FASTGEN_INCEPTION_WEIGHTS"
WEIGHTS_FILE_NAME = "pt_inception-2015-12-05-6726825d.pth"
FEATURE_DIM = 2048


class BasicConv2d(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, **kwargs) -> None:  # noqa: ANN003 - Conv2d options
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, bias=False, **kwargs)
        self.bn = nn.BatchNorm2d(out_channels, eps=0.001)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.bn(self.conv(x)), inplace=True)


def _avg_pool(x: torch.Tensor) -> torch.Tensor:
    # TF's average pool ignores the zero padding (pytorch-fid's FIDInception patch).
    return F.avg_pool2d(x, kernel_size=3, stride=1, padding=1, count_include_pad=False)


class InceptionA(nn.Module):
    def __init__(self, in_channels: int, pool_features: int) -> None:
        super().__init__()
        self.branch1x1 = BasicConv2d(in_channels, 64, kernel_size=1)
        self.branch5x5_1 = BasicConv2d(in_channels, 48, kernel_size=1)
        self.branch5x5_2 = BasicConv2d(48, 64, kernel_size=5, padding=2)
        self.branch3x3dbl_1 = BasicConv2d(in_channels, 64, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, kernel_size=3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, kernel_size=3, padding=1)
        self.branch_pool = BasicConv2d(in_channels, pool_features, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b5 = self.branch5x5_2(self.branch5x5_1(x))
        b3 = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        return torch.cat([self.branch1x1(x), b5, b3, self.branch_pool(_avg_pool(x))], 1)


class InceptionB(nn.Module):
    def __init__(self, in_channels: int) -> None:
        super().__init__()
        self.branch3x3 = BasicConv2d(in_channels, 384, kernel_size=3, stride=2)
        self.branch3x3dbl_1 = BasicConv2d(in_channels, 64, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(64, 96, kernel_size=3, padding=1)
        self.branch3x3dbl_3 = BasicConv2d(96, 96, kernel_size=3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b3 = self.branch3x3dbl_3(self.branch3x3dbl_2(self.branch3x3dbl_1(x)))
        return torch.cat([self.branch3x3(x), b3, F.max_pool2d(x, kernel_size=3, stride=2)], 1)


class InceptionC(nn.Module):
    def __init__(self, in_channels: int, channels_7x7: int) -> None:
        super().__init__()
        c7 = channels_7x7
        self.branch1x1 = BasicConv2d(in_channels, 192, kernel_size=1)
        self.branch7x7_1 = BasicConv2d(in_channels, c7, kernel_size=1)
        self.branch7x7_2 = BasicConv2d(c7, c7, kernel_size=(1, 7), padding=(0, 3))
        self.branch7x7_3 = BasicConv2d(c7, 192, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7dbl_1 = BasicConv2d(in_channels, c7, kernel_size=1)
        self.branch7x7dbl_2 = BasicConv2d(c7, c7, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7dbl_3 = BasicConv2d(c7, c7, kernel_size=(1, 7), padding=(0, 3))
        self.branch7x7dbl_4 = BasicConv2d(c7, c7, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7dbl_5 = BasicConv2d(c7, 192, kernel_size=(1, 7), padding=(0, 3))
        self.branch_pool = BasicConv2d(in_channels, 192, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b7 = self.branch7x7_3(self.branch7x7_2(self.branch7x7_1(x)))
        d = self.branch7x7dbl_1(x)
        for layer in (self.branch7x7dbl_2, self.branch7x7dbl_3, self.branch7x7dbl_4, self.branch7x7dbl_5):
            d = layer(d)
        return torch.cat([self.branch1x1(x), b7, d, self.branch_pool(_avg_pool(x))], 1)


class InceptionD(nn.Module):
    def __init__(self, in_channels: int) -> None:
        super().__init__()
        self.branch3x3_1 = BasicConv2d(in_channels, 192, kernel_size=1)
        self.branch3x3_2 = BasicConv2d(192, 320, kernel_size=3, stride=2)
        self.branch7x7x3_1 = BasicConv2d(in_channels, 192, kernel_size=1)
        self.branch7x7x3_2 = BasicConv2d(192, 192, kernel_size=(1, 7), padding=(0, 3))
        self.branch7x7x3_3 = BasicConv2d(192, 192, kernel_size=(7, 1), padding=(3, 0))
        self.branch7x7x3_4 = BasicConv2d(192, 192, kernel_size=3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b3 = self.branch3x3_2(self.branch3x3_1(x))
        b7 = self.branch7x7x3_4(self.branch7x7x3_3(self.branch7x7x3_2(self.branch7x7x3_1(x))))
        return torch.cat([b3, b7, F.max_pool2d(x, kernel_size=3, stride=2)], 1)


class InceptionE(nn.Module):
    """``max_pool``: the pool branch of the *last* E block (``Mixed_7c``) max-pools in the FID graph."""

    def __init__(self, in_channels: int, max_pool: bool = False) -> None:
        super().__init__()
        self.max_pool = max_pool
        self.branch1x1 = BasicConv2d(in_channels, 320, kernel_size=1)
        self.branch3x3_1 = BasicConv2d(in_channels, 384, kernel_size=1)
        self.branch3x3_2a = BasicConv2d(384, 384, kernel_size=(1, 3), padding=(0, 1))
        self.branch3x3_2b = BasicConv2d(384, 384, kernel_size=(3, 1), padding=(1, 0))
        self.branch3x3dbl_1 = BasicConv2d(in_channels, 448, kernel_size=1)
        self.branch3x3dbl_2 = BasicConv2d(448, 384, kernel_size=3, padding=1)
        self.branch3x3dbl_3a = BasicConv2d(384, 384, kernel_size=(1, 3), padding=(0, 1))
        self.branch3x3dbl_3b = BasicConv2d(384, 384, kernel_size=(3, 1), padding=(1, 0))
        self.branch_pool = BasicConv2d(in_channels, 192, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b3 = self.branch3x3_1(x)
        b3 = torch.cat([self.branch3x3_2a(b3), self.branch3x3_2b(b3)], 1)
        d = self.branch3x3dbl_2(self.branch3x3dbl_1(x))
        d = torch.cat([self.branch3x3dbl_3a(d), self.branch3x3dbl_3b(d)], 1)
        pooled = F.max_pool2d(x, kernel_size=3, stride=1, padding=1) if self.max_pool else _avg_pool(x)
        return torch.cat([self.branch1x1(x), b3, d, self.branch_pool(pooled)], 1)


class FIDInceptionV3(nn.Module):
    """InceptionV3 as in the FID graph; ``forward`` returns the ``(N, 2048)`` pool3 features."""

    def __init__(self, num_classes: int = 1008) -> None:
        super().__init__()
        self.Conv2d_1a_3x3 = BasicConv2d(3, 32, kernel_size=3, stride=2)
        self.Conv2d_2a_3x3 = BasicConv2d(32, 32, kernel_size=3)
        self.Conv2d_2b_3x3 = BasicConv2d(32, 64, kernel_size=3, padding=1)
        self.Conv2d_3b_1x1 = BasicConv2d(64, 80, kernel_size=1)
        self.Conv2d_4a_3x3 = BasicConv2d(80, 192, kernel_size=3)
        self.Mixed_5b = InceptionA(192, pool_features=32)
        self.Mixed_5c = InceptionA(256, pool_features=64)
        self.Mixed_5d = InceptionA(288, pool_features=64)
        self.Mixed_6a = InceptionB(288)
        self.Mixed_6b = InceptionC(768, channels_7x7=128)
        self.Mixed_6c = InceptionC(768, channels_7x7=160)
        self.Mixed_6d = InceptionC(768, channels_7x7=160)
        self.Mixed_6e = InceptionC(768, channels_7x7=192)
        self.Mixed_7a = InceptionD(768)
        self.Mixed_7b = InceptionE(1280)
        self.Mixed_7c = InceptionE(2048, max_pool=True)
        self.fc = nn.Linear(FEATURE_DIM, num_classes)  # unused by FID; present so the weights file loads as is

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """``(N, 3, H, W)`` RGB in ``[0, 1]`` -> ``(N, 2048)`` pool3 features."""
        x = F.interpolate(images, size=(299, 299), mode="bilinear", align_corners=False)
        x = 2 * x - 1
        x = self.Conv2d_2b_3x3(self.Conv2d_2a_3x3(self.Conv2d_1a_3x3(x)))
        x = F.max_pool2d(x, kernel_size=3, stride=2)
        x = self.Conv2d_4a_3x3(self.Conv2d_3b_1x1(x))
        x = F.max_pool2d(x, kernel_size=3, stride=2)
        for block in (self.Mixed_5b, self.Mixed_5c, self.Mixed_5d, self.Mixed_6a, self.Mixed_6b, self.Mixed_6c,
                      self.Mixed_6d, self.Mixed_6e, self.Mixed_7a, self.Mixed_7b, self.Mixed_7c):
            x = block(x)
        return F.adaptive_avg_pool2d(x, 1).flatten(1)


def resolve_weights_path(path: str | os.PathLike[str] | None = None) -> Path:
    """``path``, else ``$FASTGEN_INCEPTION_WEIGHTS``; a ``UsageError`` (exit 2) when neither names a file."""
    from fastgen.utils.errors import UsageError

    text = os.fspath(path) if path is not None else os.environ.get(WEIGHTS_ENV, "")
    if not text:
        raise UsageError(
            f"FID needs the InceptionV3 weights ({WEIGHTS_FILE_NAME}, as distributed by pytorch-fid); nothing is "
            f"downloaded: pass --inception-weights PATH or set {WEIGHTS_ENV}"
        )
    resolved = Path(text).expanduser()
    if not resolved.is_file():
        raise UsageError(f"Inception weights not found: {resolved}")
    return resolved


def load_inception(path: str | os.PathLike[str] | None = None, device: torch.device | str = "cpu") -> FIDInceptionV3:
    """Build the FID InceptionV3 and load ``path`` (or ``$FASTGEN_INCEPTION_WEIGHTS``) with the safe unpickler.

    Strict except for two keys families real files may lack: ``fc.*`` and ``*.bn.num_batches_tracked``."""
    from fastgen.utils.errors import UsageError

    file = resolve_weights_path(path)
    try:
        state = torch_load(file, what=f"Inception weights {file}")
    except CheckpointError as exc:  # corrupt file, not a torch file, a pickled module...
        raise UsageError(str(exc)) from None
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise UsageError(f"{file} does not hold a state dict")
    model = FIDInceptionV3()
    try:
        result = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # shape mismatches are raised even when strict=False
        lines = [line.strip() for line in str(exc).splitlines() if "size mismatch" in line]
        raise UsageError(f"{file} is not an FID InceptionV3 state dict ({(lines or [str(exc)])[0][:200]})") from None
    missing = [k for k in result.missing_keys if not (k.startswith("fc.") or k.endswith("num_batches_tracked"))]
    if missing or result.unexpected_keys:
        detail = []
        if missing:
            detail.append(f"missing {len(missing)} keys, e.g. {', '.join(missing[:3])}")
        if result.unexpected_keys:
            detail.append(f"unexpected {len(result.unexpected_keys)} keys, e.g. {', '.join(result.unexpected_keys[:3])}")
        raise UsageError(f"{file} is not an FID InceptionV3 state dict ({'; '.join(detail)})")
    return model.eval().requires_grad_(False).to(device)


__all__ = ["FIDInceptionV3", "load_inception", "resolve_weights_path"]
