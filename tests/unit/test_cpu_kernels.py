"""The CPU stand-in for rejection sampling's per-request expansion: each
request's value over its drafted positions, in the values' own dtype."""

from __future__ import annotations

import torch

from deployments.engine.cpu_kernels import expand_per_request


def test_temperatures_spread_over_drafted_positions_with_greedy_read_as_one() -> None:
    output = torch.full((5,), float("nan"))
    expand_per_request(output, torch.tensor([0.0, 0.7]), torch.tensor([2, 5]), 0, 1)
    assert output.tolist() == torch.tensor([1.0, 1.0, 0.7, 0.7, 0.7]).tolist()


def test_a_request_without_drafts_takes_no_position() -> None:
    output = torch.full((3,), -1.0)
    expand_per_request(output, torch.tensor([0.9, 0.5, 0.3]), torch.tensor([0, 3, 3]), 0, 0)
    assert output.tolist() == torch.tensor([0.5, 0.5, 0.5]).tolist()


def test_integer_values_keep_their_dtype() -> None:
    output = torch.full((4,), 99, dtype=torch.int32)
    top_k = torch.tensor([0, 40], dtype=torch.int32)
    expand_per_request(output, top_k, torch.tensor([1, 4], dtype=torch.int32), 0, 0)
    assert output.dtype == torch.int32
    assert output.tolist() == [0, 40, 40, 40]


def test_the_kernel_launch_argument_is_accepted() -> None:
    output = torch.zeros(2)
    expand_per_request(output, torch.tensor([0.25]), torch.tensor([2]), 0, 1, MAX_NUM_TOKENS=128)
    assert output.tolist() == [0.25, 0.25]
