"""The pass registry. ``DEFAULT_ORDER`` is the one place that says which passes run, and in which order.

Why this order: constant folding and cleanup first, so later passes see static shapes and plain constants (folding
before cleanup: a Pad / Slice / Reshape whose pads or shape are computed from static shapes is only recognised as
a no-op once they are constants, e.g. the all-zero Pad asteroid's ConvTasNet export ends with);
fold-pad-conv right after them (the Pads whose pads fold-constants just made constant); squeeze-reshape then
(shapes are static by now);
resize-scales after resize-nearest (which gives the nearest Resizes it rewrites their canonical scales form);
BatchNorm folding before channel alignment, so alignment only pads Conv weights; alignment before dilated-conv,
so the space-to-batch rewrite works on channel counts that are already aligned and keeps them; lower-ops last,
so that it lowers the forbidden ops of the graph the compiler will see (the passes before it emit none: each
respects ``forbidden_ops``).
"""

from __future__ import annotations

from onnx_npu_fix.passes.align_channels import AlignChannelsPass
from onnx_npu_fix.passes.base import Pass
from onnx_npu_fix.passes.cleanup import CleanupPass
from onnx_npu_fix.passes.dilated_conv import DilatedConvPass
from onnx_npu_fix.passes.fold_batchnorm import FoldBatchNormPass
from onnx_npu_fix.passes.fold_constants import FoldConstantsPass
from onnx_npu_fix.passes.fold_pad_conv import FoldPadConvPass
from onnx_npu_fix.passes.lower_ops import LowerOpsPass
from onnx_npu_fix.passes.reorder_memory import ReorderMemoryPass
from onnx_npu_fix.passes.resize_nearest import ResizeNearestPass
from onnx_npu_fix.passes.resize_scales import ResizeScalesPass
from onnx_npu_fix.passes.squeeze_reshape import SqueezeReshapePass

DEFAULT_ORDER: tuple[type[Pass], ...] = (
    FoldConstantsPass,
    CleanupPass,
    FoldPadConvPass,
    SqueezeReshapePass,
    FoldBatchNormPass,
    ResizeNearestPass,
    ResizeScalesPass,
    AlignChannelsPass,
    DilatedConvPass,
    LowerOpsPass,
)

# Every pass by name: the default ones, plus opt-in passes that run only when named with --passes.
# reorder-memory is opt-in: it only changes the node order (exact), which users may want to keep stable.
OPT_IN: tuple[type[Pass], ...] = (ReorderMemoryPass,)

PASSES: dict[str, type[Pass]] = {cls.name: cls for cls in (*DEFAULT_ORDER, *OPT_IN)}
