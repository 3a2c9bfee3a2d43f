"""``pointsman policy check FILE...``, ``pointsman policy test CASES...`` and
``pointsman policy signals`` (the reference of names expressions can use).

``check`` compiles each policy file against the fleet (a file whose ``kind`` is
``Fleet`` is validated as a fleet; ``Budgets`` as a budgets file; ``PolicyCases`` as a cases file:
its schema, signal names and the policy it names, without running the cases) and prints
every problem as ``file:line:col: code: message`` on stdout; exit status 1 if any file has problems
(``cli.errors.CheckFailed``).
``test`` runs cases files (``policy/cases.py``); given a policy file, it runs the
sibling cases file (``my-policy.yaml`` -> ``my-policy.cases.yaml``); exit status 1 if
any case fails or a file is invalid.
"""

from __future__ import annotations

import re
from pathlib import Path

import click

from pointsman.cli.errors import CheckFailed
from pointsman.errors import ConfigError
from pointsman.policy.budget.config import BudgetConfig
from pointsman.policy.cases import load_cases, run_cases
from pointsman.policy.fleet import DEFAULT_FLEET_PATH, load_fleet
from pointsman.policy.rules.compiler import load_policy
from pointsman.policy.signals.namespaces import reference_markdown
from pointsman.service.keys import key_names
from pointsman.service.settings import Settings

_FLEET_KIND = re.compile(r"^kind:\s*['\"]?Fleet['\"]?\s*(#.*)?$", re.M)
_CASES_KIND = re.compile(r"^kind:\s*['\"]?PolicyCases['\"]?\s*(#.*)?$", re.M)
_BUDGETS_KIND = re.compile(r"^kind:\s*['\"]?Budgets['\"]?\s*(#.*)?$", re.M)


def _echo_problems(exc: ConfigError) -> None:
    """Every located problem of ``exc`` on its own stdout line (the findings of a check)."""
    for problem in exc.problems:
        click.echo(str(problem))


@click.group("policy")
def policy_group() -> None:
    """Check and test routing policies."""


@policy_group.command("check")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--fleet", "fleet_path", type=click.Path(path_type=Path), default=None, envvar="POINTSMAN_FLEET_PATH",
              help="Fleet the policies route to [env POINTSMAN_FLEET_PATH; default: the packaged fleet].")
def check_command(files: tuple[Path, ...], fleet_path: Path | None) -> None:
    """Compile policy FILES (or validate fleet, budgets and cases files, by their ``kind``) and
    print every problem with its location."""
    failed = False
    try:
        fleet = load_fleet(fleet_path or DEFAULT_FLEET_PATH)
    except ConfigError as exc:
        _echo_problems(exc)
        raise CheckFailed() from None
    for path in files:
        try:
            text = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""
            if _FLEET_KIND.search(text):
                f = load_fleet(path)
                click.echo(f"{path}: ok (fleet, {len(f.targets)} targets, revision {f.revision})")
            elif _BUDGETS_KIND.search(text):
                names = key_names(Settings()) or None  # the API keys this environment gives `serve`; none: unchecked
                b = BudgetConfig.load(path, names)
                scopes = len({x.scope for x in b.budgets})
                unchecked = ("; key: scopes not checked: no API keys configured here, `serve` checks them against its own"
                             if names is None and any(x.scope.startswith("key:") for x in b.budgets) else "")
                click.echo(f"{path}: ok (budgets, {len(b.budgets)} budgets on {scopes} scopes, "
                           f"reservation TTL {b.reservation_ttl_s:g} s{unchecked})")
            elif _CASES_KIND.search(text):
                spec, _, _, _ = load_cases(path, fleet_path)
                click.echo(f"{path}: ok (cases, {len(spec.cases)} cases for {spec.policy}; "
                           "run them with `pointsman policy test`)")
            else:
                p = load_policy(path, fleet)
                verify = f", {len(p.verify.rules)} verify rules" if p.verify is not None else ""
                left = "".join(f"; rule '{name}' left out: {why}" for name, why in p.omitted)
                click.echo(f"{path}: ok ({len(p.rules)} rules{verify}, revision {p.revision}{left})")
        except ConfigError as exc:
            failed = True
            _echo_problems(exc)
    if failed:
        raise CheckFailed()


def cases_file(path: Path) -> Path:
    """``path`` itself for a cases file, else the policy's sibling ``<stem>.cases.yaml`` when it exists."""
    if path.name.endswith(".cases.yaml") or path.suffix not in (".yaml", ".yml"):
        return path
    sibling = path.with_name(path.name.rsplit(".", 1)[0] + ".cases.yaml")
    return sibling if sibling.exists() else path


@policy_group.command("test")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--fleet", "fleet_path", type=click.Path(path_type=Path), default=None, envvar="POINTSMAN_FLEET_PATH",
              help="Fleet of a cases file that names none (fleet:) [env POINTSMAN_FLEET_PATH; default: the packaged fleet].")
def test_command(files: tuple[Path, ...], fleet_path: Path | None) -> None:
    """Run policy cases FILES (input signals -> expected target, mode, rule); a policy file
    runs its sibling cases file."""
    passed = failed = unreadable = 0
    for path in map(cases_file, files):
        try:
            results = run_cases(path, fleet_path)
        except ConfigError as exc:
            unreadable += 1
            _echo_problems(exc)
            continue
        for r in results:
            if r.passed:
                passed += 1
                click.echo(f"PASS {path}:{r.line}: {r.name}")
            else:
                failed += 1
                click.echo(f"FAIL {path}:{r.line}: {r.name}: {r.message}")
    click.echo(f"{passed} passed, {failed} failed"
               + (f"; {unreadable} file(s) not run: their problems are listed above" if unreadable else ""))
    if failed or unreadable:
        raise CheckFailed()


@policy_group.command("signals")
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the page to this file (e.g. docs/policy-signals.md) instead of stdout.")
def signals_command(output: Path | None) -> None:
    """Print the reference of signals and functions policy expressions can use (Markdown)."""
    text = reference_markdown()
    if output is None:
        click.echo(text, nl=False)
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text, encoding="utf-8")
    click.echo(f"wrote {output}")


def register(group: click.Group) -> None:
    """Attach the ``policy`` group to the ``pointsman`` group."""
    group.add_command(policy_group)
