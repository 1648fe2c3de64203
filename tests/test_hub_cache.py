"""`--model owner/name` from the local Hugging Face cache (a fake one under HF_HUB_CACHE): found
offline, or a one-line error naming the cache."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from engine import ModelLoadError
from engine.model.checkpoint import resolve_model
from tests.conftest import make_engine
from tests.test_hf_equivalence import hf_greedy, prompts, run_all

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def cache_repo(cache, repo_id: str, files: dict[str, str]) -> str:
    """huggingface_hub's cache layout: refs/main names the snapshot holding the files (here copies)."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    for name, source in files.items():
        shutil.copy(source, snapshot / name)
    return str(snapshot)


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    return tmp_path


def test_a_cached_repo_id_serves_like_its_directory(tiny_hf, hub_cache):
    path, hf = tiny_hf
    snapshot = cache_repo(hub_cache, "tiny-org/tiny-llama", {p.name: p for p in Path(path).iterdir()})
    assert resolve_model("tiny-org/tiny-llama") == ("hf", snapshot)
    prompt = prompts(1, seed=11)[0]
    assert run_all(make_engine("tiny-org/tiny-llama"), [prompt], 6) == [hf_greedy(hf, prompt, 6)]


def test_a_gguf_repo_gives_its_file_or_asks_which(tmp_path, hub_cache):
    (tmp_path / "a.gguf").write_bytes(b"x")
    one = cache_repo(hub_cache, "org/one-GGUF", {"model-Q4_K_M.gguf": tmp_path / "a.gguf"})
    assert resolve_model("org/one-GGUF") == ("gguf", f"{one}/model-Q4_K_M.gguf")
    two = cache_repo(hub_cache, "org/two-GGUF", {"m-Q4_K_M.gguf": tmp_path / "a.gguf", "m-Q8_0.gguf": tmp_path / "a.gguf"})
    assert resolve_model("org/two-GGUF:m-Q8_0.gguf") == ("gguf", f"{two}/m-Q8_0.gguf")
    with pytest.raises(ModelLoadError, match=r"holds 2 GGUF files; pick one as org/two-GGUF:FILE"):
        resolve_model("org/two-GGUF")


def test_a_repo_not_in_the_cache_is_a_one_line_error_naming_it(hub_cache):
    with pytest.raises(ModelLoadError) as error:
        resolve_model("nobody/absent-model")
    message = str(error.value)
    assert "'nobody/absent-model' is not in the local Hugging Face cache" in message
    assert str(hub_cache) in message and "\n" not in message
