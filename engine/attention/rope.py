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


def position_angles(head_dim: int, theta: float, scaling: RopeScaling, max_positions: int) -> torch.Tensor:
    """[positions, head_dim / 2] rotation angles. LongRoPE divides each frequency by its short factor at
    positions inside the pretraining length (original_max_position_embeddings) and by its long factor
    past it. transformers instead recomputes a sequence that outgrows that length with the long factors
    at every position; here a rotation depends on the position alone, so a block's KV is the same in
    every sequence holding it (prefix caching, recompute after preemption): identical to transformers
    up to that length, an approximation past it."""
    positions = torch.arange(max_positions, dtype=torch.float64)
    if scaling.rope_type != "longrope":
        return torch.outer(positions, inverse_frequencies(head_dim, theta, scaling))
    base = inverse_frequencies(head_dim, theta, RopeScaling())
    short = torch.outer(positions, base / torch.tensor(scaling.short_factor, dtype=torch.float64))
    long = torch.outer(positions, base / torch.tensor(scaling.long_factor or scaling.short_factor, dtype=torch.float64))
    return torch.where((positions < scaling.original_max_position_embeddings)[:, None], short, long)


class RotaryEmbedding(torch.nn.Module):
    """Hugging Face's rotate-half convention; cos/sin tables are looked up by absolute position."""

    def __init__(self, config: ModelConfig, max_positions: int) -> None:
        super().__init__()
        scaling = config.rope_scaling
        rotated = config.rotary_dims // 2
        angles = position_angles(config.rotary_dims, config.rope_theta, scaling, max_positions)
        # a partial rotary embedding's passed dims, ordered after the rotated ones in each half
        # (checkpoint.rotary_order), get angle 0: cos 1, sin 0
        angles = torch.nn.functional.pad(angles, (0, config.head_dim // 2 - rotated))
        angles = torch.cat([angles, angles], dim=-1)
        # LongRoPE's attention factor scales the rotated dims' cos and sin (q and k), as transformers does
        factor = torch.ones(config.head_dim // 2, dtype=torch.float64)
        factor[:rotated] = scaling.attention_factor
        factor = torch.cat([factor, factor])
        self.register_buffer("cos", (angles.cos() * factor).float(), persistent=False)
        # rotate-half as roll: roll(x, half) = [x2, x1], so x * cos + [-x2, x1] * sin needs sin with its
        # first half negated (see rotate)
        half = angles.shape[1] // 2
        signed = angles.sin() * factor
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
