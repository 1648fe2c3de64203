"""API keys on /v1 (and /tokenize, /detokenize), the admin key on /admin, tenants' cache salts and SLO
classes, /metrics' guard and CORS, on the app the daemon serves (serving/auth.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml
from fastapi.testclient import TestClient

from engine.engine_config import EngineConfig
from serving.api_server import ApiConfig, ServerState
from serving.auth import AuthConfig, Key, Tenant
from serving.daemon import extra_routes
from serving.daemon_config import DaemonConfig
from serving.daemon_telemetry import DaemonTelemetry
from serving.http_server import check_bind, make_app
from serving.settings import SettingsError, load_settings
from tests.conftest import make_engine

CLIENT, TEAM_A, TEAM_B, ADMIN = "client-key", "team-a-key", "team-b-key", "admin-key"
ORIGIN = "https://app.example"
KEYS = (Key(CLIENT), Key(TEAM_A, Tenant("team-a", "batch")), Key(TEAM_B, Tenant("team-b")))
GUARDED = [("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "w5"}], "max_tokens": 1}),
           ("POST", "/v1/completions", {"prompt": "w5", "max_tokens": 1}), ("GET", "/v1/models", None),
           ("POST", "/tokenize", {"prompt": "w5"}), ("POST", "/detokenize", {"tokens": [5]}),
           ("GET", "/v1/any/route/yet/to/come", None)]


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def serving_app(tiny_hf, auth: AuthConfig):
    """(TestClient, made requests) of the daemon's app (API, /metrics, /admin) under `auth`, model loaded."""
    api = ApiConfig(served_model_name="tiny")
    telemetry = DaemonTelemetry(DaemonConfig(EngineConfig(), api, peak_flops=1e12, peak_bandwidth=1e11))
    made = []

    def load():
        engine = telemetry.attach(make_engine(tiny_hf[0], num_kv_blocks=256, block_size=4, token_budget=64))
        make_request = engine.make_request
        engine.make_request = lambda *a, **kw: made.append(make_request(*a, **kw)) or made[-1]
        return engine

    state = ServerState(api, load)
    client = TestClient(make_app(state, 5, extra_routes(telemetry), auth))
    return client, state, made


@pytest.fixture(scope="module")
def served(tiny_hf):
    client, state, made = serving_app(tiny_hf, AuthConfig(KEYS, ADMIN, allowed_origins=(ORIGIN,)))
    with client:
        assert state.ready.wait(60)
        yield client, made


@pytest.fixture(scope="module")
def client(served):
    return served[0]


def complete(client, key: str | None, prompt: str = "w5 w6", **extra):
    headers = bearer(key) if key else {}
    return client.post("/v1/completions", headers=headers,
                       json={"prompt": prompt, "max_tokens": 1, "temperature": 0, "ignore_eos": True, **extra})


@pytest.mark.parametrize("method,path,body", GUARDED, ids=[p for _, p, _ in GUARDED])
@pytest.mark.parametrize("key", [None, "wrong", ADMIN], ids=["no key", "wrong key", "admin key"])
def test_the_api_needs_a_client_key(client, method, path, body, key):
    """Every route under /v1, /tokenize and /detokenize, existing or not: a 401 in OpenAI's shape."""
    r = client.request(method, path, json=body, headers=bearer(key) if key else {})
    assert r.status_code == 401
    assert r.json() == {"error": {"message": r.json()["error"]["message"], "type": "authentication_error",
                                  "param": None, "code": "invalid_api_key"}}


def test_a_malformed_authorization_header_is_refused(client):
    assert client.get("/v1/models", headers={"Authorization": CLIENT}).status_code == 401
    assert client.get("/v1/models", headers={"Authorization": f"Basic {CLIENT}"}).status_code == 401


@pytest.mark.parametrize("key", [CLIENT, TEAM_A, TEAM_B])
def test_a_client_key_passes(client, key):
    assert client.get("/v1/models", headers=bearer(key)).json()["data"][0]["id"] == "tiny"
    assert complete(client, key).status_code == 200
    r = client.post("/v1/chat/completions", headers=bearer(key),
                    json={"messages": [{"role": "user", "content": "w5"}], "max_tokens": 1})
    assert r.status_code == 200
    assert client.get("/v1/models", headers={"Authorization": f"bearer {key}"}).status_code == 200
    for path, body in (("/tokenize", {"prompt": "w5"}), ("/detokenize", {"tokens": [5]})):
        assert client.post(path, headers=bearer(key), json=body).status_code != 401      # 200 where served


def test_the_admin_key_alone_opens_admin(client):
    assert client.get("/admin/scheduler").status_code == 401
    assert client.get("/admin/scheduler", headers=bearer("wrong")).status_code == 401
    for key in (CLIENT, TEAM_A):
        r = client.get("/admin/scheduler", headers=bearer(key))
        assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
    r = client.get("/admin/scheduler", headers=bearer(ADMIN))
    assert r.status_code == 200 and "policy" in r.json()


