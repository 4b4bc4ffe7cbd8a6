"""The core's precisions pass the precision kit against their plain-PyTorch equivalents."""

from __future__ import annotations

from phalanx.testing import PrecisionConformance


class TestTrue32Conformance(PrecisionConformance):
    precision = "32-true"


class TestBf16MixedConformance(PrecisionConformance):
    precision = "bf16-mixed"
    autocast_dtype = "bfloat16"


class TestFp16MixedConformance(PrecisionConformance):
    precision = "16-mixed"
    autocast_dtype = "float16"
    scales_loss = True


class TestBf16TrueConformance(PrecisionConformance):
    precision = "bf16-true"
    param_dtype = "bfloat16"


class Test64TrueConformance(PrecisionConformance):
    precision = "64-true"
    param_dtype = "float64"
