"""The doctor's fault matrix on a shipped pair: ``eagle3 doctor`` on the healthy draft and on a
copy with each planted fault of ``eagle3_ext.doctor.faults``, one table row per run.

    python benchmarks/doctor_matrix.py [--pair smollm2] [--faults "shifted capture" ...] [--out DIR]

Each row: the planted fault, the verdict and the evidence it rests on, the setup the doctor
recommends, the measured acceptance of the configured setup (and of the best candidate when it
differs) and the run's seconds. The planted copies are written under ``--out`` (a temporary
folder by default); ``--json`` also writes every report in full.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from eagle3_ext.doctor import diagnose
from eagle3_ext.doctor.faults import FAULTS, plant
from eagle3_ext.models import pair


def _evidence(report) -> str:
    """Which kinds of check the verdict rests on: static, fingerprint, measured."""
    kinds = []
    for finding in report.findings:
        if finding.status != "fault":
            continue
        kind = ("fingerprint" if finding.check == "activation fingerprint"
                else "measured" if finding.check.startswith("setup") else "static")
        if kind not in kinds:
            kinds.append(kind)
    return ", ".join(kinds) or "-"


def _recommended(report) -> str:
    if report.recommended_config:
        return json.dumps(report.recommended_config)
    if report.recommended_aux_layer_ids is not None:
        return str(report.recommended_aux_layer_ids)
    return "-"


def _acceptance(report) -> str:
    parts = [f"{name}: {result['acceptance_length']:.2f}" for name, result in (report.acceptance or {}).items()
             if isinstance(result, dict) and "acceptance_length" in result]
    return ", ".join(parts) or "-"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pair", default="smollm2", choices=("toy", "smollm2"))
    parser.add_argument("--faults", nargs="+", default=list(FAULTS), choices=list(FAULTS))
    parser.add_argument("--out", default=None, help="folder of the planted copies (default: a temporary one)")
    parser.add_argument("--json", action="store_true", help="also write matrix.json with every report under --out")
    args = parser.parse_args(argv)
    target_dir, draft_dir = pair(args.pair)
    out = args.out or tempfile.mkdtemp(prefix="doctor_matrix_")
    rows, reports = [], {}
    for fault in [None] + args.faults:
        folder = os.path.join(out, (fault or "").replace(" ", "_").replace(",", ""))
        draft = draft_dir if fault is None else plant(draft_dir, folder, fault)
        started = time.perf_counter()
        report = diagnose(target_dir, draft)
        seconds = time.perf_counter() - started
        verdict = report.verdict.split(":")[0].split(" (")[0]
        rows.append(f"| {fault or 'none'} | {verdict} ({_evidence(report)}) | {_recommended(report)} | "
                    f"{_acceptance(report)} | {seconds:.0f} |")
        reports[fault or "none"] = {"verdict": report.verdict, "recommended_config": report.recommended_config,
                                    "recommended_aux_layer_ids": report.recommended_aux_layer_ids,
                                    "acceptance": report.acceptance, "seconds": seconds}
        print(rows[-1], file=sys.stderr, flush=True)
    print(f"{args.pair}: target {target_dir}, draft {draft_dir}\n")
    print("| planted fault | verdict (evidence) | recommended | acceptance length | seconds |")
    print("| --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    if args.json:
        with open(os.path.join(out, "matrix.json"), "w") as f:
            json.dump(reports, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
