"""Fleet file validation: the shipped default loads; bad files list every problem, located."""

from pathlib import Path

import pytest

from pointsman.errors import FleetError
from pointsman.policy.fleet import DEFAULT_FLEET_PATH, FrontierTarget, OnPremTarget, load_fleet, parse_fleet

GOOD = """\
apiVersion: pointsman/v1
kind: Fleet
targets:
  small:
    kind: onprem
    model: org/small
    context_window_tokens: 8192
    usd_per_gpu_hour: 2.0
    pools:
      aggregated:
        gpus_per_replica: 1
        prefill_tokens_per_s: 1000
        decode_tokens_per_s: 100
        endpoints: ["http://small-0:8000/v1"]
"""


def test_default_fleet_has_the_required_tiers():
    fleet = load_fleet()
    assert fleet.file == str(DEFAULT_FLEET_PATH)
    kinds = {name: type(t) for name, t in fleet.targets.items()}
    assert kinds == {"onprem-8b": OnPremTarget, "onprem-70b": OnPremTarget,
                     "frontier-small": FrontierTarget, "frontier-large": FrontierTarget}
    assert fleet.targets["onprem-70b"].modes == ("aggregated", "disaggregated")
    assert fleet.targets["onprem-8b"].modes == ("aggregated",)
    assert fleet.targets["frontier-large"].prices.usd_per_1m_output_tokens == 10.0
    assert len(fleet.revision) == 16


def test_revision_is_a_content_hash():
    a, b = parse_fleet(GOOD, "a.yaml"), parse_fleet(GOOD, "b.yaml")
    c = parse_fleet(GOOD.replace("2.0", "2.5"), "a.yaml")
    assert a.revision == b.revision != c.revision


def test_endpoint_strings_become_endpoints():
    fleet = parse_fleet(GOOD)
    assert fleet.targets["small"].pools.aggregated.endpoints[0].url == "http://small-0:8000/v1"


def test_every_problem_at_once_with_locations_and_did_you_mean(tmp_path: Path):
    bad = GOOD.replace("    usd_per_gpu_hour: 2.0\n", "    usd_per_gpu_hour: cheap\n    gpus: 2\n")
    bad = bad.replace('["http://small-0:8000/v1"]', '["ftp://small-0"]')
    bad += """\
  big:
    kind: frontier
    provider: openai
    model: gpt
    base_url: https://api.example.com/v1
    context_window_tokens: 1000
    prices:
      usd_per_1m_input_token: 1
      usd_per_1m_cached_input_tokens: 0.5
      usd_per_1m_output_tokens: 2
"""
    path = tmp_path / "fleet.yaml"
    path.write_text(bad)
    with pytest.raises(FleetError) as info:
        load_fleet(path)
    got = [str(p) for p in info.value.problems]
    f = str(path)
    assert f"{f}:8:23: invalid-value: targets.small.usd_per_gpu_hour: Input should be a valid number, unable to parse string as a number" in got
    assert f"{f}:9:5: unknown-key: unknown key 'gpus' in targets.small" in got
    assert any(s.startswith(f"{f}:15:21: invalid-value: targets.small.pools.aggregated.endpoints[0].url: 'ftp://small-0'") for s in got)
    assert (f"{f}:23:7: unknown-key: unknown key 'usd_per_1m_input_token' in targets.big.prices; "
            "did you mean 'usd_per_1m_input_tokens'?") in got
    assert f"{f}:23:7: missing-key: missing required key 'usd_per_1m_input_tokens' in targets.big.prices" in got
    assert len(got) == 5


def test_prefill_without_decode_pool_is_rejected():
    bad = GOOD.replace("      aggregated:", "      prefill:")
    with pytest.raises(FleetError, match=r"<fleet>:10:7: invalid-value: .*needs both a 'prefill' and a 'decode' pool"):
        parse_fleet(bad)


def test_default_mode_must_have_pools():
    bad = GOOD.replace("    usd_per_gpu_hour: 2.0\n", "    usd_per_gpu_hour: 2.0\n    default_mode: disaggregated\n")
    with pytest.raises(FleetError, match=r"<fleet>:9:19: unsupported-mode: target 'small' has no pools for mode 'disaggregated'"):
        parse_fleet(bad)


def test_yaml_syntax_error_is_located():
    with pytest.raises(FleetError, match=r"<fleet>:4:1: yaml-syntax: .*found .<stream end>."):
        parse_fleet("apiVersion: pointsman/v1\nkind: Fleet\ntargets: [\n")


def test_duplicate_keys_are_rejected():
    bad = GOOD.replace("    model: org/small\n", "    model: org/small\n    model: org/other\n")
    with pytest.raises(FleetError, match=r"<fleet>:7:5: duplicate-key: key 'model' is already defined at line 6"):
        parse_fleet(bad)


def test_missing_and_undecodable_files(tmp_path: Path):
    with pytest.raises(FleetError, match="file-not-found"):
        load_fleet(tmp_path / "nope.yaml")
    p = tmp_path / "latin1.yaml"
    p.write_bytes(b"apiVersion: pointsman/v1\nkind: Fle\xe9t\n")
    with pytest.raises(FleetError, match=r"latin1.yaml:2:10: encoding: not valid UTF-8 \(byte 0xe9\)"):
        load_fleet(p)


def test_empty_file_is_rejected():
    with pytest.raises(FleetError, match="expected a mapping at the top level, got an empty file"):
        parse_fleet("")


def test_slo_classes_default_and_declared():
    fleet = parse_fleet(GOOD)  # no slo_classes: MLPerf's server constraints
    assert (fleet.slo().ttft_s, fleet.slo().tpot_s) == (2.0, 0.1)
    assert fleet.slo("long-context").ttft_s == 6.0 and set(fleet.slo_classes) == {"interactive", "long-context"}
    own = parse_fleet(GOOD + "defaults: {slo_class: chat}\nslo_classes:\n  chat: {ttft_s: 1.5, tpot_s: 0.05}\n")
    assert own.slo().ttft_s == 1.5 and set(own.slo_classes) == {"chat"}
    with pytest.raises(KeyError):
        own.slo("interactive")
    with pytest.raises(FleetError, match=r"<fleet>:\d+:\d+: unknown-slo-class: defaults.slo_class 'interactiv' .*"
                                         r"did you mean 'interactive'"):
        parse_fleet(GOOD + "defaults: {slo_class: interactiv}\n")


def test_sglang_events_take_no_vllm_hash_settings():
    """``kv_events.engine: sglang`` hashes as SGLang does (unseeded SHA-256 pages): vLLM's seed or algorithm there
    would be a setting that changes nothing, so the file is refused."""
    events = "    usd_per_gpu_hour: 2.0\n    kv_events: {engine: sglang, tokenizer: t.json, hash_seed: '0'}\n"
    with pytest.raises(FleetError, match=r"<fleet>:9:16: invalid-value: targets.small.kv_events: hash_algo and hash_seed are vLLM.s settings"):
        parse_fleet(GOOD.replace("    usd_per_gpu_hour: 2.0\n", events))