def test_without_an_admin_key_a_client_key_opens_admin(tiny_hf):
    client, state, _ = serving_app(tiny_hf, AuthConfig((Key(CLIENT),)))
    with client:
        assert state.ready.wait(60)
        assert client.get("/admin/scheduler").status_code == 401
        assert client.get("/admin/scheduler", headers=bearer("wrong")).status_code == 401
        assert client.get("/admin/scheduler", headers=bearer(CLIENT)).status_code == 200
        assert client.get("/v1/models").status_code == 401


def test_the_one_api_key_of_the_api_config_guards_v1_and_admin(tiny_hf):
    """make_app without an AuthConfig: ApiConfig.api_key is the one client key."""
    api = ApiConfig(served_model_name="tiny", api_key=CLIENT)
    state = ServerState(api, lambda: make_engine(tiny_hf[0]))
    with TestClient(make_app(state, 5, extra_routes(DaemonTelemetry(DaemonConfig(EngineConfig(), api))))) as client:
        assert state.ready.wait(60)
        assert client.get("/v1/models").status_code == 401
        assert client.get("/v1/models", headers=bearer(CLIENT)).status_code == 200
        assert client.get("/admin/scheduler", headers=bearer(CLIENT)).status_code == 200


def test_a_tenant_keys_requests_get_its_salt_and_slo_class(served):
    client, made = served
    cases = [(TEAM_A, {}, "tenant:team-a", "batch"),
             (TEAM_A, {"cache_salt": "s"}, "tenant:team-a:s", "batch"),
             (TEAM_A, {"slo_class": "interactive"}, "tenant:team-a", "interactive"),   # the body wins
             (TEAM_B, {}, "tenant:team-b", "interactive"),
             (CLIENT, {}, None, "interactive"),
             (CLIENT, {"cache_salt": "s"}, "s", "interactive"),
             (CLIENT, {"cache_salt": "tenant:team-a"}, "client:tenant:team-a", "interactive")]   # cannot pose
    for key, extra, salt, slo in cases:
        assert complete(client, key, **extra).status_code == 200
        assert (made[-1].cache_salt, made[-1].slo.name) == (salt, slo), (key, extra)
    r = client.post("/v1/completions", headers=bearer(TEAM_A) | {"X-SLO-Class": "interactive"},
                    json={"prompt": "w5", "max_tokens": 1})
    assert r.status_code == 200 and made[-1].slo.name == "interactive"          # so does the header


def test_tenants_share_no_prefix_cache_blocks(client):
    prompt = " ".join(f"w{i}" for i in range(60, 73))          # 13 tokens: 3 full blocks of 4 to reuse
    cached = lambda key, **extra: complete(client, key, prompt, **extra).json()[  # noqa: E731
        "usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached(TEAM_A) == 0
    assert cached(TEAM_A) == 12                                 # a tenant reuses its own prefix
    assert cached(TEAM_B) == 0                                  # the same prompt, another tenant: nothing
    assert cached(CLIENT) == 0                                  # nor a key naming no tenant ...
    assert cached(CLIENT, cache_salt="tenant:team-a") == 0      # ... even naming the tenant's salt
    assert cached(TEAM_B, cache_salt="team-a") == 0


def test_health_and_metrics_are_open_by_default(client):
    assert client.get("/health").status_code == 200
    r = client.get("/metrics")
    assert r.status_code == 200 and "autotuned:num_requests_running" in r.text


def test_protect_metrics_closes_metrics_to_keyless_callers(tiny_hf):
    client, state, _ = serving_app(tiny_hf, AuthConfig((Key(CLIENT),), ADMIN, protect_metrics=True))
    with client:
        assert state.ready.wait(60)
        assert client.get("/health").status_code == 200
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers=bearer("wrong")).status_code == 401
        assert client.get("/metrics", headers=bearer(CLIENT)).status_code == 200
        assert client.get("/metrics", headers=bearer(ADMIN)).status_code == 200


def preflight(client, origin: str):
    return client.options("/v1/chat/completions", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "Authorization, Content-Type, X-SLO-Class"})


def test_cors_preflight_from_an_allowed_origin_needs_no_key(client):
    r = preflight(client, ORIGIN)
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == ORIGIN
    assert {"GET", "POST", "OPTIONS"} <= set(r.headers["access-control-allow-methods"].replace(" ", "").split(","))
    allowed = {h.strip().lower() for h in r.headers["access-control-allow-headers"].split(",")}
    assert {"authorization", "content-type", "x-slo-class"} <= allowed
    r = client.get("/v1/models", headers={"Origin": ORIGIN})       # a refusal a browser can read
    assert r.status_code == 401 and r.headers["access-control-allow-origin"] == ORIGIN
    r = client.get("/v1/models", headers={"Origin": ORIGIN} | bearer(CLIENT))
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN


