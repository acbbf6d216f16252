"""The same online paths at two revisions of the code, side by side in one run (issue 16): what a change to the
Python side did, where ``bench/online_kernels.py --parts source`` swaps only the compiled kernels.

Two long-lived worker processes, one importing ``aheadrank`` from a checkout of ``--old`` (``git archive`` into
a temporary folder), one from the working tree (or ``--new``), each build the same rankers (``bench/online_kernels.py``:
``make_ranker``, seed 0) and inputs once; then, round after round, each is asked in turn to time one query
(``run_query``: the query side, then the candidates in chunks) on every case, so a busy machine slows both
alike. The rankers' score heads read the interaction (``benchkit.score_head_reads_interaction``: a ranker with the
similarity residual starts with a zero head, whose scores would compare the residual alone). Reported per case: min and median ms of each revision, old / new, and the largest difference between
their scores relative to the largest score (the two revisions' rankers must compute the same function; a
change that moves scores beyond float32 rounding shows here). Prints a table, writes JSON.

    python bench/revisions.py --old 39108db --rankers prettr-l5-e128 mores-1ib-s2 --d 128 493 --n 300
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchkit import machine_info, write_record

REPO = Path(__file__).resolve().parents[1]
SETTLE_S = 0.25  # between one worker's run and the other's: OpenMP threads spin a while after their last loop

# The worker: imports aheadrank from the tree it is given, builds every case, then times on request.
WORKER = r"""
import json, sys, time
tree = sys.argv[1]
sys.path.insert(0, sys.argv[2])  # the package folder built for this tree
sys.path.append(tree + "/bench")  # after site-packages: a bench module never stands in for an installed one
import torch
torch.set_num_threads(int(sys.argv[3]))
try:
    from online_kernels import inputs, make_ranker, run_query
except ModuleNotFoundError:  # a revision from before bench/kernels.py was renamed: loaded under the new name
    import importlib.util
    found = importlib.util.spec_from_file_location("online_kernels", tree + "/bench/kernels.py")
    online_kernels = importlib.util.module_from_spec(found)
    sys.modules["online_kernels"] = online_kernels
    found.loader.exec_module(online_kernels)
    inputs, make_ranker, run_query = online_kernels.inputs, online_kernels.make_ranker, online_kernels.run_query
import os.path
import aheadrank.rankers
if not os.path.realpath(aheadrank.rankers.__file__).startswith(os.path.realpath(tree) + "/"):
    raise SystemExit(f"aheadrank.rankers came from {aheadrank.rankers.__file__}, not from {tree}")
try:
    from benchkit import score_head_reads_interaction as reads_interaction
except ImportError:
    try:  # a revision whose benchkit was inside the package
        from aheadrank.benchkit import score_head_reads_interaction as reads_interaction
    except ImportError:  # a revision from before it
        reads_interaction = None
spec = json.loads(sys.argv[4])
cases = {}
with torch.inference_mode():
    for name in spec["rankers"]:
        for d in spec["d"]:
            ranker = make_ranker(name, d)
            if reads_interaction is not None:  # a zero score head (sim) would leave the interaction unread
                reads_interaction(ranker)
            q, fields, mask = inputs(ranker, spec["n"], d)
            cases[f"{name} d={d}"] = (ranker, q, fields, mask)
    print(json.dumps({"ready": list(cases)}), flush=True)
    for line in sys.stdin:
        key, repeats = json.loads(line)
        ranker, q, fields, mask = cases[key]
        run_query(ranker, q, fields, mask, spec["chunk"])
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            scores = run_query(ranker, q, fields, mask, spec["chunk"])
            best = min(best, time.perf_counter() - t0)
        print(json.dumps({"ms": best * 1e3, "scores": scores.tolist()}), flush=True)
"""


def package_folder(tree: Path, into: Path) -> Path:
    """A folder holding ``aheadrank`` laid out as pyproject.toml's package-dir maps it (``aheadrank.rankers`` =
    ``rankers/`` ...), by symbolic links into ``tree``: put first on sys.path, it shadows the editable install."""
    import tomllib

    mapping = tomllib.loads((tree / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    root = into / "aheadrank"
    root.mkdir(parents=True)
    for entry in (tree / mapping["aheadrank"]).iterdir():
        (root / entry.name).symlink_to(entry)
    for package, folder in mapping.items():
        if package != "aheadrank":
            (root / package.split(".", 1)[1]).symlink_to(tree / folder)
    return into


def checkout(rev: str, into: Path) -> Path:
    """``rev``'s tracked files in ``into`` (git archive: no worktree bookkeeping left behind)."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


