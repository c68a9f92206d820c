#!/usr/bin/env bash
# The tuning result in benchmarks/results/README.md ("Hyperparameter search: PPO on Acrobot-v1"): experiments/tune.py
# searches ppo_atari's flags on Acrobot-v1 (its presets were tuned on Atari and CartPole), 3 seeds per trial, then
# the best trial's flags and the defaults (--preset cartpole) are re-run on 5 fresh seeds and compared with
# experiments/report.py's rliable intervals. About 50 minutes of one core:
#     taskset -c 1 bash benchmarks/learning/tune_acrobot.sh /tmp/tune-acrobot
set -euo pipefail
OUT=${1:-runs/tune-acrobot}
PY=${PYTHON:-python}
HERE=$(cd "$(dirname "$0")/.." && pwd)
COMMON=(--preset cartpole --total-timesteps 50000)
"$PY" "$HERE/experiments/tune.py" "$OUT/tune" --script ppo_atari --env-ids Acrobot-v1 --seeds 1 2 3 --trials 12 \
    --search "learning-rate=log:1e-4:3e-3" "ent-coef=float:0:0.02" "num-steps=int:32:256:log" \
    "gae-lambda=float:0.8:0.99" "gamma=float:0.95:0.999" "update-epochs=int:4:20" \
    --target-scores Acrobot-v1=-500:0 --sampler tpe:n_startup_trials=6 --sampler-seed 0 \
    --pruner median:n_startup_trials=3,n_warmup_steps=10000 --prune-every 5000 --plain -- "${COMMON[@]}"
BEST=$("$PY" - "$OUT/tune" <<'PYEOF'
import json, sys, optuna
from pathlib import Path
from experiments.tune_folder import storage_from_record  # tune.json's storage is relative to its folder
optuna.logging.set_verbosity(optuna.logging.WARNING)
root = Path(sys.argv[1])
record = json.loads((root / "tune.json").read_text())
study = optuna.load_study(study_name=record["study_name"], storage=storage_from_record(record["storage"], root))
print(study.best_trial.user_attrs["flags"])
PYEOF
)
echo "best flags: $BEST"
"$PY" "$HERE/experiments/launch.py" "$OUT/rerun" --scripts ppo_atari --env-ids Acrobot-v1 --seeds 101 102 103 104 105 \
    --level "best:$BEST" "default:" --plain -- "${COMMON[@]}"
"$PY" "$HERE/experiments/report.py" "$OUT/rerun" --no-curves
