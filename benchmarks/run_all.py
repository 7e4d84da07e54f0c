"""`make bench`: every benchmark, one after the other, each printing its own tables."""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = ["bench_env.py", "bench_attacks_env.py", "differential.py", "bfcl_parity.py", "bench_diagnosis.py", "bench_train.py",
              "bench_eval.py", "bench_service.py", "bench_attacks_service.py", "bench_attacks_runs.py", "bench_report.py"]

if __name__ == "__main__":
    failed = []
    for script in BENCHMARKS:
        print(f"\n=== {script} ===", flush=True)
        if subprocess.run([sys.executable, str(HERE / script)]).returncode != 0:
            failed.append(script)
    if failed:
        print(f"failed: {', '.join(failed)}")
    sys.exit(1 if failed else 0)