class Worker:
    def __init__(self, tree: Path, packages: Path, threads: int, spec: dict):
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(tree), str(packages), str(threads), json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def ready(self) -> list[str]:
        return json.loads(self.read())["ready"]

    def read(self) -> str:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"a worker ended (exit status {self.proc.wait()}): see its stderr above")
        return line

    def time(self, key: str, repeats: int) -> dict:
        self.proc.stdin.write(json.dumps([key, repeats]) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.read())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def rel_diff(a: list, b: list) -> float:
    top = max(max(abs(x) for x in b), 1e-12)
    return max(abs(x - y) for x, y in zip(a, b, strict=True)) / top


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--old", default="HEAD", help="the revision to compare against (default HEAD)")
    p.add_argument("--new", default=None, help="a revision instead of the working tree")
    p.add_argument("--rankers", nargs="+", default=["prettr-l5-e128"])
    p.add_argument("--d", nargs="+", type=int, default=[128])
    p.add_argument("--n", type=int, default=300)
    p.add_argument("--chunk", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--repeats", type=int, default=3, help="runs per turn (the turn's min is kept)")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "revisions.json")
    args = p.parse_args(argv)
    spec = {"rankers": args.rankers, "d": args.d, "n": args.n, "chunk": args.chunk}
    started = time.perf_counter()
    machine = machine_info(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        old_tree = checkout(args.old, tmp_path / "old")
        new_tree = checkout(args.new, tmp_path / "new") if args.new else REPO
        workers = {
            "old": Worker(old_tree, package_folder(old_tree, tmp_path / "old-pkg"), args.threads, spec),
            "new": Worker(new_tree, package_folder(new_tree, tmp_path / "new-pkg"), args.threads, spec),
        }
        try:
            keys = workers["old"].ready()
            if workers["new"].ready() != keys:
                raise RuntimeError("the two revisions built different cases")
            times: dict[str, dict[str, list[float]]] = {k: {"old": [], "new": []} for k in keys}
            diffs: dict[str, float] = {}
            for r in range(args.rounds):
                for key in keys:
                    got = {}
                    for side in ("old", "new") if r % 2 == 0 else ("new", "old"):
                        time.sleep(SETTLE_S)
                        got[side] = workers[side].time(key, args.repeats)
                        times[key][side].append(got[side]["ms"])
                    diffs[key] = max(
                        diffs.get(key, 0.0), rel_diff(got["new"]["scores"], got["old"]["scores"])
                    )
                print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        finally:
            for w in workers.values():
                w.close()
    rows = []
    for key in keys:
        t = times[key]
        old_min, new_min = min(t["old"]), min(t["new"])
        rows.append(
            {
                "case": key,
                "old_ms_min": old_min,
                "new_ms_min": new_min,
                "old_ms_median": sorted(t["old"])[len(t["old"]) // 2],
                "new_ms_median": sorted(t["new"])[len(t["new"]) // 2],
                "speedup_min": old_min / new_min,
                "max_rel_score_diff": diffs[key],
            }
        )
    head = git_rev(args.new or "HEAD")
    report = write_record(
        args.out,
        "revisions",
        argv,
        machine,
        started,
        old=git_rev(args.old),
        new=args.new and head or f"working tree on {head}",
        n=args.n,
        rounds=args.rounds,
        repeats=args.repeats,
        rows=rows,
    )
    print(f"{'case':28s} {'old ms':>8s} {'new ms':>8s} {'old/new':>8s} {'score diff':>11s}")
    for r in rows:
        print(
            f"{r['case']:28s} {r['old_ms_min']:8.1f} {r['new_ms_min']:8.1f} {r['speedup_min']:7.2f}x "
            f"{r['max_rel_score_diff']:11.1e}"
        )
    print(f"wrote {args.out}")
    return report


def git_rev(rev: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", rev], capture_output=True, text=True, check=True
    ).stdout.strip()


if __name__ == "__main__":
    main()
