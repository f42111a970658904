"""The pictures' crop (``fastgen.datasets.sources.crop_box``, ``center_crop_resize_array``): EDM's centred square for
a square target, the largest centred region of the target's shape for ``(width, height)``."""

from __future__ import annotations

import numpy as np
import PIL.Image
import pytest

from fastgen.datasets.sources import center_crop_resize_array, crop_box


@pytest.mark.parametrize(("width", "height"), [(40, 30), (30, 40), (33, 20), (17, 17), (8, 31)])
def test_a_square_target_is_edms_centred_square(width: int, height: int) -> None:
    """``crop = min(H, W)``, rows ``(H - crop) // 2 .. (H + crop) // 2`` and columns likewise (EDM's
    ``center-crop``), for any target side."""
    crop = min(width, height)
    assert crop_box(width, height, 16) == ((width - crop) // 2, (height - crop) // 2, crop, crop)


@pytest.mark.parametrize(("size", "target", "box"), [
    ((40, 30), (32, 16), (0, 5, 40, 20)),     # wider target: the full width, the middle 20 rows
    ((40, 30), (16, 32), (12, 0, 15, 30)),    # taller target: the full height, the middle 15 columns
    ((832, 480), (832, 480), (0, 0, 832, 480)),  # the same shape: everything
    ((1920, 1080), (768, 512), (150, 0, 1620, 1080)),  # 16:9 to 3:2
])
def test_a_shaped_target_keeps_the_largest_centred_region_of_its_ratio(
        size: tuple[int, int], target: tuple[int, int], box: tuple[int, int, int, int]) -> None:
    assert crop_box(*size, target) == box


def test_the_region_is_resized_to_width_by_height_with_lanczos() -> None:
    rng = np.random.default_rng(0)
    picture = rng.integers(0, 256, (30, 40, 3), dtype=np.uint8)  # H 30, W 40
    out = center_crop_resize_array(picture, (32, 16))
    want = PIL.Image.fromarray(picture[5:25]).resize((32, 16), PIL.Image.Resampling.LANCZOS)
    assert out.shape == (16, 32, 3)
    np.testing.assert_array_equal(out, np.asarray(want))
