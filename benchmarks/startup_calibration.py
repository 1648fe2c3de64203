"""How long the daemon's start-up calibration takes, and how well its fit predicts held-out steps,
against the full `autotuned-serve calibrate` fit shipped in configs/ (the daemon runs this where no
cost model describes its model, dtype and machine; simulation/startup_cost_model.py).

    python benchmarks/startup_calibration.py [--model PATH] [--dtype fp32]
"""

from __future__ import annotations

import argparse
import json
import time

from simulation.calibrate import calibrate
from simulation.cost_model_files import SHIPPED_COST_MODEL
from simulation.startup_cost_model import START_UP_GRID_S, START_UP_LIVE_REQUESTS, START_UP_POINTS
from engine import EngineConfig, LLMEngine
from simulation.cost_model import CostModel
from simulation.machine import machine_fingerprint


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="default: the bundled SmolLM2")
    p.add_argument("--dtype", default="auto")
    args = p.parse_args()
    engine = LLMEngine(EngineConfig(model=args.model, dtype=args.dtype))
    start = time.monotonic()
    model = calibrate(engine, START_UP_POINTS, repeats=1, holdout_fraction=0.2, live_requests=START_UP_LIVE_REQUESTS,
                      time_limit_s=START_UP_GRID_S, retakes=0)
    seconds = time.monotonic() - start
    shipped = CostModel.load(SHIPPED_COST_MODEL)
    print(json.dumps({"machine": machine_fingerprint(engine.config.device), "model": model.model,
                      "dtype": model.dtype, "calibration_s": round(seconds, 1), "num_samples": model.num_samples,
                      "holdout_mape": model.holdout_mape, "shipped_holdout_mape": shipped.holdout_mape,
                      "coefficients": model.coefficients}, indent=2))


if __name__ == "__main__":
    main()