def test_cors_gives_another_origin_nothing(client):
    r = preflight(client, "https://evil.example")
    assert r.status_code != 200 and "access-control-allow-origin" not in r.headers
    r = client.get("/v1/models", headers={"Origin": "https://evil.example"} | bearer(CLIENT))
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_no_cors_headers_without_allowed_origins(tiny_hf):
    client, state, _ = serving_app(tiny_hf, AuthConfig((Key(CLIENT),)))
    with client:
        r = client.get("/health", headers={"Origin": ORIGIN})
        assert "access-control-allow-origin" not in r.headers


# --- the settings: flags, config, env, keys file -------------------------------------------------------------


def keys_file(tmp_path, entries) -> str:
    path = tmp_path / "keys.yaml"
    path.write_text(yaml.safe_dump({"keys": entries}))
    return str(path)


def test_client_keys_come_from_flags_config_env_and_the_keys_file(tmp_path, monkeypatch):
    from serving.cli import build_parser

    monkeypatch.delenv("AUTOTUNED_SERVE_API_KEY", raising=False)
    monkeypatch.delenv("AUTOTUNED_SERVE_ADMIN_API_KEY", raising=False)
    path = keys_file(tmp_path, [{"key": "ka", "tenant": "team-a", "slo_class": "batch"}, {"key": "kb"}])
    args = build_parser().parse_args(["serve", "--api-key", "k1", "--api-key", "k2", "--api-keys-file", path,
                                      "--admin-api-key", "adm", "--allowed-origins", "*", "--protect-metrics"])
    from serving.setting_flags import serve_overrides

    auth = load_settings(None, serve_overrides(args)).auth_config()
    assert [(k.key, k.tenant) for k in auth.client_keys] == [
        ("k1", Tenant()), ("k2", Tenant()), ("ka", Tenant("team-a", "batch")), ("kb", Tenant())]
    assert (auth.admin_key, auth.allowed_origins, auth.protect_metrics) == ("adm", ("*",), True)

    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"api_key": ["c1", "c2"], "allowed_origins": [ORIGIN]}))
    assert [k.key for k in load_settings(str(config), {}).auth_config().client_keys] == ["c1", "c2"]
    config.write_text(yaml.safe_dump({"api_key": "single"}))
    assert [k.key for k in load_settings(str(config), {}).auth_config().client_keys] == ["single"]

    monkeypatch.setenv("AUTOTUNED_SERVE_API_KEY", "e1, e2")
    monkeypatch.setenv("AUTOTUNED_SERVE_ADMIN_API_KEY", "env-admin")
    settings = load_settings(None, {})
    assert [k.key for k in settings.auth_config().client_keys] == ["e1", "e2"]
    assert settings.auth_config().admin_key == "env-admin"
    assert settings.api_config("m").api_key == "e1"              # what still reads ApiConfig.api_key sees one
    assert settings.daemon_config("m").auth_config() == settings.auth_config()


@pytest.mark.parametrize("entries,message", [
    ([{"key": ""}], "key must be a non-empty string"),
    ([{"key": "k", "tenant": "a:b"}], "without ':'"),
    ([{"key": "k", "colour": "red"}], "expected a mapping"),
    ([{"key": "k", "slo_class": "nope"}], "nope"),
    ([{"key": "k", "tenant": "a"}, {"key": "k", "tenant": "b"}], "different tenants"),
])
def test_a_bad_keys_file_is_one_line_naming_the_problem(tmp_path, monkeypatch, entries, message):
    monkeypatch.delenv("AUTOTUNED_SERVE_API_KEY", raising=False)
    with pytest.raises(SettingsError, match=message):
        load_settings(None, {"api_keys_file": keys_file(tmp_path, entries)})


def test_protect_metrics_without_any_key_is_refused(monkeypatch):
    monkeypatch.delenv("AUTOTUNED_SERVE_API_KEY", raising=False)
    monkeypatch.delenv("AUTOTUNED_SERVE_ADMIN_API_KEY", raising=False)
    with pytest.raises(SettingsError, match="protect_metrics needs"):
        load_settings(None, {"protect_metrics": True})


def test_binding_beyond_loopback_needs_a_client_key():
    with pytest.raises(ValueError, match="needs a client API key"):
        check_bind("0.0.0.0", AuthConfig())
    with pytest.raises(ValueError, match="needs a client API key"):
        check_bind("0.0.0.0", AuthConfig(admin_key=ADMIN))       # the admin key guards no /v1
    check_bind("0.0.0.0", AuthConfig((Key(CLIENT),)))
    check_bind("127.0.0.1", AuthConfig())


def test_the_serve_command_refuses_a_public_bind_without_a_key():
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOTUNED_SERVE_")}
    proc = subprocess.run([sys.executable, "-m", "serving.cli", "serve", "--host", "0.0.0.0", "--no-tune"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip()
    assert "needs a client API key" in err and len(err.splitlines()) == 1, err
