"""Rotary position embeddings with the config's theta and scaling, precomputed for every position."""

from __future__ import annotations

import math

import torch

from engine.model_config import ModelConfig, RopeScaling


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if scaling.rope_type == "linear":
        return inv_freq / scaling.factor
    if scaling.rope_type == "llama3":
        return _llama3_scaled(inv_freq, scaling)
    return inv_freq


def _llama3_scaled(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    # Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, the band between blended.
    low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
    high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
        s.high_freq_factor - s.low_freq_factor)
    blended = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(is_medium, blended, scaled)


class RotaryEmbedding(torch.nn.Module):
    """Hugging Face's rotate-half convention; cos/sin tables are looked up by absolute position."""

    def __init__(self, config: ModelConfig, max_positions: int) -> None:
        super().__init__()
        inv_freq = inverse_frequencies(config.head_dim, config.rope_theta, config.rope_scaling)
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        # rotate-half as roll: roll(x, half) = [x2, x1], so x * cos + [-x2, x1] * sin needs sin with its
        # first half negated (see rotate)
        half = inv_freq.shape[0]
        signed = angles.sin()
        signed[:, :half] = -signed[:, :half]
        self.register_buffer("sin", signed.float(), persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [tokens, heads, head_dim], k: [tokens, kv_heads, head_dim]."""
        cos, sin = self.lookup(positions)
        return rotate(q, cos, sin), rotate(k, cos, sin)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin at `positions`, [tokens, 1, head_dim]: looked up once per step, used by
        every layer."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x: [tokens, heads, head_dim] (any heads: q and k rotate in one call), cos/sin from lookup():
    x * cos + rotate_half(x) * sin, in three ops (the cat of slices took seven, paid per layer)."""
    x32 = x.float()
    return torch.addcmul(x32 * cos, x32.roll(x.shape[-1] // 2, -1), signed_sin).to(x.dtype)
