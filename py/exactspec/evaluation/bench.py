"""`exactspec bench`: run (or resume) the preregistered evaluation, pack its raw records, then write
its report, plots and, with --doc, the generated section of docs/evaluation.md."""
from __future__ import annotations

import json
import os
import time

from ..core.errors import E_BAD_ARGUMENT, ExactSpecError
from ..host.safe_files import copy_file, write_file
from ..host.server import REPO_ROOT
from .report import raw_path, report_markdown, write_report, write_report_from_raw
from .runner import check_args, run_bench

DOC_PATH = os.path.join("docs", "evaluation.md")
MARKER = "<!-- written by `exactspec bench --doc`: everything below this line -->"


def with_section(doc: str, section: str) -> str:
    """doc up to MARKER (the hand-written part), then MARKER and section."""
    return doc.split(MARKER, 1)[0].rstrip("\n") + "\n\n" + MARKER + "\n\n" + section.strip() + "\n"


def cmd_bench(args) -> int:
    check_args(args)
    args.run = args.run or time.strftime("%Y%m%d-%H%M", time.gmtime())
    run_dir = os.path.join(REPO_ROOT, "build", "eval", args.run)
    if not args.report_only:
        run_dir = run_bench(args)
    # the raw per-request records (gzip JSONL) from which the report is written: committed under
    # docs/evaluation/<run>/ for a full run; a --quick run (the harness's smoke) keeps it in build/
    run_json = os.path.join(run_dir, "run.json")
    if os.path.exists(run_json):
        with open(run_json) as f:
            quick = json.load(f)["plan"].get("quick")
        raw = os.path.join(run_dir, "raw.jsonl.gz") if quick else raw_path(args.run)
        res = write_report(run_dir, raw=raw)           # packs the checkpoints into the raw file, reports from it
    elif os.path.exists(raw_path(args.run)):            # a clone: only the committed raw file
        res = write_report_from_raw(raw_path(args.run), run_dir)
    else:
        raise ExactSpecError(E_BAD_ARGUMENT, f"--run {args.run}: no such run (neither build/eval/{args.run}/run.json "
                             f"nor docs/evaluation/{args.run}/raw.jsonl.gz)")
    print(f"bench {args.run}: {os.path.join(run_dir, 'report.md')}")
    for backend, verdict in res["conclusions"].items():
        print(f"  {backend}: {verdict}")
    if args.doc:
        path = os.path.join(REPO_ROOT, DOC_PATH)
        with open(path) as f:
            doc = f.read()
        plots_dir = os.path.join(REPO_ROOT, "docs", "evaluation", args.run)
        os.makedirs(plots_dir, exist_ok=True)
        for png, _svg in res.get("plots", {}).values():   # the SVGs stay in build/eval/<run>/plots
            copy_file(png, os.path.join(plots_dir, os.path.basename(png)))
        section = report_markdown(res, plots_rel=f"evaluation/{args.run}").replace("# Evaluation run", "## Latest run", 1)
        write_file(path, with_section(doc, section))
    return 0
