"""scripts/optimality_table.py renders the README's issue-15 table from the experiment's CSV."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "optimality_table.py"

COLS = ("network,budget_factor,policy,feasible,iteration_ms,compute_ms,time_over_compute,"
        "status,source,optimality_gap,schedule_gap,bound_ms,schedule_bound_ms,plan_s,over_optimal")
CSV = "\n".join([
    COLS,
    "vgg16_b32,1.05,optimal,True,101.0,100.0,1.01,cutoff,superneurons+polish,"
    "0.0,0.005,101.0,100.5,5.26,1.0",
    "vgg16_b32,1.05,superneurons,True,102.0,100.0,1.02,,,,,,,0.1,1.0099",
    "vgg16_b32,1.05,dtr,False,,100.0,,,,,,,,0.1,",
    "vgg16_b32,3.0,optimal,True,100.0,100.0,1.0,optimal: a heuristic plan runs at the compute "
    "bound,superneurons,0.0,0.0,100.0,100.0,0.01,1.0",
    "vgg16_b32,3.0,superneurons,True,100.0,100.0,1.0,,,,,,,0.01,1.0",
    "vgg16_b32,3.0,utp,True,104.0,100.0,1.04,,,,,,,0.01,1.04",
])


def test_two_budgets_render_as_the_readme_rows(tmp_path):
    csv = tmp_path / "optimality-gap.csv"
    csv.write_text(CSV + "\n")
    out = subprocess.run([sys.executable, str(SCRIPT), str(csv)], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert out[0].startswith("| trace | budget | `optimal`: time (plan) | status |")
    assert out[2:] == [
        "| vgg16 b32 | 1.05x | 1.0100 (superneurons+polish) | cutoff | 0.00% (1.0100) "
        "| 0.50% (1.0050) | 5.3 | 1.0099 | - | - | - | - |",
        "| vgg16 b32 | 3.00x | 1.0000 (superneurons) | at compute bound | 0.00% (1.0000) "
        "| 0.00% (1.0000) | 0.0 | 1.0000 | - | 1.0400 | - | - |",
    ]
