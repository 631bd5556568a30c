"""Outputs that must not depend on the machine: exact quantities are solved exactly."""

from __future__ import annotations

from fractions import Fraction

import pytest

from gradaccum_lib.measure.planning import fit_transformer_activations


@pytest.mark.parametrize("lengths", [(32, 64, 128), (16, 48, 512), (7, 11, 13)])
def test_activation_fit_recovers_whole_byte_coefficients_exactly(lengths):
    # 192 bytes per s**2 once printed 1.13 GiB on one CPU and 1.12 GiB on another, because a
    # float 3x3 solve returned 192.00000000000003 on MKL's AVX-512 path: the fit is exact now
    def measure(num_layers, length):
        outside = 4096 + 3072 * length
        per_layer = 12288 + 26624 * length + 192 * length * length
        return outside + num_layers * per_layer

    fitted = fit_transformer_activations(measure, lengths)
    assert (fitted.outside_fixed, fitted.outside_per_token) == (4096.0, 3072.0)
    assert (fitted.per_layer_fixed, fitted.per_layer_per_token,
            fitted.per_layer_per_token_squared) == (12288.0, 26624.0, 192.0)
    assert fitted.bytes_per_sample(512, 24) == measure(24, 512) - 4096 - 24 * 12288


def test_activation_fit_of_non_polynomial_bytes_is_the_exact_rational_solution():
    measured = {1: {32: 1001, 64: 2003, 128: 4010}, 2: {32: 1500, 64: 3100, 128: 6700}}
    fitted = fit_transformer_activations(lambda layers, s: measured[layers][s])
    layer = [Fraction(measured[2][s] - measured[1][s]) for s in (32, 64, 128)]
    for s, extra in zip((32, 64, 128), layer, strict=True):
        value = (Fraction(fitted.per_layer_fixed) + Fraction(fitted.per_layer_per_token) * s
                 + Fraction(fitted.per_layer_per_token_squared) * s * s)
        assert abs(value - extra) < Fraction(1, 10**9)
