"""Run the adversarial pass: hostile inputs of seven classes, each outcome classified.

From the repository root::

    python -m tests.hostile.adversarial                  # every case, every batch
    python -m tests.hostile.adversarial --only files     # one class
    python -m tests.hostile.adversarial --case state-linear-s-negative
    python -m tests.hostile.adversarial --batch 3        # the cases of batch 3 only
    python -m tests.hostile.adversarial --list           # the cases, without running them

Every case runs in its own forked child under a memory limit (``--limit-gib``, default 6) in
its own temporary folder. The pass prints one row per case (id, class, outcome, message) and
the counts per class and outcome, and writes ``last_pass.json`` beside itself
(``last_pass_batch2.json`` with ``--batch 2``, ``last_pass_batch3.json`` with ``--batch 3``). It is
a measurement: the exit status is 0 whatever the outcomes.

Outcomes: ``clear`` (refused, one line naming the fault), ``unclear`` (refused, but the message
lacks the name, is a bare KeyError, several lines or a non-user exception), ``silent``
(accepted where it should be refused, or a wrong result), ``lost`` (a file that was there
changed or vanished), ``oom`` (allocation beyond the limit, or killed), ``ok`` (a valid edge
case accepted with a right result), ``refused-valid`` (a valid input refused) and ``timeout``
(the case hung).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
try:
    import lola  # noqa: F401
except ImportError:  # a checkout without the package installed
    sys.path.insert(0, str(HERE.parents[2] / "src"))

from .cases import BATCHES, CASES, problems  # noqa: E402
from .harness import CLASSES, OUTCOMES, Case, accept, classify  # noqa: E402
from .runner import GIB, check_limit_allows_imports, preload, run_cases  # noqa: E402


def select(batch: str = "all") -> list[Case]:
    """The cases of ``batch`` (a number of :data:`BATCHES` as a string, or "all"), after checking the case modules."""
    found = problems()
    if found:
        raise SystemExit("\n".join(found))
    return [c for c in CASES if batch == "all" or c.batch == int(batch)]


def _limit_probe() -> Case:
    """A case that must come out ``oom``: it allocates more than the limit allows (the harness's
    own check, of neither batch)."""

    def run(ctx):
        import torch

        return torch.empty(64 * GIB, dtype=torch.uint8).fill_(1).sum()

    return Case("limit-probe", "numbers", "allocate 64 GiB under the limit (the mechanism's own check)", run, accept())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--batch", choices=[*map(str, BATCHES), "all"], default="all", help="1: the first batch, 2: the second, 3: the third, all (default): every batch"
    )
    parser.add_argument("--only", choices=CLASSES, action="append", help="run this class only (repeatable)")
    parser.add_argument("--case", action="append", help="run the case with this id only (repeatable; a trailing * matches a prefix)")
    parser.add_argument("--jobs", type=int, default=2, help="cases run at once (default 2)")
    parser.add_argument("--limit-gib", type=float, default=6.0, help="address-space limit of each case, GiB (default 6)")
    parser.add_argument("--json", default=None, help="where to write the results (default here: last_pass.json; last_pass_batchN.json with --batch 2 or 3)")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    args = parser.parse_args(argv)

    cases = select(args.batch)
    if args.json is None:
        args.json = str(HERE / ("last_pass.json" if args.batch in ("all", "1") else f"last_pass_batch{args.batch}.json"))
    if args.only:
        cases = [c for c in cases if c.cls in args.only]
    if args.case:
        cases = [c for c in cases if any(c.id == p or (p.endswith("*") and c.id.startswith(p[:-1])) for p in args.case)]
    if args.list:
        for c in cases:
            print(f"{c.id:<44} {c.cls:<10} {c.what}")
        return 0
    if not cases:
        print("no case matches")
        return 0

    limit = int(args.limit_gib * GIB)
    t0 = time.time()
    imports_ok = check_limit_allows_imports(limit)
    preload()
    root = Path(tempfile.mkdtemp(prefix="lola-hostile-"))
    probe = run_cases([_limit_probe()], root / "probe", limit)["limit-probe"]
    probe_outcome = classify(_limit_probe(), probe)[0]
    print(f"memory limit {args.limit_gib:g} GiB per case: imports under it {imports_ok}; a 64 GiB allocation comes out {probe_outcome}\n")

    rows: list[dict] = []

    def report(case: Case, record: dict, seconds: float) -> None:
        outcome, why, message = classify(case, record)
        rows.append(
            dict(
                id=case.id,
                batch=case.batch,
                cls=case.cls,
                what=case.what,
                expect=case.expect.kind,
                outcome=outcome,
                why=why,
                message=message,
                seconds=round(seconds, 2),
            )
        )
        shown = why if outcome in ("silent", "lost", "timeout") else f"{why}: {message}" if why else message
        print(f"{case.id:<44} {case.cls:<10} {outcome:<13} {shown[:150]}", flush=True)

    print(f"{'case':<44} {'class':<10} {'outcome':<13} message")
    print("-" * 120)
    try:
        run_cases(cases, root / "cases", limit, jobs=max(1, args.jobs), report=report)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    order = {c.id: i for i, c in enumerate(cases)}
    rows.sort(key=lambda r: order[r["id"]])
    counts = {cls: {o: 0 for o in OUTCOMES} for cls in CLASSES}
    for r in rows:
        counts[r["cls"]][r["outcome"]] += 1
    used = [o for o in OUTCOMES if any(counts[c][o] for c in CLASSES)]
    print(f"\n{len(rows)} cases in {time.time() - t0:.0f} s\n")
    print(f"{'class':<12}" + "".join(f"{o:>14}" for o in used) + f"{'total':>8}")
    for cls in CLASSES:
        n = sum(counts[cls].values())
        if n:
            print(f"{cls:<12}" + "".join(f"{counts[cls][o]:>14}" for o in used) + f"{n:>8}")
    print(f"{'all':<12}" + "".join(f"{sum(counts[c][o] for c in CLASSES):>14}" for o in used) + f"{len(rows):>8}")

    payload = {
        "cases": rows,
        "counts": {c: {o: n for o, n in counts[c].items() if n} for c in CLASSES if any(counts[c].values())},
        "batch": args.batch,
        "limit_gib": args.limit_gib,
        "limit_check": {"imports": imports_ok, "probe": probe_outcome},
        "seconds": round(time.time() - t0, 1),
        "python": platform.python_version(),
    }
    Path(args.json).write_text(json.dumps(payload, indent=1) + "\n")
    print(f"\nwritten: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
