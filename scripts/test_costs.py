"""Per-module CPU cost of a test run, for the dispatch order in tests/module_costs.tsv.

    MIMESIS_TEST_RSS_LOG=/tmp/rss python -m pytest        # one row per test and worker (tests/conftest.py)
    python scripts/test_costs.py /tmp/rss > tests/module_costs.tsv
    python scripts/test_costs.py /tmp/rss --tests 30       # the 30 dearest tests instead

A test's cost is the difference between consecutive rows of its worker's file (cumulative user + sys CPU seconds of
the worker and its waited-for children); CPU seconds, unlike wall time, barely move when the machine is shared.
"""

import argparse
import collections
import glob
import os
import sys


def costs(log_dir: str):
    """(per-module CPU seconds, [(cpu seconds, nodeid)]) over every worker file in ``log_dir``."""
    files = sorted(glob.glob(os.path.join(log_dir, "*.tsv")))
    if not files:
        raise SystemExit(f"test_costs: no *.tsv rows in {log_dir} (run pytest with MIMESIS_TEST_RSS_LOG={log_dir})")
    per_module, per_test = collections.Counter(), []
    for path in files:
        before = 0.0
        with open(path) as f:
            for n, line in enumerate(f, 1):
                fields = line.rstrip("\n").split("\t")
                if len(fields) != 5:
                    raise SystemExit(f"test_costs: {path}:{n}: expected 5 tab-separated fields, got {len(fields)}")
                nodeid, cpu = fields[0], float(fields[4])
                # a worker's counter restarts when a later run appends to the same file
                cost, before = (cpu - before if cpu >= before else cpu), cpu
                per_module[nodeid.split("::")[0]] += cost
                per_test.append((cost, nodeid))
    return per_module, per_test


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log_dir")
    ap.add_argument("--tests", type=int, default=0, help="print the N dearest tests instead of the module table")
    args = ap.parse_args(argv)
    per_module, per_test = costs(args.log_dir)
    if args.tests:
        for cost, nodeid in sorted(per_test, reverse=True)[:args.tests]:
            print(f"{cost:8.1f}  {nodeid}")
        return
    print(f"# module\tCPU seconds (total {sum(per_module.values()):.0f}; scripts/test_costs.py)")
    for module, cost in per_module.most_common():
        print(f"{module}\t{cost:.1f}")


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:  # piped into head: the reader has what it wanted
        sys.stderr.close()
