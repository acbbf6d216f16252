"""``aheadrank evaluate``: trec_eval-style measures of a run, and a paired comparison of two runs."""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path

import typer

from aheadrank.cli.app import app
from aheadrank.cli.options import env, opt, user_errors
from aheadrank.errors import AheadrankError
from aheadrank.fsfaults import atomic_write_text

_DEFAULT_METRICS = "nDCG@10,MRR@10,R@100,MAP,P@10"
_DEFAULT_MARGINS = "0.02,0.05"


def _split_list(text: str) -> list[str]:
    return [item for item in re.split(r"[,\s]+", text) if item]


def _margins(text: str) -> list[float]:
    try:
        return [float(item.rstrip("%")) / (100 if item.endswith("%") else 1) for item in _split_list(text)]
    except ValueError:
        raise AheadrankError(f"--margins {text!r}: expected numbers such as 0.02,0.05 (or 2%,5%)") from None


def _fmt(value: float, digits: int = 4) -> str:
    return "-" if value != value else f"{value:.{digits}f}"  # NaN -> "-"


def _p(value: float) -> str:
    if value != value:
        return "-"
    return f"{value:.2e}" if value < 1e-3 else f"{value:.3f}"


def _coverage_line(label: str, path: Path, cov) -> str:
    parts = [f"{cov.evaluated} queries evaluated", f"{cov.missing} missing from the run (score 0)"]
    if cov.no_relevant:
        parts.append(f"{cov.no_relevant} without a relevant document (skipped)")
    if cov.unjudged:
        parts.append(f"{cov.unjudged} unjudged run queries (ignored)")
    if cov.judged_at_10 is not None:
        parts.append(f"judged@10 {cov.judged_at_10:.1%}")
    line = f"{label} {path}: " + ", ".join(parts)
    if cov.judged_at_10 == 0:
        line += (
            f"\nwarning: no document in the run's top 10 of its {cov.retrieved} judged queries is in the qrels: "
            "are they the qrels of the run's collection (query ids can match by chance)?"
        )
    return line


@app.command("evaluate")
@user_errors
def evaluate_cmd(
    run: Path = opt(..., "--run", help="TREC run file (A: the baseline)."),
    qrels: Path = opt(
        ...,
        "--qrels",
        help="Qrels: TREC 'qid 0 docid rel', BEIR TSV 'query-id corpus-id score', or a BEIR directory.",
    ),
    split: str = typer.Option(
        "test", "--split", envvar=env("qrels-split"), help="With a BEIR directory: read qrels/<split>.tsv."
    ),
    compare: Path | None = opt(None, "--compare", help="Second TREC run (B: the candidate) compared to A."),
    metrics: str = opt(
        _DEFAULT_METRICS,
        "--metrics",
        help="Comma-separated: nDCG@k, MRR@k, R@k, P@k, MAP, MAP@k, nDCG, MRR (or trec_eval names).",
    ),
    margins: str = opt(
        _DEFAULT_MARGINS,
        "--margins",
        help="Non-inferiority margins, fractions of A's mean (0.02 or 2%).",
    ),
    alpha: float = opt(0.05, "--alpha", help="Significance level."),
    json_out: Path | None = opt(
        None,
        "--json",
        envvar="AHEADRANK_JSON_OUT",  # store-info's AHEADRANK_JSON is a switch
        help="Also write means, per-query values and tests as JSON.",
    ),
) -> None:
    """Print nDCG@10, MRR@10, R@100, MAP and P@10 of a run (trec_eval conventions); with --compare, the
    paired t-test and the MORES non-inferiority tests (B vs A at each margin) per metric."""
    from rich.console import Console
    from rich.table import Table

    from aheadrank.evaluation import POWER, coverage, paired_test, parse_metric, per_query, read_run
    from aheadrank.indexer.topics import qrels_path, read_qrels

    if json_out is not None:  # before anything is read: the JSON never lands on an input
        inputs = [p for p in (run, qrels_path(qrels, split), compare) if p is not None]
        if any(json_out.exists() and p.exists() and json_out.resolve() == p.resolve() for p in inputs):
            raise AheadrankError(
                f"--json {json_out} is one of the inputs (--run, --qrels or --compare): give another file"
            )
    names = _split_list(metrics)
    if not names:
        raise AheadrankError("--metrics is empty")
    for name in names:
        parse_metric(name)
    margin_list = _margins(margins) if compare is not None else []

    judged = read_qrels(qrels, split)
    runs = {"A": (run, read_run(run))}
    if compare is not None:
        runs["B"] = (compare, read_run(compare))
    covs = {}
    for label, (path, data) in runs.items():
        covs[label] = coverage(data, judged)
        if covs[label].evaluated and not covs[label].retrieved:
            sample = ", ".join(sorted(data)[:3]) or "none"
            raise AheadrankError(
                f"run {path} has no query with judgements in {qrels} (its query ids: {sample}); "
                "wrong qrels file or split?"
            )
    values = {label: per_query(data, judged, names) for label, (_, data) in runs.items()}

    console = Console(width=max(Console().width, 140))
    for label, (path, _) in runs.items():
        console.print(_coverage_line(label, path, covs[label]), highlight=False, soft_wrap=True)

    result: dict = {"qrels": str(qrels), "run": str(run), "coverage": asdict(covs["A"])}
    means = {label: {n: sum(v[n].values()) / len(v[n]) for n in names} for label, v in values.items()}
    result.update(metrics=means["A"], per_query=values["A"])

    if compare is None:
        table = Table("metric", "value", title=f"{run.name}")
        for name in names:
            table.add_row(name, _fmt(means["A"][name]))
        console.print(table)
    else:
        tests = {
            n: paired_test(values["A"][n], values["B"][n], metric=n, margins=margin_list, alpha=alpha)
            for n in names
        }
        table = Table(
            "metric",
            "A",
            "B",
            "B−A",
            f"{(1 - alpha) * 100:g}% CI",
            "detects",
            "B/A",
            "t-test p",
            *(f"NI {m * 100:g}%" for m in margin_list),
            title=f"A = {run.name} (baseline), B = {compare.name} (candidate), {tests[names[0]].n} queries",
            caption=(
                f"t-test: two-sided paired; CI: its interval of B − A; detects: the |B − A| it finds "
                f"{POWER:.0%} of the time over these queries. NI δ: non-inferiority, one-sided paired t-test of "
                f"B − (1−δ)·A > 0; 'yes' when p < {alpha:g}."
            ),
        )
        for name, test in tests.items():
            table.add_row(
                name,
                _fmt(test.mean_a),
                _fmt(test.mean_b),
                f"{test.mean_diff:+.4f}",
                f"[{test.ci_low:+.4f}, {test.ci_high:+.4f}]" if test.n > 1 else "",
                _fmt(test.detectable),
                _fmt(test.ratio, 3),
                _p(test.p) + (" *" if test.significant else ""),
                *(f"{'yes' if ni.non_inferior else 'no'} (p={_p(ni.p)})" for ni in test.non_inferiority),
            )
        console.print(table)
        result["compare"] = {
            "run": str(compare),
            "coverage": asdict(covs["B"]),
            "metrics": means["B"],
            "per_query": values["B"],
            "paired": {name: test.to_dict() for name, test in tests.items()},
        }

    if json_out is not None:
        try:
            json_out.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(json_out, json.dumps(result, indent=2) + "\n")
        except OSError as exc:
            raise AheadrankError(f"cannot write {json_out}: {exc.strerror or exc}") from None
        console.print(f"wrote {json_out}", highlight=False)
