#!/usr/bin/env python3
"""Scores conformance-suite results (tests/conformance/run.sh calls this).

For each run NAME:REVISION it reads RESULTS/NAME/server-<scenario>-<timestamp>/checks.json
(what `conformance server -o` writes) and the revision's frozen requirement list
(REQUIREMENTS/<revision>.yaml from the installed suite). A scenario fails iff one of its
checks has status FAILURE; a scored scenario with no results at all fails too.

With --promoted FILE (lines "RUN SCENARIO"), a scenario the requirement file lists as
not_scored with reason `extension` is scored for that run (an extension the target
implements); promoting any other not_scored scenario is refused.

With --expected FILE (lines "RUN SCENARIO CHECK-ID"), those checks of a scored scenario
are expected to fail (each explained in RESULTS.md): a scenario whose only failing
checks are expected is "xfail" and counts neither as passed nor as failed; a failing
check that is not listed fails the scenario as usual; a listed check that no longer
fails (or a listed scenario that is not scored in the run) is "stale" and fails, so the
list never outlives what it explains.

Prints a table of every scenario of every run (scored and not scored), the failing
checks, and ends with exactly "N passed, M failed" over the scored scenarios of all
runs. Exit status 1 if any scored scenario failed.
"""

import argparse
import json
import os
import re
import sys

DIR_RE = re.compile(r"^server-(.+)-\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}-\d{3}Z$")


def read_requirements(path):
    """The `server:` list and the server-leg `not_scored:` entries of a requirement file.

    The file is plain block YAML of two shapes (`  - name` under `server:`, and
    `  - scenario: X` / `    leg: L` / `    reason: R` under `not_scored:`); reading
    just that keeps this script dependency-free."""
    scored, not_scored = [], []
    section, entry = None, None
    with open(path, encoding="utf-8") as f:
        for raw in f:
            line = raw.rstrip()
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            if not line.startswith(" "):
                section = line.rstrip(":").strip()
                continue
            stripped = line.strip()
            if section == "server" and stripped.startswith("- "):
                scored.append(stripped[2:].strip())
            elif section == "not_scored":
                if stripped.startswith("- scenario:"):
                    entry = {"scenario": stripped.split(":", 1)[1].strip()}
                    not_scored.append(entry)
                elif entry is not None and ":" in stripped and not stripped.startswith("-"):
                    key, value = stripped.split(":", 1)
                    if key in ("leg", "reason"):
                        entry[key] = value.strip()
    return scored, [e for e in not_scored if e.get("leg") == "server"]


def read_promoted(path):
    """run name -> scenarios promoted to scored for that run."""
    out = {}
    if not path:
        return out
    with open(path, encoding="utf-8") as f:
        for raw in f:
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            run, scenario = line.split()
            out.setdefault(run, []).append(scenario)
    return out


def read_expected(path):
    """run name -> {scenario -> set of check ids expected to fail}."""
    out = {}
    if not path:
        return out
    with open(path, encoding="utf-8") as f:
        for raw in f:
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            run, scenario, check = line.split()
            out.setdefault(run, {}).setdefault(scenario, set()).add(check)
    return out


def judge(checks, expected):
    """The verdict of a scored scenario given the check ids expected to fail: `verdict`
    when nothing is expected; "xfail" when every failing check is expected and every
    expected one failed; "stale" when an expected one did not fail."""
    v = verdict(checks)
    if not expected or checks is None:
        return v
    failing = {c.get("id") for c in checks if c.get("status") == "FAILURE"}
    if not expected <= failing:
        return "stale" if failing <= expected else "FAIL"
    return "xfail" if failing == expected else "FAIL"


def promote(name, scored, not_scored, promoted):
    """Moves the run's promoted scenarios from not_scored to scored."""
    wanted = promoted.get(name, [])
    by_name = {e["scenario"]: e for e in not_scored}
    for s in wanted:
        entry = by_name.get(s)
        if entry is None or entry.get("reason") != "extension":
            sys.exit(f"report.py: {name}: cannot promote {s}: not a not_scored extension scenario")
    return scored + wanted, [e for e in not_scored if e["scenario"] not in wanted]


def read_results(run_dir):
    """scenario -> list of checks (the newest result directory wins)."""
    out = {}
    if not os.path.isdir(run_dir):
        return out
    for name in sorted(os.listdir(run_dir)):
        m = DIR_RE.match(name)
        path = os.path.join(run_dir, name, "checks.json")
        if not m or not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8") as f:
                out[m.group(1)] = json.load(f)
        except (OSError, ValueError) as e:
            out[m.group(1)] = [{"id": "checks.json", "status": "FAILURE", "errorMessage": str(e)}]
    return out


