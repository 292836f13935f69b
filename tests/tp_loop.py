"""The tensor-parallel shutdown soak: runs the 2-process TP worker (tests/tp_worker.py, the same
run test_tp.py checks once) many times in a row while a busy loop keeps another core loaded, and
counts the runs that fail. A rank that aborts at exit ("terminate called without an active
exception") shows up here as a failed run with its stderr kept.

    PYTHONPATH=python:tests python tests/tp_loop.py --runs 50 --out tp_loop.json
"""

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def busy(stop) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10000))


def main() -> int:
    from test_tp import torchrun
    from tiny_models import make_trained_pair

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--busy-cores", type=int, default=1, help="busy-loop processes running alongside")
    parser.add_argument("--out", default="tp_loop.json")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as work:
        make_trained_pair(work, layers=4)
        stop = multiprocessing.Event()
        loaders = [multiprocessing.Process(target=busy, args=(stop,), daemon=True) for _ in range(args.busy_cores)]
        for p in loaders:
            p.start()
        runs = []
        try:
            for i in range(args.runs):
                out = os.path.join(work, f"run{i}")
                os.makedirs(out)
                started = time.time()
                run = torchrun([os.path.join(HERE, "tp_worker.py"), out, os.path.join(work, "target"),
                                os.path.join(work, "draft"), "ok"], timeout=600)
                ok = run.returncode == 0 and all(os.path.exists(os.path.join(out, f"rank{r}.json")) for r in (0, 1))
                runs.append({"run": i, "returncode": run.returncode, "ok": ok,
                             "seconds": round(time.time() - started, 1),
                             "stderr_tail": "" if ok else run.stderr[-3000:]})
                print(f"run {i + 1}/{args.runs}: {'ok' if ok else 'FAILED rc %d' % run.returncode} "
                      f"({runs[-1]['seconds']} s)", flush=True)
        finally:
            stop.set()
            for p in loaders:
                p.join(timeout=10)
    failures = sum(not r["ok"] for r in runs)
    with open(args.out, "w") as f:
        json.dump({"runs": len(runs), "failures": failures, "busy_cores": args.busy_cores, "details": runs}, f,
                  indent=2)
    print(f"{len(runs)} runs, {failures} failed; details in {args.out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
