"""The KV pool on a GPU: what `gpu_memory_utilization` of its memory leaves after the weights, the
activation peak of the largest step (measured by running one) and memory that is not torch's.

As vLLM sizes it: the pool takes the rest of the share, so a larger share or a smaller model serves more
sequences at once; nothing is guessed from the model's shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.errors import ModelLoadError

GiB = 2**30


@dataclass(frozen=True)
class GpuMemoryPlan:
    total_bytes: int        # the device's memory
    budget_bytes: int       # total x gpu_memory_utilization
    weights_bytes: int      # what the model holds (allocated before the profiling step, less its KV)
    activation_bytes: int   # the profiling step's peak above that
    other_bytes: int        # in use but not by this process's torch: the CUDA context, other processes
    block_bytes: int        # one KV block, every layer's K and V
    num_blocks: int

    def describe(self) -> str:
        return (f"{self.num_blocks} KV blocks ({self.num_blocks * self.block_bytes / GiB:.1f} GiB) = "
                f"{self.budget_bytes / GiB:.1f} GiB ({self.budget_bytes / self.total_bytes:.2f} of "
                f"{self.total_bytes / GiB:.1f}) - weights {self.weights_bytes / GiB:.1f} - activations "
                f"{self.activation_bytes / GiB:.2f} - other {self.other_bytes / GiB:.2f} GiB")


def plan_kv_pool(runner, utilization: float, profile_tokens: int, num_sampled: int,
                 min_blocks: int) -> GpuMemoryPlan:
    """Run the largest step once on `runner` (built with a pool just big enough for it), measure, and size
    the pool; an error where it cannot hold `min_blocks` (one request of max_model_len)."""
    device = runner.device
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    other = (total - free) - torch.cuda.memory_reserved(device)
    profiling_kv = runner.kv_cache.numel() * runner.kv_cache.element_size()
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    runner.profile_step(profile_tokens, num_sampled)
    torch.cuda.synchronize(device)
    activation = torch.cuda.max_memory_allocated(device) - before
    block_bytes = profiling_kv // (runner.kv_cache.shape[2] // runner.block_size)
    weights = before - profiling_kv
    budget = int(total * utilization)
    num_blocks = (budget - weights - activation - other) // block_bytes
    plan = GpuMemoryPlan(total, budget, weights, activation, other, block_bytes, max(0, num_blocks))
    if num_blocks < min_blocks:
        raise ModelLoadError(f"GPU memory: {plan.describe()}, fewer than the {min_blocks} blocks one request of "
                             "max_model_len needs; raise gpu_memory_utilization or lower max_model_len")
    return plan
