"""The cluster's router alone (cluster/router.py, cluster/prefix_index.py): no Ray needed."""

from __future__ import annotations

import pytest

from cluster.prefix_index import PrefixIndex, prompt_block_keys
from cluster.router import NoReplicaError, ReplicaLoad, Router, RouterConfig
from engine.kv_cache.block_manager import BlockManager  # noqa: F401  (the engine imports cleanly beside the router)
from engine.kv_cache.prefix_cache import PrefixCachingBlockManager
from engine.scheduling.request import Request
from engine.sampling_params import SamplingParams

SYSTEM = list(range(100, 164))          # a 64-token shared prefix: 4 blocks of 16
LONG = list(range(1000, 1256))          # a 256-token one (a system prompt): 16 blocks


def router(policy: str = "affinity", replicas=("a", "b"), **config) -> Router:
    r = Router(list(replicas), RouterConfig(policy=policy, **config), block_size=16)
    for name in replicas:
        r.update(name, ReplicaLoad(incarnation="1"))
    return r


def keys(tokens: list[int], salt: str | None = None) -> list[bytes]:
    return prompt_block_keys(tokens, 16, salt)


def test_the_router_keys_are_the_engine_prefix_cache_keys():
    """The router's notion of a prefix is the engine's: same chained keys, salt included."""
    tokens = SYSTEM + [7] * 20
    pool = PrefixCachingBlockManager(num_blocks=16, block_size=16)
    for salt in (None, "tenant-a"):
        request = Request("r", tokens, SamplingParams(max_tokens=1), 0.0, cache_salt=salt)
        assert [pool._key(request, i) for i in range(len(tokens) // 16)] == keys(tokens, salt)
    assert keys(tokens, "tenant-a") != keys(tokens) and len(keys(tokens[:15])) == 0


def test_requests_sharing_a_prefix_follow_it_while_others_spread_by_load():
    r = router()
    first = r.choose(keys(LONG + [1] * 16), 272)
    assert first.reason == "load"
    home = first.replica
    r.update(home, ReplicaLoad(incarnation="1"))               # it finished: idle again, prefix cached
    for tail in range(2, 7):                                   # each adds 16 uncached tokens of work at home
        again = r.choose(keys(LONG + [tail] * 16), 272)
        assert (again.replica, again.reason, again.cached_tokens) == (home, "affinity", 256)
    assert r.load_tokens(home) == 5 * 16
    other = r.choose(keys(list(range(500, 600))), 100)         # a new prefix goes to the less loaded one
    assert other.replica != home and other.reason == "load"


def test_a_busy_home_hands_the_prefix_to_a_second_replica():
    """Once waiting at home costs more than recomputing the prefix, another replica computes it;
    from then on both hold it and share its traffic by load."""
    r = router()
    home = r.choose(keys(SYSTEM + [1] * 16), 80).replica      # 64 cached tokens are worth less than 80 queued
    second = r.choose(keys(SYSTEM + [2] * 16), 80)
    assert second.replica != home and second.reason == "load"
    for name in ("a", "b"):
        r.update(name, ReplicaLoad(incarnation="1"))
    picks = [r.choose(keys(SYSTEM + [i] * 16), 80) for i in range(3, 9)]
    assert {p.replica for p in picks} == {"a", "b"} and {p.reason for p in picks} == {"affinity"}


def test_a_longer_cached_prefix_wins_over_a_shorter_one():
    r = router()
    r.index.insert("a", keys(SYSTEM[:32]))
    r.index.insert("b", keys(SYSTEM))
    decision = r.choose(keys(SYSTEM + [9] * 16), 80)
    assert (decision.replica, decision.cached_tokens) == ("b", 64)


def test_load_beats_affinity_past_the_imbalance_bound():
    r = router(max_imbalance_tokens=100)
    r.index.insert("a", keys(LONG))
    r.update("a", ReplicaLoad(queued_tokens=90, incarnation="1"))
    assert r.choose(keys(LONG), 256).replica == "a"             # 90 busier, 256 cached: worth it, within bound
    r.update("a", ReplicaLoad(queued_tokens=150, running_tokens=50, incarnation="1"))
    decision = r.choose(keys(LONG), 256)                        # still cheaper (200 < 256) but past the bound
    assert (decision.replica, decision.reason) == ("b", "balance")


def test_tokens_sent_count_as_load_until_the_replica_answers():
    r = router(policy="load")
    picks = [r.choose([], 100, output_tokens=20).replica for _ in range(4)]
    assert sorted(picks) == ["a", "a", "b", "b"]
    assert r.load_tokens("a") == 240
    r.update("a", ReplicaLoad(queued_tokens=30, incarnation="1"))
    assert r.load_tokens("a") == 30


def test_unhealthy_replicas_are_skipped_and_none_left_is_an_error():
    r = router(replicas=("a", "b", "c"))
    r.mark_unhealthy("b")
    assert {r.choose([], 1).replica for _ in range(6)} == {"a", "c"}
    assert r.choose([], 1, exclude={"a"}).replica == "c"
    r.mark_unhealthy("c")
    with pytest.raises(NoReplicaError):
        r.choose([], 1, exclude={"a"})
    r.update("b", ReplicaLoad(incarnation="1"))                # it answered again
    assert r.choose([], 1, exclude={"a"}).replica == "b"


def test_a_restarted_replica_loses_its_affinity():
    r = router()
    home = r.choose(keys(SYSTEM), 64).replica
    assert r.index.matched_blocks(keys(SYSTEM)) == {home: 4}
    r.update(home, ReplicaLoad(incarnation="2"))               # Serve started a new process: empty cache
    assert r.index.matched_blocks(keys(SYSTEM)) == {}


def test_a_short_common_opening_does_not_herd_requests():
    """Every chat prompt starts with the template's fixed opening: that alone must not pull all
    requests to one replica."""
    r = router()
    opening = SYSTEM[:16]
    picks = {r.choose(keys(opening + list(range(1000 + 100 * i, 1100 + 100 * i))), 116).replica for i in range(4)}
    assert picks == {"a", "b"}


def test_round_robin_ignores_prefixes():
    r = router(policy="round_robin", replicas=("a", "b", "c"))
    picks = [r.choose(keys(SYSTEM), 64) for _ in range(6)]
    assert sorted(p.replica for p in picks) == ["a", "a", "b", "b", "c", "c"]
    assert {p.reason for p in picks} == {"round_robin"}


def test_the_index_is_bounded_least_recently_used_first():
    index = PrefixIndex(capacity=8)
    old, new = keys(list(range(64))), keys(list(range(1000, 1128)))
    index.insert("a", old)
    index.insert("b", new)
    assert len(index) == 8 and index.matched_blocks(old) == {} and index.matched_blocks(new) == {"b": 8}


def test_bad_router_settings_are_refused():
    with pytest.raises(ValueError, match="policy"):
        RouterConfig(policy="random")
    with pytest.raises(ValueError):
        RouterConfig(load_interval_s=0)
    with pytest.raises(ValueError):
        RouterConfig(max_imbalance_tokens=-1)
    with pytest.raises(ValueError):
        Router([])


def test_the_ingress_keys_a_request_by_the_prompt_the_replica_will_see():
    import json

    from cluster.prompt_key import NO_KEY, route_key
    from engine.model.tokenizer import ByteTokenizer

    tok = ByteTokenizer(300)
    text = "x" * 40
    plain = route_key("/v1/completions", json.dumps({"prompt": text, "max_tokens": 7}).encode(), tok, 16, 256)
    assert (plain.block_keys, plain.prompt_tokens, plain.output_tokens) == (keys(tok.encode(text)), 40, 7)
    ids = route_key("/v1/completions", json.dumps({"prompt": list(range(3, 40)), "cache_salt": "t"}).encode(),
                    tok, 16, 256)
    assert ids.block_keys == keys(list(range(3, 40)), "t") and ids.output_tokens == 256
    messages = [{"role": "user", "content": text}]
    chat = route_key("/v1/chat/completions", json.dumps({"messages": messages}).encode(), tok, 16, 256)
    assert chat.block_keys == keys(tok.apply_chat_template(messages))
    for bad in (b"{not json", b'{"prompt": 5}', b'{"messages": []}'):      # the replica answers these
        assert route_key("/v1/completions" if b"prompt" in bad else "/v1/chat/completions", bad, tok, 16,
                         256) == NO_KEY
