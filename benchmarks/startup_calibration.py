"""How long the daemon's start-up calibration takes, and how well its fit predicts held-out steps,
against the full `autotuned-serve calibrate` fit shipped in configs/ (the daemon runs this where no
cost model describes its model, dtype and machine; simulation/startup_cost_model.py), within its
budget (simulation/budgeted_calibration.py).

    python benchmarks/startup_calibration.py [--model PATH] [--dtype fp32] [--budget-s 60]
"""

from __future__ import annotations

import argparse
import json
import logging
import time

from simulation.budgeted_calibration import DEFAULT_BUDGET_S, calibrate_within
from simulation.cost_model_files import SHIPPED_COST_MODEL
from simulation.startup_cost_model import START_UP_LIVE_REQUESTS, START_UP_POINTS
from engine import EngineConfig, LLMEngine
from simulation.cost_model import CostModel
from simulation.machine import machine_fingerprint


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="default: the bundled SmolLM2")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S, help="the daemon's calibration_budget_s")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    engine = LLMEngine(EngineConfig(model=args.model, dtype=args.dtype))
    start = time.monotonic()
    model = calibrate_within(engine, args.budget_s, START_UP_POINTS, START_UP_LIVE_REQUESTS)
    seconds = time.monotonic() - start
    shipped = CostModel.load(SHIPPED_COST_MODEL)
    print(json.dumps({"machine": machine_fingerprint(engine.config.device), "model": model.model,
                      "dtype": model.dtype, "budget_s": args.budget_s, "calibration_s": round(seconds, 1),
                      "grid_points": int(model.notes["grid_points"]), "live_steps": int(model.notes["live_steps"]),
                      "kernel_max_rows": model.kernel_max_rows, "num_samples": model.num_samples,
                      "holdout_mape": model.holdout_mape, "shipped_holdout_mape": shipped.holdout_mape,
                      "coefficients": model.coefficients}, indent=2))


if __name__ == "__main__":
    main()
