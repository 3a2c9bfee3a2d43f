"""The fleet file -> simulated fleet mapping (replay.fleet_map) and the fleet's replay: sections."""

from __future__ import annotations

from pathlib import Path

import pytest

from pointsman.errors import FleetError
from pointsman.policy.fleet import DEFAULT_FLEET_PATH, load_fleet
from pointsman.replay.fleet_map import DEFAULT_MAX_WAITING, EndpointMap, sim_fleet
from pointsman.replay.hardware import H100_SXM, LLAMA_3_1_8B, replica_spec_for

FLEET = """\
apiVersion: pointsman/v1
kind: Fleet
targets:
  small:
    kind: onprem
    model: {model}
    context_window_tokens: 32768
    usd_per_gpu_hour: 3.0
    pools:
      aggregated:
        gpus_per_replica: 1
        prefill_tokens_per_s: 50000
        decode_tokens_per_s: 20000
        endpoints:
          - {{name: s0, url: "http://s0/v1"}}
          - {{name: s1, url: "http://s1/v1"}}
{replay}
  api:
    kind: frontier
    provider: openai
    model: gpt-4o
    base_url: https://api.openai.com/v1
    context_window_tokens: 128000
    prices: {{usd_per_1m_input_tokens: 2.5, usd_per_1m_cached_input_tokens: 1.25, usd_per_1m_output_tokens: 10.0}}
{fleet_replay}"""


def write(tmp_path: Path, model: str = "meta-llama/Llama-3.1-8B-Instruct", replay: str = "",
          fleet_replay: str = "") -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET.format(model=model, replay=replay, fleet_replay=fleet_replay), encoding="utf-8")
    return path


def test_default_fleet_maps_pools_prices_and_spill() -> None:
    fleet = load_fleet(DEFAULT_FLEET_PATH)
    sim = sim_fleet(fleet)
    big = {t.name: t for t in sim.on_prem}["onprem-70b"]
    assert (big.aggregated_replicas, big.prefill_replicas, big.decode_replicas) == (2, 2, 4)
    assert big.gpus == 16 and big.replica.gpus == 2 and big.max_waiting == DEFAULT_MAX_WAITING
    assert big.replica.kv_capacity_blocks == 220000 // 512  # pool kv_cache_capacity_tokens
    assert big.replica.kv_bytes_per_token == 327680 and big.replica.max_model_len == 131072
    assert big.shared_kv is not None and big.shared_kv.capacity_blocks == 1500000 // 512
    assert "/fp8" in big.replica.name
    assert sim.spill_target == "frontier-large"  # highest output price
    small = {f.name: f for f in sim.frontier}["frontier-small"]
    assert (small.input_usd_per_mtok, small.cached_input_usd_per_mtok, small.output_usd_per_mtok) == (0.15, 0.075, 0.60)
    emap = EndpointMap.of(fleet)
    assert emap.by_id["http://llama-70b-decode-3.inference.internal:8000/v1"] == ("onprem-70b", "decode", 3)
    assert emap.by_id["frontier-large"] == ("frontier-large", "api", 0)


def test_derived_coefficients_follow_the_datasheet_and_replay_keys_override(tmp_path: Path) -> None:
    sim = sim_fleet(load_fleet(write(tmp_path)))
    small = sim.on_prem[0]
    expected = replica_spec_for(LLAMA_3_1_8B, H100_SXM, 1, block_tokens=512)
    assert small.replica.prefill_s_per_token == pytest.approx(expected.prefill_s_per_token)
    assert small.replica.kv_capacity_blocks == expected.kv_capacity_blocks
    assert small.gpu_hour_usd == 3.0 and small.aggregated_replicas == 2
    replay = "    replay: {weight_dtype: fp8, max_waiting: null, prefill_s_per_token: 0.0001, decode_base_s: 0.02}"
    sim = sim_fleet(load_fleet(write(tmp_path, replay=replay, fleet_replay="replay: {spill_target: null}")))
    small = sim.on_prem[0]
    assert small.replica.prefill_s_per_token == 0.0001 and small.replica.decode_base_s == 0.02
    assert small.max_waiting is None and sim.spill_target is None
    # FP8 weights: half the weight bytes -> more KV room and a faster decode step than BF16
    assert small.replica.kv_capacity_blocks > expected.kv_capacity_blocks


