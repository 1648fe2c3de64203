"""The choices of one reply: n per prompt (best_of generated, the n likeliest kept), each with its own index,
text, logprobs and finish reason, and the usage they add up to."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.outputs import RequestOutput
from engine.scheduling.request import Request
from serving.logprobs_format import ReplyLogprobs
from serving.tool_calls.reply import ReplyStreamer


@dataclass
class Choice:
    index: int                         # its place in the reply; best_of's candidates are renumbered at the end
    prompt: int                        # which prompt of the batch it answers
    request: Request
    reply: ReplyLogprobs
    last: RequestOutput | None = None
    cumulative_logprob: float = 0.0
    shaper: ReplyStreamer | None = None      # a chat reply parsed into reasoning, content and tool calls
    made_calls: bool = False                 # a streamed reply has sent tool calls (finish_reason tool_calls)
    _opened: bool = field(default=False, repr=False)

    def add(self, out: RequestOutput) -> None:
        self.last = out
        self.cumulative_logprob += sum(lp.logprob for lp in out.logprobs)
        self.reply.add(out)

    def opens(self) -> bool:
        """True once: the first chunk of this choice in a stream."""
        first, self._opened = not self._opened, True
        return first


def kept(choices: list[Choice], n: int) -> list[Choice]:
    """Per prompt, the n candidates of highest cumulative logprob (best_of; all of them when there are n),
    renumbered prompt by prompt."""
    out: list[Choice] = []
    for prompt in sorted({c.prompt for c in choices}):
        candidates = [c for c in choices if c.prompt == prompt]
        best = sorted(candidates, key=lambda c: -c.cumulative_logprob)[:n] if len(candidates) > n else candidates
        for i, c in enumerate(best):
            c.index = prompt * n + i
        out += best
    return sorted(out, key=lambda c: c.index)


def usage(choices: list[Choice]) -> dict[str, Any]:
    """Prompt tokens once per prompt; completion tokens of every candidate generated (as OpenAI bills best_of)."""
    firsts = {c.prompt: c for c in choices if c.last is not None and c.request.follows is None}
    prompt_tokens = sum(c.last.num_prompt_tokens for c in firsts.values())
    completion = sum(len(c.last.token_ids) for c in choices if c.last is not None)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": sum(c.last.num_cached_tokens for c in firsts.values())}}
