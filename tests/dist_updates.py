"""One update of each algorithm family on a fixed batch, as ``tests/test_distributed.py`` needs it.

``python -m tests.dist_updates OUT FOLDER`` under a 2-rank process group (RANK, WORLD_SIZE, MASTER_ADDR/PORT
set): each rank takes its half of every batch and runs the script's own update function; rank 0 saves the
parameters to OUT, with what ``check_in_sync`` says of a nudged parameter and what a progress row in FOLDER
holds. ``updates(None)`` in one process runs the same updates on the whole batches. The optimizers are SGD with
step size 1, so the parameter change is the (averaged) gradient itself.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "algos"))

import ddpg_mujoco
import dqn_atari
import ppo_atari

from shared import distributed
from shared.device_replay import ReplayBatches
from shared.normalize import ObsNorm, upload_batch

N, OBS, ACT, N_ACTIONS = 64, 4, 2, 3


def _half(x: np.ndarray, part: int | None) -> np.ndarray:
    return x if part is None else np.array_split(x, 2)[part]


def _sgd(*modules) -> torch.optim.Optimizer:
    return torch.optim.SGD([p for m in modules for p in m.parameters()], lr=1.0)


def updates(part: int | None) -> dict[str, torch.Tensor]:
    """Parameters after one update of PPO, DQN and DDPG from fixed initial networks on fixed batches (``part``:
    the half this rank holds; None: all of it)."""
    rng = np.random.default_rng(0)
    out: dict[str, torch.Tensor] = {}

    # on-policy: PPO's clipped loss with advantages normalised over the whole minibatch of every rank
    torch.manual_seed(0)
    agent = ppo_atari.Agent((OBS,), N_ACTIONS)
    distributed.share(agent)
    data = {
        "obs": rng.normal(size=(N, OBS)),
        "action": rng.integers(0, N_ACTIONS, N),
        "logprob": rng.normal(-1.1, 0.1, N),
        "value": rng.normal(size=N),
        "adv": rng.normal(1.0, 2.0, N),
        "ret": rng.normal(size=N),
    }
    data = {
        k: torch.as_tensor(_half(v, part)).float() if k != "action" else torch.as_tensor(_half(v, part))
        for k, v in data.items()
    }
    data = {k: v.unsqueeze(1) for k, v in data.items()}  # [T, B = 1, ...], as a rollout
    data["mask"] = torch.ones(len(data["action"]), 1, N_ACTIONS, dtype=torch.bool)
    data["weight"] = torch.ones(len(data["action"]), 1)
    args = ppo_atari.Args(num_minibatches=1, update_epochs=1, max_grad_norm=1e9, bf16=False)
    ppo_atari.ppo_update(agent, _sgd(agent), data, args, torch.device("cpu"), torch.Generator().manual_seed(0))
    out.update({f"ppo.{k}": v.clone() for k, v in agent.state_dict().items()})

    # value-based: DQN's n-step TD loss with importance weights (a fixed "replay sample")
    torch.manual_seed(1)
    q_net, target = dqn_atari.QNetwork((OBS,), N_ACTIONS, True), dqn_atari.QNetwork((OBS,), N_ACTIONS, True)
    distributed.share(q_net, target)
    sample = SimpleNamespace(
        observation=rng.normal(size=(N, OBS)).astype(np.float32),
        next_observation=rng.normal(size=(N, OBS)).astype(np.float32),
        action=rng.integers(0, N_ACTIONS, N),
        n_step_return=rng.normal(size=N),
        terminated_n=rng.random(N) < 0.2,
        bootstrap_discount=np.full(N, 0.99**3),
        is_weights=rng.uniform(0.5, 1.0, N),
    )
    sample = {k: _half(v, part) for k, v in vars(sample).items()}  # the fields dqn_update uploads (HOST_ONLY aside)
    buffer = SimpleNamespace(
        sample=lambda batch_size, beta, skip: (sample, None),
        update_priorities=lambda *a: None,
        sample_ahead=lambda *a, **k: None,
    )
    args = dqn_atari.Args(max_grad_norm=1e9, double_dqn=True, prioritized=False)
    batches = ReplayBatches(buffer, dqn_atari.HOST_ONLY, torch.device("cpu"))
    dqn_atari.dqn_update(q_net, target, _sgd(q_net), batches, args, 0.4)
    out.update({f"dqn.{k}": v.clone() for k, v in q_net.state_dict().items()})

    # actor-critic: DDPG's critic then actor step (deterministic: no sampling noise to split between ranks)
    torch.manual_seed(2)
    actor, critic = ddpg_mujoco.Actor(OBS, ACT, 32), ddpg_mujoco.Critics(OBS, ACT, 32, k=1)
    target_actor, target_critic = ddpg_mujoco.Actor(OBS, ACT, 32), ddpg_mujoco.Critics(OBS, ACT, 32, k=1)
    distributed.share(actor, critic, target_actor, target_critic)
    batch = SimpleNamespace(
        observation=rng.normal(size=(N, OBS)),
        next_observation=rng.normal(size=(N, OBS)),
        action=rng.uniform(-1, 1, (N, ACT)),
        n_step_return=rng.normal(size=N),
        terminated_n=(rng.random(N) < 0.2).astype(np.float32),
        bootstrap_discount=np.full(N, 0.99),
    )
    batch = {k: _half(v, part) for k, v in vars(batch).items()}  # the fields ReplayBatches uploads (HOST_ONLY aside)
    args = ddpg_mujoco.Args(bf16=False, tau=0.5)
    b = upload_batch(batch, ObsNorm(OBS, enabled=False), torch.device("cpu"))
    ddpg_mujoco.ddpg_update(actor, target_actor, critic, target_critic, (_sgd(actor), _sgd(critic)), b, args)
    for name, m in (("actor", actor), ("critic", critic), ("target_actor", target_actor), ("target_critic", target_critic)):
        out.update({f"ddpg.{name}.{k}": v.clone() for k, v in m.state_dict().items()})
    distributed.check_in_sync()  # the last modules shared: identical on both ranks
    return out


def diverge() -> str:
    """Rank 1 nudges one parameter of the last shared modules: ``check_in_sync`` must say so on every rank."""
    if distributed.rank() == 1:
        with torch.no_grad():
            next(iter(distributed._state["modules"][0].parameters())).view(-1)[0] += 1e-6
    try:
        distributed.check_in_sync()
    except distributed.RanksDiverged as e:
        return str(e)
    finally:
        distributed.share()  # nothing left to compare
    return ""


def rows(folder: str) -> bool:
    """Rank 0 finishes episodes 1, 2, 3 and rank 1 episode 10; both log loss = rank. Returns whether every rank
    finds "mean of the last 4 >= 3.9" after the row (the stop rule's agreement)."""
    from pathlib import Path

    from shared.progress import ProgressLog

    path = Path(folder) / "rows"
    if distributed.is_main():  # rank 0 alone writes
        path.mkdir(parents=True, exist_ok=True)
    log = ProgressLog(path if distributed.is_main() else None, 100)
    for ret in [1.0, 2.0, 3.0] if distributed.rank() == 0 else [10.0]:
        log.episode(ret, 5, 50)
    log.row(100, loss=float(distributed.rank()), updates=7)
    mean = log.recent_mean(4)
    (stop,) = distributed.any_rank(mean is not None and mean >= 3.9)
    log.close()
    return stop


if __name__ == "__main__":
    if os.environ.get("DIST_GRAPHED") == "1":  # each update through the --compile protocol (shared.compiling)
        from shared import compiling

        compiling.enable("cpu")
    distributed.start(torch.device("cpu"))
    result = updates(distributed.rank())
    everything = distributed.gather_objects(result)  # both ranks' parameters, to show they are identical
    report = {
        "ranks": everything,
        "diverged": distributed.gather_objects(diverge()),
        "stop": distributed.gather_objects(rows(sys.argv[2])),
    }
    if distributed.rank() == 0:
        torch.save(report, sys.argv[1])
    distributed.end()
    # every thread of the process groups is gone once the job has left them (none lives on into the exit)
    names = [Path(f"/proc/self/task/{t}/comm").read_text() for t in os.listdir("/proc/self/task")]
    left = [n for n in names if n.startswith(("gloo", "pt_gloo", "pt_tcpstore"))]
    if left:
        sys.exit(f"rank {distributed.rank()}: threads {left} of the process groups outlived distributed.end()")