def test_unknown_model_and_bad_replay_keys_are_located(tmp_path: Path) -> None:
    with pytest.raises(FleetError) as err:
        sim_fleet(load_fleet(write(tmp_path, model="acme/mystery-13b")))
    text = str(err.value)
    assert "fleet.yaml:6:" in text and "unknown-model" in text and "replay.model_shape" in text
    shape = "    replay: {model_shape: {params: 13.0e+9, layers: 40, kv_heads: 8, head_dim: 128, q_dim: 5120}}"
    sim = sim_fleet(load_fleet(write(tmp_path, model="acme/mystery-13b", replay=shape)))
    assert sim.on_prem[0].replica.kv_bytes_per_token == 2 * 40 * 8 * 128 * 2
    with pytest.raises(FleetError, match="spill_target 'smal' is not a frontier target"):
        load_fleet(write(tmp_path, fleet_replay="replay: {spill_target: smal}"))
    with pytest.raises(FleetError, match="unknown-gpu"):
        sim_fleet(load_fleet(write(tmp_path, replay="    replay: {gpu: H200}")))


def test_quality_columns_are_validated_and_read(tmp_path: Path) -> None:
    from pointsman.replay.outcome_draw import quality_columns

    fleet = load_fleet(write(tmp_path, replay="    replay: {quality_columns: {alpacaeval_ae1: llama-2-70b-chat-hf}}"))
    assert quality_columns(fleet) == {"small": {"alpacaeval_ae1": "llama-2-70b-chat-hf"}}
    with pytest.raises(FleetError) as err:
        load_fleet(write(tmp_path, replay="    replay:\n      quality_columns: {alpacaeval_ae: x}"))
    text = str(err.value)
    assert "fleet.yaml:18:25: unknown-source" in text and "did you mean 'alpacaeval_ae1'" in text.lower()
    with pytest.raises(FleetError, match="quality_columns"):
        load_fleet(write(tmp_path, replay="    replay: {quality_columns: {alpacaeval_ae1: ''}}"))
    default = quality_columns(load_fleet(DEFAULT_FLEET_PATH))
    assert {t: c["alpacaeval_ae1"] for t, c in default.items()} == {
        "onprem-8b": "llama-2-7b-chat-hf", "onprem-70b": "llama-2-70b-chat-hf",
        "frontier-small": "gpt-3.5-turbo-1106", "frontier-large": "gpt4_1106_preview"}


def test_each_pool_steps_with_its_own_token_budget(tmp_path: Path) -> None:
    # the pool's max_num_batched_tokens (vLLM's --max-num-batched-tokens, which the engine's
    # latency prediction reads too) is the simulated replica's step budget; the P/D prefill pool
    # keeps its own
    text = DEFAULT_FLEET_PATH.read_text(encoding="utf-8")
    head, _, tail = text.partition("  onprem-70b:\n")
    # the aggregated pool: a step budget under its max_num_seqs (1024, vLLM's H100 default, as packaged)
    assert "max_num_batched_tokens: 8192\n        max_num_seqs: 1024" in tail
    tail = tail.replace("max_num_batched_tokens: 8192", "max_num_batched_tokens: 512", 1)
    (tmp_path / "fleet.yaml").write_text(head + "  onprem-70b:\n" + tail, encoding="utf-8")
    big = {t.name: t for t in sim_fleet(load_fleet(tmp_path / "fleet.yaml")).on_prem}["onprem-70b"]
    assert big.replica.max_num_batched_tokens == 512
    assert big.replica.max_num_seqs == 512  # vLLM caps max_num_seqs at the token budget
    assert big.prefill_replica is not None and big.prefill_replica.max_num_batched_tokens == 8192
    # the target-wide replay key it replaces is refused, not silently ignored
    with pytest.raises(FleetError, match=r"moved-key: targets.small.replay.max_num_batched_tokens moved to each pool"):
        load_fleet(write(tmp_path, replay="    replay: {max_num_batched_tokens: 512}"))


def test_a_replica_runs_at_most_its_pools_max_num_seqs(tmp_path: Path) -> None:
    """One concept, one key: the simulated replica's sequence limit is the pool's max_num_seqs (vLLM's
    --max-num-seqs, which the router's bounded-load floor reads too), 256 unless set; the replay-only
    max_batch_size it replaces is refused with where it went, not silently ignored."""
    text = write(tmp_path, replay="").read_text(encoding="utf-8")
    assert {t.replica.max_num_seqs for t in sim_fleet(load_fleet(tmp_path / "fleet.yaml")).on_prem} == {256}
    (tmp_path / "fleet.yaml").write_text(text.replace("        gpus_per_replica:", "        max_num_seqs: 7\n        gpus_per_replica:"))
    seqs = {t.replica.max_num_seqs for t in sim_fleet(load_fleet(tmp_path / "fleet.yaml")).on_prem}
    assert seqs == {7}, seqs
    with pytest.raises(FleetError, match=r"moved-key: targets.small.replay.max_batch_size moved to each pool's max_num_seqs"):
        load_fleet(write(tmp_path, replay="    replay: {max_batch_size: 8}"))
