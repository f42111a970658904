"""DDP's stride warning for a 1x1 convolution's weight is filtered (size-1 dimensions' strides address no memory);
any other stride mismatch still warns."""

from __future__ import annotations

import warnings

from fastgen.distributed.parallelize import _quiet_size_one_stride_warning

TEXT = ("Grad strides do not match bucket view strides. This may indicate grad was not created according to the "
        "gradient layout contract, or that the param's strides changed since DDP was constructed.  This is not an "
        "error, but may impair performance.\ngrad.sizes() = {sizes}, strides() = [64, 1, 64, 64]\n"
        "bucket_view.sizes() = {sizes}, strides() = [64, 1, 1, 1]")


def test_only_the_size_one_stride_warning_is_filtered() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _quiet_size_one_stride_warning()
        warnings.warn(TEXT.format(sizes="[64, 64, 1, 1]"), UserWarning, stacklevel=1)
        warnings.warn(TEXT.format(sizes="[64, 64, 3, 3]"), UserWarning, stacklevel=1)
        warnings.warn("another warning", UserWarning, stacklevel=1)
    assert [str(w.message).splitlines()[-2] for w in caught[:1]] == ["grad.sizes() = [64, 64, 3, 3], strides() = [64, 1, 64, 64]"]
    assert len(caught) == 2
