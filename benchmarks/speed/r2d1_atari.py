"""R2D1 speed on Atari: sampling SPS and training SPS of algos/r2d1_atari.py in each sampler mode, and the
learner's sequences per second (one update of the paper's batch: 64 sequences of 40 burn-in + 80 + 5 rows).

Sampling SPS is measured before learning starts; training SPS once it runs (replay ratio 1: one update per
batch_size * sequence_length = 5,120 env steps, as in R2D2 and rlpyt). --device (default cpu) is the script's
--device and where the in-process learner measurement puts its network and batches.

    python benchmarks/speed/r2d1_atari.py [--env-id BreakoutNoFrameskip-v4] [--num-envs 16] [--steps 20000] [--device cpu]
                                    [--episode-length 2500] [--samplers serial parallel async] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run as a file: the repository's packages import from it

sys.path.insert(0, str(ROOT / "algos"))

from benchmarks.script_speed import mean_sps, run_script


def script_sps(env_id: str, num_envs: int, sampler: str, steps: int, learn_from: int, device: str) -> tuple[float, float, int]:
    """(sampling SPS before learning, training SPS after, updates done) from one run's progress.csv."""
    flags = [
        *("--env-id", env_id, "--sampler", sampler, "--num-envs", str(num_envs)),
        *("--total-timesteps", str(learn_from + steps), "--min-steps-learn", str(learn_from), "--buffer-size", "200000"),
        *("--log-every", str(steps // 4), "--eval-episodes", "0", "--device", device),
    ]
    rows = run_script("r2d1_atari.py", flags)
    # The async learner sees steps a chunk (rnn_state_interval rows of every env) at a time: its rows land on
    # chunk boundaries, the first at or past learn_from within one chunk.
    edge = max(int(r["global_step"]) for r in rows if int(r["global_step"]) <= learn_from + num_envs * 40)
    return mean_sps(rows, end=edge), mean_sps(rows, start=edge), int(rows[-1]["updates"])


def learner_sequences_per_second(
    repeats: int, device, episode_length: float, unique_frames: bool = True, compile: bool = False
) -> float:
    """Sequences per second of ``repeats`` timed updates on ``device`` (a torch.device or its name), after one
    untimed (three with ``compile``: ``--compile``'s graphs are compiled and captured there), on random frames whose
    episodes end with probability 1 / ``episode_length`` at each row. ``unique_frames``: the batch carries each frame once and
    the learner stacks them (as the script does), else the replay stacks them."""
    import numpy as np
    import r2d1_atari as r2d1
    import torch

    from shared.replay import SequenceReplayBuffer

    device = torch.device(device)

    args = r2d1.Args()
    B = 16
    ex = r2d1.Row(
        np.zeros((4, 84, 84), np.uint8),
        np.int64(0),
        np.float32(0),
        False,
        False,
        np.int64(0),
        np.float32(0),
        r2d1.RnnState(np.zeros(512, np.float32), np.zeros(512, np.float32)),
    )
    buf = SequenceReplayBuffer(
        ex,
        20_000,
        B,
        sequence_length=120,
        rnn_state_interval=40,
        discount=0.997,
        n_step_return=5,
        frame_stack=4,
        prioritized=True,
        alpha=0.9,
        beta=0.6,
        unique_frames=unique_frames,
    )
    rng = np.random.default_rng(0)
    for _ in range(10):
        chunk = r2d1.Row(
            rng.integers(0, 255, (40, B, 4, 84, 84), dtype=np.uint8),
            rng.integers(0, 4, (40, B)),
            rng.random((40, B), dtype=np.float32),
            rng.random((40, B)) < 1 / episode_length,
            np.zeros((40, B), bool),
            rng.integers(0, 4, (40, B)),
            rng.random((40, B), dtype=np.float32),
            r2d1.RnnState(np.zeros((40, B, 512), np.float32), np.zeros((40, B, 512), np.float32)),
        )
        buf.append(chunk)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # as shared.run.Run sets
    net = r2d1.R2D1Net((4, 84, 84), 4, 512).to(device)
    target = r2d1.R2D1Net((4, 84, 84), 4, 512).to(device)
    opt = torch.optim.Adam(net.parameters(), lr=1e-4, eps=1e-3)

    def sync() -> None:  # GPU work is queued: wait for it before the clock is read
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    from shared import compiling

    if compile:
        compiling.enable(device)
    for _ in range(3 if compile else 1):
        r2d1.r2d1_update(net, target, opt, buf, args, 0.6, device)
    sync()
    t0 = time.perf_counter()
    for _ in range(repeats):
        r2d1.r2d1_update(net, target, opt, buf, args, 0.6, device)
    sync()
    compiling.disable()
    return repeats * args.batch_size / (time.perf_counter() - t0)


def core_sequences_per_second(repeats: int, episode_length: float) -> tuple[float, float]:
    """Sequences per second through the recurrent core alone (forward and backward of R2D1Net on vector
    observations: a tiny torso, the paper's LSTM of 512) for batches of 64 x 125 rows, and the fraction of those
    batches in which an episode starts after the first row (where a row-by-row LSTM would be needed)."""
    import numpy as np
    import r2d1_atari as r2d1
    import torch

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    net = r2d1.R2D1Net((8,), 4, 512)
    T, B = 125, 64
    batches = []
    for _ in range(repeats + 1):
        starts = torch.as_tensor(rng.random((T, B)) < 1 / episode_length)
        batches.append((torch.randn(T, B, 8), torch.randint(0, 4, (T, B)), torch.randn(T, B), starts))
    state = net.initial_state(B)
    t0 = 0.0
    for i, (obs, a, r, starts) in enumerate(batches):
        if i == 1:  # the first is untimed
            t0 = time.perf_counter()
        q, _ = net(obs, a, r, state, starts)
        net.zero_grad()
        q.sum().backward()
    hit = np.mean([bool(b[3][1:].any()) for b in batches])
    return repeats * B / (time.perf_counter() - t0), float(hit)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env-id", default="BreakoutNoFrameskip-v4")
    p.add_argument("--num-envs", type=int, default=16)
    p.add_argument("--steps", type=int, default=20_000, help="env steps measured after learning starts")
    p.add_argument("--learn-from", type=int, default=10_000)
    p.add_argument("--repeats", type=int, default=3, help="learner updates timed (0: skip)")
    p.add_argument(
        "--episode-length",
        type=float,
        default=2500,
        help="mean episode length in the learner's batches (2,500: an episode starts inside 96%% of "
        "batches of 64 x 125 rows, as in Atari)",
    )
    p.add_argument("--samplers", nargs="*", default=["serial", "parallel", "async"])
    p.add_argument(
        "--device",
        default="cpu",
        help="auto, cpu, cuda or cuda:N: the script's --device and the learner measurement's (default: cpu)",
    )
    a = p.parse_args()
    from shared.cli import resolve_device

    device = resolve_device(a.device)  # as the script resolves it; a bad or missing device exits 2 here
    if a.repeats:
        core, hit = core_sequences_per_second(4 * a.repeats, a.episode_length)
        print(
            f"recurrent core alone on cpu: {core:.1f} sequences/s (forward and backward, 64 x 125 rows; an episode "
            f"starts inside {hit:.0%} of the batches)",
            flush=True,
        )
        for unique in (False, True):  # side by side: frames stacked by the replay, or sent once and stacked here
            seq = learner_sequences_per_second(a.repeats, device, a.episode_length, unique)
            print(
                f"learner on {device}, {'unique frames' if unique else 'stacked frames'}: {seq:.1f} sequences/s "
                f"({seq * 120:.0f} rows/s incl. burn-in) at batch 64 x (40 + 80 + 5), episodes of "
                f"{a.episode_length:.0f} rows on average",
                flush=True,
            )
    print(f"{a.env_id}, {a.num_envs} envs, device {device}: env steps per second", flush=True)
    for sampler in a.samplers:
        s, t, u = script_sps(a.env_id, a.num_envs, sampler, a.steps, a.learn_from, a.device)
        print(f"--sampler {sampler:<8}  sampling {s:7.1f} SPS   training {t:7.1f} SPS ({u} updates)", flush=True)


if __name__ == "__main__":
    main()
