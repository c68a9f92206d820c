"""PPO on MiniGrid-DoorKey-5x5-v0 from its Dict observation (image + direction; the mission string dropped), ours
(algos/ppo_atari.py) beside SB3's PPO with MultiInputPolicy, both with rl-baselines3-zoo's settings for the env
(hyperparams/ppo.yml: 8 envs x 128 steps, minibatches of 64, 10 epochs, lr 2.5e-4 constant, clip 0.2, gamma 0.99,
lambda 0.95, no entropy bonus, no value clipping, 100k steps), several seeds each, one run at a time.

    taskset -c 1 python benchmarks/learning/minigrid_vs_sb3.py OUT [--seeds 1 2 3] [--which ours sb3]

Not the zoo's: the zoo flattens the observation (FlatObsWrapper) and normalizes it (VecNormalize); here neither
sees a flat or normalized observation: the image (7x7x3 uint8 codes 0-10) enters the network as codes divided by
10 (shared/dict_obs.py's GRID_SCALE: scaled by 1/255, as SB3's default normalize_images would, ours learned
nothing in 65k steps; unscaled, the value head started far from the task's [0, 1] returns and seed 1 of both
ours and SB3 from our weights stayed at 0.0), the direction (Discrete(4)) one-hot, as SB3's MultiInputPolicy
does. Both networks are the same: shared/dict_obs.py's
DictTorso (the image through 2x2 convolutions of 16-32-64 channels with a max-pool, a 64-unit ReLU layer; the
direction through a 64x64 tanh MLP; concatenated, 128 features), then linear policy and value heads (SB3:
``net_arch=dict(pi=[], vf=[])``, its orthogonal init with the same gains). SB3's NatureCNN cannot take 7x7 images,
so it is given DictTorso as its features extractor, on its preprocessed (channels-first, scaled, one-hot) input.

The figure: the mean return of the episodes that ended in the last 10 rollouts (10,240 steps, the last tenth of
training), from ours' progress.csv (return_mean weighted by each row's episodes) and from SB3's episodes (each
env's Monitor info, recorded with the step it ended at). A success scores 1 - 0.9 x steps / 250. Writes
OUT/{ours,sb3}_{seed}/ (ours: the run folder; sb3: progress.csv) and OUT/summary.json.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

ENV_ID = "MiniGrid-DoorKey-5x5-v0"
ZOO = {
    "n_envs": 8,
    "n_steps": 128,
    "batch_size": 64,
    "n_epochs": 10,
    "learning_rate": 2.5e-4,
    "clip_range": 0.2,
    "gamma": 0.99,
    "gae_lambda": 0.95,
    "ent_coef": 0.0,
    "total_timesteps": 100_000,
}
LAST_STEPS = 10 * ZOO["n_envs"] * ZOO["n_steps"]  # the last 10 rollouts


def ours_flags() -> list[str]:
    z = ZOO
    return [
        "--env-id",
        f"minigrid:{ENV_ID}",
        "--total-timesteps",
        str(z["total_timesteps"]),
        "--num-envs",
        str(z["n_envs"]),
        "--num-steps",
        str(z["n_steps"]),
        "--num-minibatches",
        str(z["n_envs"] * z["n_steps"] // z["batch_size"]),
        "--update-epochs",
        str(z["n_epochs"]),
        "--learning-rate",
        str(z["learning_rate"]),
        "--no-anneal-lr",
        "--clip-coef",
        str(z["clip_range"]),
        "--no-clip-vloss",
        "--gamma",
        str(z["gamma"]),
        "--gae-lambda",
        str(z["gae_lambda"]),
        "--ent-coef",
        str(z["ent_coef"]),
        # training returns only, the figure SB3's Monitor gives (the evaluation takes Dict observations too)
        "--eval-episodes",
        "0",
    ]


def final_return(rows: list[dict], total: int) -> tuple[float, int]:
    """Mean return of the episodes that ended in the last LAST_STEPS steps, from rows of global_step, episodes
    (cumulative) and return_mean (of the episodes since the previous row)."""
    total_r, total_n, prev = 0.0, 0, 0
    for row in rows:
        n = int(row["episodes"]) - prev
        prev = int(row["episodes"])
        if int(row["global_step"]) > total - LAST_STEPS and n > 0 and row["return_mean"] != "":
            total_r += float(row["return_mean"]) * n
            total_n += n
    return total_r / max(total_n, 1), total_n


def run_ours(out: Path, seed: int) -> dict:
    t0 = time.time()
    cmd = [
        sys.executable,
        str(ROOT / "algos" / "ppo_atari.py"),
        *ours_flags(),
        "--seed",
        str(seed),
        "--out-dir",
        str(out),
        "--run-name",
        f"ours_{seed}",
    ]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    rows = list(csv.DictReader(open(out / f"ours_{seed}" / "progress.csv")))
    ret, n = final_return(rows, int(rows[-1]["global_step"]))
    return {"seed": seed, "final_return": ret, "final_episodes": n, "wall_s": time.time() - t0, "command": " ".join(cmd[1:])}


def run_sb3(out: Path, seed: int) -> dict:
    import gymnasium as gym
    import minigrid  # noqa: F401  (registers the MiniGrid envs)
    import numpy as np
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor

    from shared.dict_obs import DictTorso, without_text

    torch.set_num_threads(1)

    class Torso(BaseFeaturesExtractor):
        """shared/dict_obs.py's DictTorso on SB3's preprocessed input: the image channels-first, as floats
        (normalize_images=False: the codes, which DictTorso divides by 10), the direction one-hot (back to its index,
        which DictTorso one-hots)."""

        def __init__(self, space: gym.spaces.Dict):
            mine = {}
            for k, sub in space.spaces.items():
                mine[k] = gym.spaces.Box(0, 255, sub.shape, np.uint8) if len(sub.shape) == 3 else sub
            torso = DictTorso(gym.spaces.Dict(mine), lambda layer, std=None: layer)  # SB3 inits it (ortho_init)
            super().__init__(space, torso.width)
            self.torso = torso
            self.discrete = {k for k, sub in space.spaces.items() if isinstance(sub, gym.spaces.Discrete)}

        def forward(self, obs: dict) -> torch.Tensor:
            one_hot = lambda v: v.reshape(v.shape[0], -1).argmax(1)  # [N, 1, n] -> [N]
            return self.torso({k: one_hot(v) if k in self.discrete else v for k, v in obs.items()})

    class Episodes(BaseCallback):
        def __init__(self):
            super().__init__()
            self.episodes: list[tuple[int, float]] = []

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.episodes.append((self.num_timesteps, float(info["episode"]["r"])))
            return True

    t0 = time.time()
    envs = make_vec_env(lambda: without_text(gym.make(ENV_ID)), n_envs=ZOO["n_envs"], seed=seed)
    model = PPO(
        "MultiInputPolicy",
        envs,
        n_steps=ZOO["n_steps"],
        batch_size=ZOO["batch_size"],
        n_epochs=ZOO["n_epochs"],
        learning_rate=ZOO["learning_rate"],
        clip_range=ZOO["clip_range"],
        gamma=ZOO["gamma"],
        gae_lambda=ZOO["gae_lambda"],
        ent_coef=ZOO["ent_coef"],
        seed=seed,
        device="cpu",
        policy_kwargs={
            "features_extractor_class": Torso,
            "net_arch": {"pi": [], "vf": []},
            "normalize_images": False,  # the grid's codes, which DictTorso scales, as ours
        },
    )
    callback = Episodes()
    model.learn(ZOO["total_timesteps"], callback=callback)
    wall = time.time() - t0
    # progress.csv as ours writes it: one row a rollout
    batch, rows, done = ZOO["n_envs"] * ZOO["n_steps"], [], 0
    steps = model.num_timesteps
    for end in range(batch, steps + 1, batch):
        mine = [r for t, r in callback.episodes if end - batch < t <= end]
        done += len(mine)
        rows.append({"global_step": end, "episodes": done, "return_mean": float(np.mean(mine)) if mine else ""})
    d = out / f"sb3_{seed}"
    d.mkdir(parents=True, exist_ok=True)
    with open(d / "progress.csv", "w", newline="") as f:
        w = csv.DictWriter(f, ["global_step", "episodes", "return_mean"])
        w.writeheader()
        w.writerows(rows)
    ret, n = final_return(rows, steps)
    return {
        "seed": seed,
        "final_return": ret,
        "final_episodes": n,
        "wall_s": wall,
        "command": "benchmarks/learning/minigrid_vs_sb3.py (SB3 PPO, MultiInputPolicy, DictTorso extractor)",
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--which", nargs="+", default=["ours", "sb3"], choices=["ours", "sb3"])
    p.add_argument("--total-timesteps", type=int, default=ZOO["total_timesteps"], help="a smoke test: fewer")
    a = p.parse_args()
    ZOO["total_timesteps"] = a.total_timesteps
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    summary_path = out / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {"env": ENV_ID, "zoo": ZOO}
    for seed in a.seeds:
        for which in a.which:
            r = run_ours(out, seed) if which == "ours" else run_sb3(out, seed)
            summary.setdefault(which, {})[str(seed)] = r
            summary_path.write_text(json.dumps(summary, indent=1))
            print(
                which,
                seed,
                f"final return {r['final_return']:.3f} over {r['final_episodes']} episodes, {r['wall_s']:.0f} s",
                flush=True,
            )


if __name__ == "__main__":
    main()
