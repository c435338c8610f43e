"""Runs the multi-rank suites N times, optionally beside a CPU load, and lists every test that
failed at least once, with its failure. `./dev.sh flakes N [--load] [...]` runs it.

    ./dev.sh flakes 5 --load                      # everything multi-rank, 5 rounds, cores 2x busy
    ./dev.sh flakes 5 --load --pytest-k fault --ctest-regex 'fault|failure'   # the fault tests only

A test that fails in one round out of N fails by chance: CI would have gone red on it once in N
runs. The load (one busy process per core, beside the tests' own ranks, which already fill the
cores) stretches every schedule the way a busy CI machine does: a test that passes only when its
ranks run promptly shows here.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The ctest tests that start ranks (everything but the single-process unit, package and
# configure checks, and the GPU tests, which skip here).
DEFAULT_CTEST_REGEX = "dist_|wrapper_|faults|shardrun|checkpoint_across|demo_unet|arena"
# pytest files that need no GPU; test_docs.py runs every docs block on ranks too.
DEFAULT_PYTEST_PATHS = ["tests/python"]


def _spin() -> None:
    while True:
        pass


def start_load(per_core: int) -> list[multiprocessing.Process]:
    """per_core busy processes per core, at the tests' own priority."""
    procs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(per_core * (os.cpu_count() or 1))]
    for p in procs:
        p.start()
    return procs


def run_ctest(build_dir: str, regex: str, log_path: str) -> dict[str, str]:
    """Failed test name -> its output, for one ctest round."""
    with open(log_path, "w") as log:
        subprocess.run(["ctest", "--test-dir", build_dir, "-R", regex, "-LE", "subset", "--output-on-failure",
                        "--timeout", "900", "-j", os.environ.get("CTEST_JOBS", "4")], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, check=False)
    text = open(log_path, errors="replace").read()
    failed = re.findall(r"^\s*\d+ - (\S+) \((?:Failed|Timeout|SEGFAULT|Exception|Child aborted|Subprocess aborted)", text, re.M)
    failures = {}
    for name in failed:
        # --output-on-failure prints the test's output right after its "Test #k: name ...***Failed" line.
        match = re.search(rf"Test\s+#\d+: {re.escape(name)} \.+.*?\n(.*?)(?=\n\s*\d+/\d+ Test\s+#|\n\d+% tests passed)", text, re.S)
        failures[f"ctest {name}"] = (match.group(1) if match else "(see " + log_path + ")")[-3000:]
    return failures


def run_pytest(python: str, paths: list[str], k: str | None, log_path: str, xml_path: str) -> dict[str, str]:
    """Failed test id -> its failure text, for one pytest round."""
    cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml_path}", *paths,
           "--ignore=tests/python/test_cuda.py"]
    if k:
        cmd += ["-k", k]
    with open(log_path, "w") as log:
        code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, check=False).returncode
    failures = {}
    try:
        root = ET.parse(xml_path).getroot()
    except (ET.ParseError, FileNotFoundError):
        return {"pytest (no report)": f"exit {code}; see {log_path}"}
    for case in root.iter("testcase"):
        for bad in list(case.iter("failure")) + list(case.iter("error")):
            name = f"pytest {case.get('classname')}::{case.get('name')}"
            failures[name] = ((bad.get("message") or "") + "\n" + (bad.text or ""))[-3000:]
    if code not in (0, 1) and not failures:  # collection errors, an interrupted run
        failures["pytest (run)"] = f"exit {code}; see {log_path}"
    return failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rounds", type=int, help="how many times to run the suites")
    parser.add_argument("--load", action="store_true", help="one busy process per core beside the tests")
    parser.add_argument("--build-dir", default="build-torch2")
    parser.add_argument("--python", default=os.path.join(ROOT, ".venv", "bin", "python"))
    parser.add_argument("--ctest-regex", default=DEFAULT_CTEST_REGEX, help="which ctest tests ('' for none)")
    parser.add_argument("--pytest-k", default=None, help="pytest -k expression for the pytest part")
    parser.add_argument("--no-pytest", action="store_true")
    parser.add_argument("--out", default=os.path.join(ROOT, "out", "flakes"), help="where each round's logs go")
    args = parser.parse_args()

    os.makedirs(args.out, exist_ok=True)
    load = start_load(1) if args.load else []
    seen: dict[str, list[tuple[int, str]]] = defaultdict(list)
    started = time.monotonic()
    try:
        for r in range(1, args.rounds + 1):
            round_failures = {}
            if args.ctest_regex:
                round_failures.update(run_ctest(args.build_dir, args.ctest_regex, f"{args.out}/ctest_{r}.log"))
            if not args.no_pytest:
                round_failures.update(run_pytest(args.python, DEFAULT_PYTEST_PATHS, args.pytest_k,
                                                 f"{args.out}/pytest_{r}.log", f"{args.out}/pytest_{r}.xml"))
            for name, text in round_failures.items():
                seen[name].append((r, text))
            print(f"flakes: round {r}/{args.rounds} done after {time.monotonic() - started:.0f} s: "
                  f"{len(round_failures)} failed", flush=True)
    finally:
        for p in load:
            p.kill()
    print(f"\nflakes: {args.rounds} rounds, load {'on (1 busy process per core)' if args.load else 'off'}, "
          f"{time.monotonic() - started:.0f} s, logs in {args.out}")
    if not seen:
        print("flakes: no test failed")
        return 0
    for name, hits in sorted(seen.items()):
        rounds = ", ".join(str(r) for r, _ in hits)
        print(f"\n=== {name}: failed in {len(hits)} of {args.rounds} rounds ({rounds}) ===\n{hits[0][1]}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
