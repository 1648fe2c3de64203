"""What a client asks of generation; validated on construction."""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import InvalidRequestError

# torch.Generator.manual_seed takes a signed or unsigned 64-bit integer; outside it, generation fails
SEED_RANGE = (-2**63, 2**64 - 1)
MAX_LOGPROBS = 20          # OpenAI's bound on top_logprobs; vLLM's default max_logprobs is 20 too
PENALTY_RANGE = (-2.0, 2.0)
LOGIT_BIAS_RANGE = (-100.0, 100.0)


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
    min_p: float = 0.0                 # drop tokens below min_p x the top token's probability
    presence_penalty: float = 0.0      # subtracted once from the logit of every token already generated
    frequency_penalty: float = 0.0     # subtracted per occurrence in the generated tokens
    repetition_penalty: float = 1.0    # > 1 shrinks the logits of tokens in the prompt or output (vLLM, HF)
    logit_bias: tuple[tuple[int, float], ...] = ()   # (token id, added to its logit)
    logprobs: int | None = None        # per generated token: its logprob and this many top ones (0: its own)
    prompt_logprobs: int | None = None  # per prompt token after the first: its logprob and this many top ones

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        bias = self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias
        object.__setattr__(self, "logit_bias", tuple((int(t), float(b)) for t, b in bias))
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
            (0 <= self.min_p <= 1, "min_p", "min_p must be in [0, 1]"),
            (PENALTY_RANGE[0] <= self.presence_penalty <= PENALTY_RANGE[1], "presence_penalty",
             "presence_penalty must be in [-2, 2]"),
            (PENALTY_RANGE[0] <= self.frequency_penalty <= PENALTY_RANGE[1], "frequency_penalty",
             "frequency_penalty must be in [-2, 2]"),
            (self.repetition_penalty > 0, "repetition_penalty", "repetition_penalty must be > 0"),
            (all(LOGIT_BIAS_RANGE[0] <= b <= LOGIT_BIAS_RANGE[1] for _, b in self.logit_bias), "logit_bias",
             "logit_bias values must be in [-100, 100]"),
            (all(t >= 0 for t, _ in self.logit_bias), "logit_bias", "logit_bias keys must be token ids >= 0"),
            (self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS, "logprobs",
             f"logprobs must be between 0 and {MAX_LOGPROBS}"),
            (self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= MAX_LOGPROBS, "prompt_logprobs",
             f"prompt_logprobs must be between 0 and {MAX_LOGPROBS}"),
        ]
        for ok, param, message in checks:
            if not ok:
                raise InvalidRequestError(f"{message} (got {getattr(self, param)!r})", param)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def shapes_logits(self) -> bool:
        """Whether the row's logits change before sampling: logit bias or a penalty."""
        return bool(self.logit_bias) or self.presence_penalty != 0 or self.frequency_penalty != 0 \
            or self.repetition_penalty != 1


GREEDY = SamplingParams(temperature=0.0)
