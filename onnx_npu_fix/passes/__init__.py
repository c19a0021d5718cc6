"""The pass registry. ``DEFAULT_ORDER`` is the one place that says which passes run, and in which order.

Why this order: cleanup and constant folding first, so later passes see static shapes and plain constants;
BatchNorm folding before channel alignment, so alignment only pads Conv weights; alignment before dilated-conv,
so the space-to-batch rewrite works on channel counts that are already aligned and keeps them.
"""

from __future__ import annotations

from onnx_npu_fix.passes.base import Pass
from onnx_npu_fix.passes.cleanup import CleanupPass
from onnx_npu_fix.passes.fold_constants import FoldConstantsPass

DEFAULT_ORDER: tuple[type[Pass], ...] = (
    CleanupPass,
    FoldConstantsPass,
)

# Every pass by name: the default ones, plus opt-in passes that run only when named with --passes.
PASSES: dict[str, type[Pass]] = {cls.name: cls for cls in DEFAULT_ORDER}
