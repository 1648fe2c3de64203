"""Hardware profiles: the shipped profiles stay within 15% of the published figures they carry, and
their step-time model works everywhere the fitted cost model does (simulator, capacity search,
warm start, deadline policy, CLI)."""

from __future__ import annotations

import json
import pickle

import pytest

from serving.cli import main
from autotuner.search_space import load_search_space
from simulation.cost_model_files import resolve_cost_model
from simulation.workload_run import simulate, simulated_probe
from autotuner.warm_start import slo_token_budget
from loadgen.workload import RequestSpec, load_workload
from simulation.cost_model import StepShape
from simulation.hardware_profile import load_profile, parse_profile, profile_names, read_profile, PROFILES_DIR
from simulation.profile_checks import TOLERANCE, run_checks
from simulation.profile_cost_model import ProfileCostModel
from policies import Knobs
from engine.slo_class import SloClass
from telemetry.model_shape import ModelShape

REQUIRED = ("h100-llama3.1-8b", "a100-mistral-7b", "h100-llama3.1-70b-tp4", "h100-llama3.1-70b-tp8")
CHECKS = [(name, c.name) for name in profile_names() for c in load_profile(name).checks]


def test_the_required_profiles_ship():
    assert set(REQUIRED) <= set(profile_names())


@pytest.mark.parametrize("name,check", CHECKS)
def test_every_check_is_within_15_percent(name, check):
    result = next(r for r in run_checks(load_profile(name)) if r.check.name == check)
    assert abs(result.error) <= TOLERANCE, result.line()


@pytest.mark.parametrize("name", profile_names())
def test_every_profile_has_a_held_out_check_and_sources(name):
    profile = load_profile(name)
    assert any(c.role == "held-out" for c in profile.checks)
    assert profile.sources and all(c.source for c in profile.checks)
    # the model shape and the stated parameter bytes agree (embeddings + LM head + layers)
    m = profile.model
    params = m.shape.linear_params + 2 * m.shape.head_params
    assert params * m.bytes_per_param == pytest.approx(m.parameter_bytes, rel=0.02)


def test_a_profile_files_model_keys_load_into_the_one_model_shape():
    """The files keep their short keys (layers, hidden, ...); they map onto telemetry's ModelShape,
    the shape the live MFU/MBU accounting uses too."""
    model = load_profile("h100-llama3.1-8b").model
    assert model.shape == ModelShape(num_layers=32, hidden_size=4096, intermediate_size=14336, num_heads=32,
                                     num_kv_heads=8, head_dim=128, vocab_size=128256)
    assert (model.name, model.dtype, model.bytes_per_param) == ("Llama-3.1-8B", "bf16", 2)


