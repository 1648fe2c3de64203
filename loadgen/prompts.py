"""Benchmark prompts: real English text of an exact token length, cut from one tokenized passage.

Token-id prompts are exact for a server using the same tokenizer; sending their decoded text
instead (for servers that take no token ids) is only close, since re-tokenizing may merge pieces
differently at the cut.
"""

from __future__ import annotations

import numpy as np

from engine.model.tokenizer import Tokenizer

# Plain English prose, written for this repository.
TEXT = """\
The observatory stood at the end of a gravel road that climbed for eleven miles above the last \
farm in the valley. In summer the road was dusty and slow; in winter it was often closed for days, \
and the two astronomers who lived there through the dark months kept a cupboard of tinned soup, a \
stack of paperback novels and a radio that could reach the town only when the weather was clear, \
which was, by some unkind rule of nature, exactly when they were busiest.

The main telescope was older than either of them. It had been built with money from a shipping family \
who wanted their name on something that would outlast their fortune, and it had done so: the family \
business had closed sixty years ago, but the brass plate by the door still bore their name, polished \
every spring by whoever happened to be on duty. The mirror had been reground twice, the mount replaced \
once, and the dome motor rebuilt so many times that the only original part was the switch.

Most nights followed the same pattern. At dusk they opened the dome and let the air inside cool to the \
temperature outside, because a warm telescope makes the stars shimmer as if seen through water. While \
they waited they checked the list of targets sent by researchers in distant universities: a faint galaxy \
whose light had left it before the Earth had oceans, a variable star that brightened and dimmed every \
few hours, a comet that might or might not survive its pass around the sun. Then the long work began, \
hour after hour of pointing, focusing, exposing and recording, broken only by cups of tea and the \
occasional argument about music.

Visitors sometimes asked whether it was lonely. The honest answer was that it depended on the season. \
In the autumn, when the nights grew long and the sky was at its clearest, there was hardly time to think \
about anything but the work. In the late spring, when clouds sat on the mountain for a week at a time and \
the instruments had already been cleaned, calibrated and cleaned again, the silence could feel heavy. \
Those were the weeks when letters were written, bread was baked from the emergency flour, and the radio \
was turned up for the evening news from a world that seemed, from up there, pleasantly far away.

Every few years the university proposed closing the station and moving the telescope's work to a larger \
facility abroad, where new instruments could do in one night what the old one did in a month. Every few \
years the proposal was quietly dropped, partly because the old telescope was cheap to run, partly because \
students trained there learned to fix things with their own hands, and partly, though nobody wrote it in \
a report, because people liked knowing that someone was still up on the mountain, watching the sky.
"""


class PromptSource:
    """Windows of a repeated token stream of TEXT at seeded random offsets."""

    def __init__(self, tokenizer: Tokenizer, seed: int = 0, text: str | None = None) -> None:
        self.tokenizer = tokenizer
        self._rng = np.random.default_rng(seed)
        self._unit = _encode_plain(tokenizer, TEXT if text is None else text) + _encode_plain(tokenizer, "\n\n")
        self._stream = list(self._unit)
        self._groups: dict[str, list[int]] = {}

    def token_ids(self, n: int) -> list[int]:
        """Exactly n tokens of running text."""
        while len(self._stream) < 2 * n:
            self._stream += self._unit
        start = int(self._rng.integers(0, len(self._stream) - n + 1))
        return self._stream[start:start + n]

    def text(self, n: int) -> str:
        return self.tokenizer.decode(self.token_ids(n))

    def shared_token_ids(self, group: str, n: int) -> list[int]:
        """The first n tokens of `group`'s own text: every call for a group gives prefixes of one
        stream, which opens with the group's name so that no two groups share a block."""
        stream = self._groups.get(group)
        if stream is None:
            offset = int(np.random.default_rng(list(group.encode())).integers(0, len(self._unit)))
            stream = self._groups[group] = _encode_plain(self.tokenizer, f"[{group}]\n") + self._unit[offset:]
        while len(stream) < n:
            stream += self._unit
        return stream[:n]

    def prompt_ids(self, n: int, group: str | None = None, shared: int = 0) -> list[int]:
        """n tokens: the first `shared` of them the group's (see shared_token_ids), the rest running text."""
        head = self.shared_token_ids(group, shared) if group is not None and shared else []
        return head + (self.token_ids(n - len(head)) if n > len(head) else [])


def _encode_plain(tokenizer: Tokenizer, text: str) -> list[int]:
    """Encoded without the BOS the tokenizer may add (the server adds its own where it wants one)."""
    prefix = tokenizer.encode("")
    ids = tokenizer.encode(text)
    return ids[len(prefix):] if ids[:len(prefix)] == prefix else ids


def load_prompt_tokenizer(model: str | None) -> Tokenizer:
    """The tokenizer of a model argument as the daemon reads it (default: the bundled SmolLM2)."""
    from engine.model.checkpoint import resolve_model
    from engine.model_config import PRESETS
    from engine.model.tokenizer import load_tokenizer

    kind, location = resolve_model(model)
    vocab_size = PRESETS[location].vocab_size if kind == "dummy" else 0
    return load_tokenizer(kind, location, vocab_size)
