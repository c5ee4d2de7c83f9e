"""A correct CPU stand-in for vLLM's `expand_kernel`, the step of rejection
sampling that spreads each request's temperature, top-k and top-p over its
drafted positions. vLLM's CPU fallback for it (`cpu_triton_utils`, registered
by the CPU platform when Triton is absent) converts both tensors to int64 and
never copies the result back, so drafted tokens are verified against an
uninitialised temperature: a greedy request beside a sampled one gets drafts
rejected and `<|endoftext|>` sampled (a structured output's grammar then
refuses it and the request fails), and sampled requests are verified at a
temperature that is not theirs. Registered through vLLM's kernel-override
registry right after the platform's own overrides, in every vLLM process of
the environment (stock `vllm serve` included: the entry point is the
package's)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

EXPAND_KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"
_INSTALLED_MARK = "_toolserve_expand_fix"


def expand_per_request(
    output: torch.Tensor,
    input_val: torch.Tensor,
    cu_num_tokens: torch.Tensor,
    replace_from: float,
    replace_to: float,
    MAX_NUM_TOKENS: int | None = None,  # the kernel's launch argument: unused here
) -> None:
    """`output[j]` = the value of the request whose positions hold `j`
    (`cu_num_tokens` are the requests' cumulative position counts), with
    `replace_from` written as `replace_to`; in `output`'s own dtype."""
    import torch

    values = torch.where(
        input_val == replace_from, torch.full_like(input_val, replace_to), input_val
    )
    ends = cu_num_tokens.to(torch.int64)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    expanded = torch.repeat_interleave(values, counts)
    output[: expanded.shape[0]].copy_(expanded)


def install() -> None:
    """Have the CPU platform register `expand_per_request` after its own kernel
    overrides (vLLM loads plugins before it registers them). Idempotent; does
    nothing where Triton runs the real kernel."""
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON

    if HAS_TRITON or not current_platform.is_cpu():
        return
    platform = type(current_platform)
    platform_overrides = platform.register_triton_kernel_overrides
    if getattr(platform_overrides, _INSTALLED_MARK, False):
        return

    def register_overrides(cls: Any) -> None:
        from vllm.triton_utils.dispatcher import register_kernels

        platform_overrides()
        register_kernels({EXPAND_KERNEL: expand_per_request})

    setattr(register_overrides, _INSTALLED_MARK, True)
    platform.register_triton_kernel_overrides = classmethod(register_overrides)