def test_kv_pool_is_what_is_left_after_weights_and_activations():
    p = load_profile("h100-llama3.1-8b")
    per_block = 2 * 32 * 8 * 128 * 2 * 16                      # K and V, 32 layers, 8 KV heads, bf16
    assert p.kv_blocks() == int((80e9 * 0.9 - 16.06e9 - 2e9) // per_block)
    tp8 = load_profile("h100-llama3.1-70b-tp8")
    assert tp8.kv_blocks() > load_profile("h100-llama3.1-70b-tp4").kv_blocks()   # weights and KV split 8 ways


def test_step_time_grows_with_work_and_jumps_past_a_tile():
    m = ProfileCostModel.named("a100-mistral-7b")
    times = [m.predict_counts(n, 0, 1, n, n * (n + 1) // 2, 1) for n in range(1, 2049, 7)]
    assert all(b >= a for a, b in zip(times, times[1:]))
    linear = m.terms.linear_s
    assert linear(136) / linear(128) > 1.3 and linear(256) == pytest.approx(linear(136))
    decode = lambda ctx: m.predict_counts(0, 64, 64, 64 * ctx, 64 * ctx, 64)   # noqa: E731
    assert decode(4000) - decode(1000) == pytest.approx(64 * 3000 * (m.terms.kv_token_s + m.terms.pair_s))


def test_same_interface_as_the_fitted_cost_model():
    m = ProfileCostModel.named("h100-llama3.1-8b")
    shape = StepShape(300, 20, 21, 9000, 60000, 21)
    seconds = m.predict(shape)
    assert seconds == m.predict_counts(300, 20, 21, 9000, 60000, 21) > 0
    assert m.scaled(2.0).predict(shape) == pytest.approx(2 * seconds)
    assert pickle.loads(pickle.dumps(m)).predict(shape) == pytest.approx(seconds)   # crosses to the warm start's child
    assert (m.model, m.dtype, m.block_size, m.tile_tokens) == ("Llama-3.1-8B", "bf16", 16, 128)
    assert m.device == "H100-SXM-80GB x1" and m.kv_blocks == load_profile("h100-llama3.1-8b").kv_blocks()


def test_tensor_parallelism_splits_the_work_and_adds_all_reduces():
    tp4 = ProfileCostModel.named("h100-llama3.1-70b-tp4")
    tp8 = tp4.at_tp(8)
    assert tp8.terms.linear_s(2048) < tp4.terms.linear_s(2048)
    assert tp4.terms.communication_s(1) > 0 and ProfileCostModel.named("h100-llama3.1-8b").terms.communication_s(1) == 0


def test_simulator_runs_on_a_profile():
    cost = resolve_cost_model(profile="h100-llama3.1-8b")
    specs = [RequestSpec(0.05 * i, 500, 50, "p") for i in range(40)]
    for policy in ("sarathi", "deadline", "prefill-first"):
        run = simulate(specs, cost, policy, Knobs(token_budget=512), SloClass(ttft_s=2.0, tbt_s=0.1))
        assert run.summary.num_finished == 40 and run.num_rejected == 0
        assert run.summary.tbt_p50_s < 0.05         # an H100 decodes an 8B model in milliseconds, not the CPU's 50 ms+
    probe = simulated_probe(load_workload("chat"), cost, "sarathi", Knobs(), SloClass(), 30)
    assert probe(2.0).num_finished == 30


def test_warm_start_budget_rule_reads_the_profile():
    space = load_search_space()
    a100 = slo_token_budget(ProfileCostModel.named("a100-mistral-7b"), SloClass(ttft_s=2.0, tbt_s=0.1), space, 0.1)
    h100 = slo_token_budget(ProfileCostModel.named("h100-llama3.1-8b"), SloClass(ttft_s=2.0, tbt_s=0.1), space, 0.1)
    assert a100 < h100                               # the faster GPU fits a larger chunk in 0.1 s


def test_bad_profiles_are_refused():
    data = json.loads(json.dumps(_raw("h100-llama3.1-8b")))
    with pytest.raises(ValueError, match="unknown key 'colour'"):
        parse_profile(data | {"colour": "red"}, "x")
    bad = json.loads(json.dumps(data))
    bad["hardware"]["compute_fraction"] = 1.5
    with pytest.raises(ValueError, match="fractions"):
        parse_profile(bad, "x")
    bad = json.loads(json.dumps(data))
    bad["model"]["num_layers"] = 32                   # ModelShape's name; the file's is `layers`
    with pytest.raises(ValueError, match="unknown key 'num_layers'"):
        parse_profile(bad, "x")
    bad = json.loads(json.dumps(data))
    del bad["model"]["kv_heads"]
    with pytest.raises(ValueError, match="needs kv_heads"):
        parse_profile(bad, "x")
    bad = json.loads(json.dumps(data))
    bad["model"]["parameter_bytes"] = 200e9           # no room left for a KV cache
    with pytest.raises(ValueError, match="no memory"):
        parse_profile(bad, "x")
    with pytest.raises(ValueError, match="expected one of a100-mistral-7b"):
        load_profile("b200-llama")


def test_cli_profiles_lists_one_line_each(capsys):
    assert main(["profiles"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[0] for line in lines] == profile_names()
    assert all("checks ok" in line for line in lines)
    assert main(["profiles", "--checks"]) == 0
    assert "held-out" in capsys.readouterr().out


def test_cli_simulate_capacity_and_tune_take_a_profile(capsys, tmp_path):
    assert main(["simulate", "--profile", "h100-llama3.1-8b", "--requests", "30", "--qps", "5"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cost_model"] == "profile h100-llama3.1-8b" and out["num_finished"] == 30
    assert main(["capacity", "--simulate", "--profile", "a100-mistral-7b", "--num-requests", "20",
                 "--max-probes", "2", "--slo-tbt-s", "0.1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["simulated"] and len(out["probes"]) == 2
    assert main(["tune", "--simulate", "--profile", "h100-llama3.1-8b", "--workload", "chat", "--duration", "10",
                 "--qps", "2", "--state-dir", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["cost_model"] == "profile h100-llama3.1-8b"


def test_cli_profile_errors_are_one_line(capsys):
    assert main(["simulate", "--profile", "nope", "--requests", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "unknown hardware profile 'nope'" in err and "h100-llama3.1-8b" in err
    assert main(["capacity", "--profile", "a100-mistral-7b"]) == 2
    assert "add --simulate" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["simulate", "--profile", "a100-mistral-7b", "--cost-model", "x.json"])


def _raw(name: str) -> dict:
    import yaml
    return yaml.safe_load((PROFILES_DIR / f"{name}.yaml").read_text())


def test_read_profile_reads_a_file(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text((PROFILES_DIR / "a100-mistral-7b.yaml").read_text())
    assert read_profile(path).name == "a100-mistral-7b"


def test_plain_python_percentile_matches_numpy():
    import numpy as np

    from telemetry.window import percentile

    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 10, 117):
        values = list(rng.random(n))
        for q in (0, 50, 90, 99, 100):
            assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), abs=1e-12)


def test_tune_without_the_ablation_skips_the_plain_budget_grid(capsys, tmp_path):
    assert main(["tune", "--simulate", "--profile", "h100-llama3.1-8b", "--workload", "chat", "--duration", "10",
                 "--qps", "2", "--state-dir", str(tmp_path), "--no-ablation"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"tuned", "best_static", "per_phase_best", "vllm_default_2048"} <= set(out["goodput_rps"])
    assert "best_static_plain_budget" not in out["goodput_rps"] and "best_static_plain_budget_knobs" not in out
    phases = {"chat"}
    assert set(out["good_requests_by_phase"]["tuned"]) <= phases and set(out["per_phase_best_knobs"]) <= phases


def test_per_phase_best_knobs_picks_each_phases_own_best():
    from autotuner.simulated_tuning import RunResult, per_phase_best_goodput, per_phase_best_knobs

    grid = [({"token_budget": 256}, RunResult(1.0, None, 0.0, 10.0, {"a": 8, "b": 2})),
            ({"token_budget": 2048}, RunResult(1.0, None, 0.0, 10.0, {"a": 3, "b": 7}))]
    assert per_phase_best_knobs(grid) == {"a": {"token_budget": 256}, "b": {"token_budget": 2048}}
    assert per_phase_best_goodput([r for _, r in grid], 10.0) == pytest.approx(1.5)
