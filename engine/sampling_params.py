"""What a client asks of generation; validated on construction."""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import InvalidRequestError

# torch.Generator.manual_seed takes a signed or unsigned 64-bit integer; outside it, generation fails
SEED_RANGE = (-2**63, 2**64 - 1)


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0      # 0 means greedy
    top_k: int = 0                # 0 or -1: no top-k cut
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    min_tokens: int = 0
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        checks = [
            (isinstance(self.max_tokens, int) and self.max_tokens >= 1, "max_tokens", "max_tokens must be at least 1"),
            (self.temperature >= 0, "temperature", "temperature must be >= 0"),
            (isinstance(self.top_k, int) and self.top_k >= -1, "top_k", "top_k must be -1, 0 or a positive integer"),
            (0 < self.top_p <= 1, "top_p", "top_p must be in (0, 1]"),
            (isinstance(self.min_tokens, int) and 0 <= self.min_tokens <= self.max_tokens, "min_tokens",
             "min_tokens must be between 0 and max_tokens"),
            (all(isinstance(s, str) and s for s in self.stop), "stop", "stop strings must be non-empty strings"),
            (self.seed is None or SEED_RANGE[0] <= self.seed <= SEED_RANGE[1], "seed",
             f"seed must be an integer in [{SEED_RANGE[0]}, {SEED_RANGE[1]}]"),
        ]
        for ok, param, message in checks:
            if not ok:
                raise InvalidRequestError(f"{message} (got {getattr(self, param)!r})", param)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


GREEDY = SamplingParams(temperature=0.0)