def verdict(checks):
    """FAIL iff a check failed (the suite's rule); "skip" when nothing failed and
    nothing succeeded either (every check SKIPPED/INFO), so it is not mistaken for a
    pass in the table, though the suite does not count it as failing."""
    if checks is None:
        return "NO RESULT"
    statuses = [c.get("status") for c in checks]
    if "FAILURE" in statuses:
        return "FAIL"
    if "SUCCESS" not in statuses and "WARNING" not in statuses:
        return "skip"
    return "pass"


def ok(checks, expected=None):
    return judge(checks, expected) in ("pass", "skip")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requirements", required=True)
    ap.add_argument("--results", required=True)
    ap.add_argument("--promoted", help="RUN SCENARIO lines: extension scenarios scored for RUN")
    ap.add_argument("--expected", help="RUN SCENARIO CHECK lines: checks expected to fail")
    ap.add_argument("runs", nargs="+", help="NAME:REVISION")
    args = ap.parse_args()

    promoted = read_promoted(args.promoted)
    expected = read_expected(args.expected)
    runs = []
    for spec in args.runs:
        name, revision = spec.split(":", 1)
        scored, not_scored = read_requirements(os.path.join(args.requirements, f"{revision}.yaml"))
        scored, not_scored = promote(name, scored, not_scored, promoted)
        results = read_results(os.path.join(args.results, name))
        runs.append((name, revision, scored, not_scored, results))

    # One row per scenario, one column per run.
    rows = []
    for _, _, scored, not_scored, _ in runs:
        for s in scored + [e["scenario"] for e in not_scored]:
            if s not in rows:
                rows.append(s)
    width = max(len(r) for r in rows)
    header = f"{'scenario':<{width}}  " + "  ".join(f"{r[0]:<14}" for r in runs)
    print()
    print(header.rstrip())
    print("-" * len(header))
    for s in rows:
        cells = []
        for name, _, scored, not_scored, results in runs:
            ns = {e["scenario"]: e for e in not_scored}
            if s in scored:
                cells.append(judge(results.get(s), expected.get(name, {}).get(s)))
            elif s in ns:
                v = verdict(results.get(s))
                cells.append(f"({'not run' if v == 'NO RESULT' else v}, ns)")
            else:
                cells.append("-")
        print((f"{s:<{width}}  " + "  ".join(f"{c:<14}" for c in cells)).rstrip())
    print("(ns = not scored: run and reported, never counted; xfail = only checks listed")
    print(" as expected failures failed; stale = a listed check no longer fails)")

    total_pass = total_fail = total_xfail = 0
    stale = []
    for name, _, scored, _, _ in runs:
        for s in expected.get(name, {}):
            if s not in scored:
                stale.append(f"{name} {s}: listed as expected to fail but not scored in this run")
    total_fail += len(stale)
    print()
    print(f"{'run':<14} {'revision':<11} {'scored':>8}  not scored")
    for name, revision, scored, not_scored, results in runs:
        mine = expected.get(name, {})
        passed = sum(1 for s in scored if ok(results.get(s), mine.get(s)))
        xfail = sum(1 for s in scored if judge(results.get(s), mine.get(s)) == "xfail")
        for s in scored:
            if judge(results.get(s), mine.get(s)) == "stale":
                stale.append(f"{name} {s}: a check listed as expected to fail passed")
        total_pass += passed
        total_xfail += xfail
        total_fail += len(scored) - passed - xfail
        ns = ", ".join(
            f"{e['scenario']}={verdict(results.get(e['scenario'])) if e['scenario'] in results else 'not run'}"
            f" [{e.get('reason', '?')}]"
            for e in not_scored
        )
        shown = f"{passed:>3}/{len(scored):<4}" + (f" ({xfail} xfail)" if xfail else "")
        print(f"{name:<14} {revision:<11} {shown}  {ns}")

    failures = []
    for name, _, scored, not_scored, results in runs:
        for s in scored + [e["scenario"] for e in not_scored]:
            checks = results.get(s)
            if checks is None:
                if s in scored:
                    failures.append(f"{name} {s}: no result (the scenario did not run to completion)")
                continue
            mine = expected.get(name, {}).get(s, set())
            for c in checks:
                if c.get("status") == "FAILURE":
                    tag = "" if s in scored else " (not scored)"
                    if s in scored and c.get("id") in mine:
                        tag = " (expected)"
                    msg = (c.get("errorMessage") or c.get("description") or "").replace("\n", " ")
                    failures.append(f"{name} {s}{tag}: {c.get('id')}: {msg[:300]}")
    if failures:
        print()
        print("Failing checks:")
        for f in failures:
            print(f"  {f}")
    if stale:
        print()
        print("Stale expected failures (remove them from the list):")
        for f in stale:
            print(f"  {f}")
    if total_xfail:
        print()
        print(f"{total_xfail} scored scenarios failed only as expected (explained in RESULTS.md)")
    print()
    print(f"{total_pass} passed, {total_fail} failed")
    return 1 if total_fail else 0


if __name__ == "__main__":
    sys.exit(main())
