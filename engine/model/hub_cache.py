"""`--model owner/name`: a Hugging Face repo id found in the local Hugging Face cache. Nothing is
downloaded (the daemon runs offline); a repo not in the cache is a one-line error naming the cache."""

from __future__ import annotations

import os
import re

from engine.errors import ModelLoadError

# owner/name, optionally :FILE.gguf to pick one of a GGUF repo's files
_REPO_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?::(?P<file>[^:]+\.gguf))?$")


def looks_like_repo_id(model: str) -> bool:
    return _REPO_ID.match(model) is not None


def hub_cache_dir() -> str:
    """The cache huggingface_hub reads: HF_HUB_CACHE as set now (its constants are read at import)."""
    from huggingface_hub import constants

    return os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE


def resolve_repo_id(model: str) -> tuple[str, str]:
    """(kind, location) as checkpoint.resolve_model gives them: "hf" and the snapshot directory where it
    has config.json, else "gguf" and the snapshot's one .gguf file (or the one named after ':')."""
    match = _REPO_ID.match(model)
    assert match is not None, model
    snapshot = _cached_snapshot(match["repo"])
    if match["file"]:
        path = os.path.join(snapshot, match["file"])
        if not os.path.isfile(path):
            raise ModelLoadError(f"{model!r}: the cached snapshot {snapshot} has no {match['file']}")
        return "gguf", path
    if os.path.isfile(os.path.join(snapshot, "config.json")):
        return "hf", snapshot
    ggufs = sorted(f for f in os.listdir(snapshot) if f.endswith(".gguf"))
    if len(ggufs) == 1:
        return "gguf", os.path.join(snapshot, ggufs[0])
    if ggufs:
        raise ModelLoadError(f"{model!r} holds {len(ggufs)} GGUF files; pick one as {match['repo']}:FILE "
                             f"({', '.join(ggufs)})")
    raise ModelLoadError(f"the cached snapshot of {model!r} ({snapshot}) has neither config.json nor a .gguf file")


def _cached_snapshot(repo_id: str) -> str:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = hub_cache_dir()
    try:
        return str(snapshot_download(repo_id, cache_dir=cache, local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError, ValueError) as e:
        raise ModelLoadError(f"{repo_id!r} is not in the local Hugging Face cache {cache} (nothing is downloaded: "
                             f"fetch it with `hf download {repo_id}`, or pass a directory or a .gguf file)") from e
