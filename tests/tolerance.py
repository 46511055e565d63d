"""The suite's float tolerances, stated from the dtype and the reduction, never pytest.approx's or torch's defaults
(docs/testing.md, "Tolerances"). A default (pytest.approx: 1e-6 relative) is no argument: it held on one CPU and failed
on another (issue 49: a logged float32 std 1.0e-6 off its float64 recomputation), and it is loose for float64 sums.

The bound. Each floating-point operation rounds its exact result to the nearest number of its dtype: a relative error
of at most u = eps / 2 (eps = `torch.finfo(dtype).eps`: 1.19e-7 for float32, 2.22e-16 for float64, 7.8e-3 for
bfloat16). A sum of n terms, in any order and any blocking, is within (n - 1) u sum_i |x_i| of the exact sum (Higham,
Accuracy and Stability of Numerical Algorithms, 2nd ed., section 4.2: the bound holds for every summation order, so
for every thread count and every matmul blocking); a dot product of length n or a mean of n terms likewise, with one
rounding more per term. Relative to the result that is about n u kappa, kappa = sum_i |x_i| / |sum_i x_i| the sum's
condition number (1 when the terms share a sign). A chain of reductions adds its lengths (a mean, then a std over the
same n values: about 3n). Two computations of one quantity that each obey the bound differ by at most twice it.

So `tolerance(dtype, terms, condition, scale)` gives rel = terms x eps x condition (eps = 2u: the two computations, or
the one against an exact value, with the inputs' own rounding folded in), and abs = terms x eps x scale, for results
that may cancel to about 0, where `scale` is the size of what cancels (sum |x_i|, or the norm of the vectors compared);
`terms` is the chain's reduction lengths summed, argued at the call site. The bound is the worst case: rounding errors
of one sign are rare, and typical ones grow like sqrt(terms). It is still far below what the tests look for (a wrong
slice, a missed factor, a sign: 1e-2 to 1).
"""

from __future__ import annotations

import pytest
import torch

FLOAT32 = torch.float32
FLOAT64 = torch.float64


def tolerance(
    dtype: torch.dtype = FLOAT32, *, terms: int = 1, condition: float = 1.0, scale: float = 0.0
) -> dict[str, float]:
    """`{"rel": ..., "abs": ...}` for `pytest.approx(expected, **tolerance(...))`: the worst-case rounding of `terms`
    rounded operations on the longest chain in `dtype`, times the reduction's `condition` number; `scale`, the size of
    the terms, for results that may cancel to 0 (module docstring)."""
    if terms < 1 or condition < 1 or scale < 0:
        raise ValueError(f"terms >= 1, condition >= 1, scale >= 0; got {terms}, {condition}, {scale}")
    eps = torch.finfo(dtype).eps
    return {"rel": terms * eps * condition, "abs": terms * eps * scale}


def approx(expected, dtype: torch.dtype = FLOAT32, *, terms: int = 1, condition: float = 1.0, scale: float = 0.0):
    """`pytest.approx(expected)` within `tolerance(dtype, terms=..., condition=..., scale=...)`."""
    return pytest.approx(expected, **tolerance(dtype, terms=terms, condition=condition, scale=scale))


def assert_close(actual, expected, dtype: torch.dtype = FLOAT32, *, terms: int = 1, condition: float = 1.0, scale=0.0):
    """`torch.testing.assert_close` within `tolerance(...)` (elementwise |a - e| <= abs + rel |e|; dtypes may differ)."""
    bound = tolerance(dtype, terms=terms, condition=condition, scale=scale)
    torch.testing.assert_close(
        torch.as_tensor(actual), torch.as_tensor(expected), rtol=bound["rel"], atol=bound["abs"], check_dtype=False
    )


def assert_norm_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype = FLOAT32, *, terms: int = 1):
    """||actual - expected|| <= terms x eps x ||expected||: the normwise form, for a gradient or a weight vector whose
    entries cancel to about 0 one by one (an entry's own condition number is unbounded), while the vector's is 1."""
    bound = tolerance(dtype, terms=terms)["rel"] * float(expected.double().norm())
    gap = float((actual.double() - expected.double()).norm())
    assert gap <= bound, f"||actual - expected|| = {gap:.3g} > {bound:.3g} (terms={terms}, {dtype})"


def transformer_terms(hidden: int, intermediate: int, layers: int, sequence: int, vocab: int = 0) -> int:
    """The reduction lengths on the longest chain of a decoder forward (each layer: RMSNorm over `hidden`, the q/k/v
    projections (`hidden`), scores over a head (<= `hidden`), softmax and the weighted sum of values over `sequence`,
    the output projection (`hidden`), RMSNorm, gate/up (`hidden`), down (`intermediate`)), plus the final norm and, with
    `vocab`, the head and log-softmax: layers x (6 hidden + 2 sequence + intermediate) + hidden + 2 vocab."""
    return layers * (6 * hidden + 2 * sequence + intermediate) + hidden + 2 * vocab


# The tiny kit's policy (tiny/kit.py): a vision tower 32 wide, MLP 64, 2 blocks, over one image's patches (<= 64:
# max_pixels 12,544 = 64 x 14^2), and a decoder 64 wide, MLP 128, 2 layers, vocab 1,088, over the tests' sequences,
# under 1,024 tokens (prompts of ~150 with 16 image tokens, max_completion_length 320, crops of 16 tokens each).
TINY_SEQUENCE = 1024
TINY_POLICY_FORWARD = transformer_terms(32, 64, 2, 64) + transformer_terms(64, 128, 2, TINY_SEQUENCE, 1088)
# The tiny CLIP (tiny/clip.py): a text tower 128 wide, MLP 512, 2 layers over 32 tokens; a ResNet-like image tower
# 8 wide in 4 stages of 3 x 3 convolutions over <= 64 channels; the 64-wide projection.
TINY_CLIP_FORWARD = transformer_terms(128, 512, 2, 32) + 4 * 9 * 64 + 64


def deviation_condition(values, group: int) -> float:
    """The condition number of group-normalised advantages' numerators (each value minus its group's mean, `group`
    consecutive values a group): the largest over groups of sum |v| / sum |v - mean|. A group whose values are equal
    counts 1: its deviations are exactly 0 in any order. NaN values (unscorable rows) are left out."""
    values = torch.as_tensor(values, dtype=torch.float64).reshape(-1, group)
    worst = 1.0
    for row in values:
        row = row[~torch.isnan(row)]
        spread = float((row - row.mean()).abs().sum()) if row.numel() else 0.0
        if spread > 0:
            worst = max(worst, float(row.abs().sum()) / spread)
    return worst


# A group-normalised advantage (TRL's, `mapo.reference_advantages`): the weighted sum of a row's reward columns (<= 4),
# the group's mean and its std (sum of squares, sqrt) over <= 4 values, the division by std + eps: about 16 roundings.
ADVANTAGE_TERMS = 16

# Hand-worked float64 examples (a memory estimate, a statistic of a dozen values): at most 64 rounded operations on
# the chain, at the values' size (1) where they cancel to 0.
HAND_TERMS = 64
