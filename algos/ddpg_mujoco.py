"""DDPG for continuous control (MuJoCo, any Box action space), every sampler.

    python algos/ddpg_mujoco.py                     # HalfCheetah-v5, one update per env step
    python algos/ddpg_mujoco.py --sampler async     # a sampler process fills a shared replay while this one learns
    python algos/ddpg_mujoco.py --preset pendulum   # Pendulum-v1 in 20k steps

DDPG (Lillicrap et al. 2016) in the re-tuned form the TD3 paper compares against ("our DDPG"): a deterministic actor
with Gaussian exploration noise (0.1) instead of Ornstein-Uhlenbeck noise, one Q critic, target networks with soft
updates (tau 0.005) every step, Adam 3e-4, batch 256, no weight decay. replay_ratio is samples consumed per env step
(256 at batch 256: one update per step). Actions are in [-1, 1] inside the agent and the replay (the noise scale is a
fraction of half the action range) and scaled to the env's bounds when stepping; --normalize-obs keeps running
observation statistics, frozen in evaluation and in --export.

Where to change what: the env in make_env (a wrapper there reaches every sampling mode); the networks in make_networks:
Actor (forward(obs) -> action [N, A] in [-1, 1]) and Critics (forward(obs, action) -> Q-values [K, N], K = 1 here); the
losses in ddpg_critic_loss and ddpg_actor_loss, whose statistics ddpg_update returns (a new key is a new progress.csv
column); the evaluation and --export action in Policy; a new stored quantity (per step, in the replay) is an entry in
ROW, written in EnvStepper.step and read by the loss (every batch field but HOST_ONLY is uploaded); the schedule in
main. An @graphed step (one CUDA graph under --compile) sees a setting changed between calls (an Args field) at its
next call, each value one graph, 8 at most: pass a schedule as a tensor, and return what the step computes (a write to
a setting or to a list or dict argument is refused).
"""

import copy
import importlib.util
import math
import sys
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Annotated, Literal

# shared/ from the repository around this file (no install needed), else the installed library: a copy runs anywhere
ROOT = next((p for p in Path(__file__).resolve().parents if (p / "shared" / "run.py").exists()), None)
if ROOT:
    sys.path.insert(0, str(ROOT))
elif importlib.util.find_spec("shared") is None:
    sys.exit("error: shared/ not found: pip install -e PATH_TO_THE_REPOSITORY (its README: Start your own project)")

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from shared import distributed
from shared.argtypes import Fraction, NonNegFloat, NonNegInt, PositiveFloat, PositiveInt, Range
from shared.cli import RunArgs, check_replay_sizes, parse_args
from shared.compiling import compiled, graphed
from shared.device import to_host, upload
from shared.device_replay import DeviceReplay, ReplayBatches
from shared.envs import EpisodeTally, make_envs
from shared.namedarraytuple import namedarraytuple
from shared.normalize import ObsNorm, upload_batch
from shared.pacing import AsyncReplay, ReplayPacer
from shared.precision import autocast
from shared.procs import SamplerProcess
from shared.replay import ReplayBuffer
from shared.run import Run


@dataclass
class Args(RunArgs):
    # seed, run folder, resume, checkpoints, evaluation, device, bf16: in shared.cli.RunArgs, the same everywhere
    # experiment
    preset: Literal["mujoco", "pendulum"] = "mujoco"
    """named settings, flags given override them (mujoco: TD3 paper's DDPG on HalfCheetah; pendulum: Pendulum-v1, 20k steps)"""
    env_id: str = "HalfCheetah-v5"
    """gymnasium id of an env with a Box action space (MuJoCo v5 envs, Pendulum-v1, ...)"""
    total_timesteps: PositiveInt = 1_000_000
    """env steps summed over all envs"""
    log_every: PositiveInt = 5_000
    """env steps between progress rows"""
    save_replay: bool = False
    """each checkpoint also writes the replay (replay.npz, plain arrays); --resume then continues with it"""
    # algorithm
    num_envs: PositiveInt = 1
    """environments stepped together on each rank (torchrun)"""
    buffer_size: PositiveInt = 1_000_000
    """replay capacity in transitions (each rank's, torchrun)"""
    batch_size: PositiveInt = 256
    """transitions per gradient step"""
    replay_ratio: PositiveFloat = 256.0
    """samples consumed per env step (256 with batch 256: one update per step)"""
    min_steps_learn: NonNegInt = 25_000
    """env steps of uniformly random actions collected before learning starts (in each rank's replay)"""
    learning_rate: Annotated[float, Range(gt=0, lt=1)] = 3e-4
    """Adam step size of the actor and the critic"""
    hidden: PositiveInt = 256
    """units in each of the two hidden layers of the actor and the critic"""
    gamma: Fraction = 0.99
    """discount"""
    tau: Annotated[float, Range(gt=0, le=1)] = 0.005
    """soft target update: the target networks move this fraction of the way every update"""
    n_step_return: PositiveInt = 1
    """steps summed before bootstrapping"""
    exploration_noise: NonNegFloat = 0.1
    """std of the Gaussian noise added to the actor's actions while sampling"""
    normalize_obs: bool = False
    """normalise observations with running statistics (saved in the checkpoint, frozen in evaluation)"""
    # infrastructure
    sampler: Literal["serial", "parallel", "async"] = "serial"
    """serial, parallel (AsyncVectorEnv worker processes) or async (a sampler process appending to a shared replay)"""
    max_lag_steps: NonNegInt = 1_000
    """async: the sampler waits when it is this many env steps ahead of the learner's updates (0: never waits)"""


# Named starting points: --preset NAME, then any flag overrides them. Every field not named keeps its default.
PRESETS = {
    "mujoco": Args(),
    # rl-baselines3-zoo's ddpg.yml Pendulum-v1 budget (20k steps), learning after 1000 random steps.
    "pendulum": Args(preset="pendulum", env_id="Pendulum-v1", total_timesteps=20_000, min_steps_learn=1000),
}

# ------------------------------------------------------------------------------------- environments


def make_env(args: Args, render: bool = False) -> Callable[[], gym.Env]:
    """One env, made in the process that steps it: a wrapper added here reaches every sampling mode; plug your own env
    in here (shared/envs.py says how to register one)."""

    def thunk() -> gym.Env:
        return gym.make(args.env_id, render_mode="rgb_array" if render else None)

    return thunk


def scale_action(action, low, high):
    """[-1, 1] -> [low, high]: numpy arrays when sampling, tensors in Policy."""
    return low + (action + 1.0) * 0.5 * (high - low)


# ----------------------------------------------------------------------------------------- networks


class Actor(nn.Module):
    """s -> a = tanh(MLP(s)) in [-1, 1]; 2 hidden ReLU layers."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(obs_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, act_dim), nn.Tanh()
        )

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)  # [N, A]


# Batched as td3_mujoco.py's and sac_mujoco.py's twin critics are, with one critic here (k=1).
class Critics(nn.Module):
    """K independent Q(s, a) MLPs evaluated as one: each layer is one batched matmul over all K (weights [K, in, out]),
    initialised like nn.Linear (uniform +-1/sqrt(fan_in))."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int, k: int = 2):
        super().__init__()
        sizes = [obs_dim + act_dim, hidden, hidden, 1]
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
            bound = 1.0 / math.sqrt(fan_in)
            self.weights.append(nn.Parameter(torch.empty(k, fan_in, fan_out).uniform_(-bound, bound)))
            self.biases.append(nn.Parameter(torch.empty(k, 1, fan_out).uniform_(-bound, bound)))

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        x = torch.cat([obs, action], dim=-1)  # [N, S + A]
        x = x.unsqueeze(0).expand(len(self.weights[0]), -1, -1)  # [K, N, S + A]
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            x = torch.baddbmm(b, x, w)
            if i < len(self.weights) - 1:
                x = F.relu(x)
        return x.squeeze(-1)  # [K, N]


def make_networks(args: Args, obs_space: gym.Space, act_space: gym.Space) -> tuple[nn.Module, nn.Module]:
    """The actor and the critics, for the learner (and their target copies) and the async sampler (the actor) alike: a
    new network is one edit here (their forwards: Actor's and Critics')."""
    obs_dim, act_dim = int(np.prod(obs_space.shape)), int(np.prod(act_space.shape))
    return Actor(obs_dim, act_dim, args.hidden), Critics(obs_dim, act_dim, args.hidden, k=1)


class Policy(nn.Module):
    """Evaluation and --export: raw observations [B, S] -> the actor's action scaled to the env's bounds [B, A], no
    exploration noise; the observation statistics are read, never updated."""

    def __init__(self, actor: Actor, obs_norm: ObsNorm, space: gym.spaces.Box):
        super().__init__()
        self.actor = actor
        self.obs_norm = obs_norm
        self.register_buffer("low", torch.as_tensor(space.low, dtype=torch.float32))
        self.register_buffer("high", torch.as_tensor(space.high, dtype=torch.float32))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return scale_action(self.actor(self.obs_norm.normalize(obs.float())), self.low, self.high)


# ----------------------------------------------------------------------------------------- sampling

# A replay row by field, with its example (the observation's and action's sizes from the env). A new stored quantity is
# an entry here, written in EnvStepper.step and read by the loss as b[name]: the update gets every field of the batch
# (uploaded, or from the replay's mirror on a CUDA learner) but HOST_ONLY, the replay's bookkeeping (the loss reads the
# n-step fields made from them; uniform sampling's weights).
ROW = dict(reward=np.float32(0), terminated=False, truncated=False)
Step = namedarraytuple("Step", ["observation", "action", *ROW])
HOST_ONLY = ("reward", "terminated", "truncated", "truncated_n", "n_taken", "final_row", "episode_start", "is_weights")


@graphed
@compiled
def policy_step(actor: Actor, obs: torch.Tensor, noise: float, bf16: bool) -> torch.Tensor:
    """The acting step: the actor's actions [B, A] at observations [B, S] plus Gaussian exploration noise of std
    ``noise``, clipped to [-1, 1]; the noise is drawn here, on the device (in the graph, with the forward pass)."""
    with torch.no_grad(), autocast(obs.device, bf16):  # here, not around the caller: a replay runs none of it
        action = actor(obs).float()
        return (action + noise * torch.randn_like(action)).clamp(-1.0, 1.0)


class EnvStepper:
    """Steps the envs one step at a time; keeps per-env episode state. Actions: uniform in [-1, 1] before learning
    starts, then the actor's plus Gaussian exploration noise, clipped to [-1, 1]."""

    def __init__(self, envs, args: Args, obs_norm: ObsNorm, seed: int):
        self.envs = envs
        self.args = args
        self.obs_norm = obs_norm
        self.obs, _ = envs.reset(seed=seed)
        self.final_row = np.zeros(args.num_envs, bool)  # this step only resets the env (next-step autoreset)
        self.episodes = EpisodeTally(args.num_envs)  # each env's return and length so far
        self.rng = np.random.default_rng(seed)
        self.space = envs.single_action_space

    def act(self, actor: Actor, random: bool, device: torch.device) -> np.ndarray:
        """Every env's action [B, A] for this step (on a GPU, waiting for the updates launched before it)."""
        self.obs_norm.update(self.obs, ~self.final_row)
        if random:
            return self.rng.uniform(-1.0, 1.0, (self.args.num_envs,) + self.space.shape).astype(np.float32)
        obs = upload_batch({"observation": self.obs}, self.obs_norm, device)["observation"]  # [B, S]: one copy each way
        return to_host(policy_step(actor, obs, self.args.exploration_noise, self.args.bf16))

    def step(self, action: np.ndarray) -> tuple:
        """One step of every env with ``action``: the replay row [1, B] and the episodes that ended [(return, length)]."""
        next_obs, reward, term, trunc, _ = self.envs.step(scale_action(action, self.space.low, self.space.high))
        reward = np.where(self.final_row, 0.0, reward)
        row = Step(observation=self.obs, action=action, reward=reward, terminated=term, truncated=trunc)  # stored as float32
        episode_end = term | trunc
        episodes = self.episodes.step(reward, ~self.final_row, episode_end)  # [(return, length)] of those that ended
        self.obs, self.final_row = next_obs, episode_end
        return row[None], episodes  # [1, B]


# ---------------------------------------------------------------------------------- loss and update


def critic_target(batch: dict, target_actor: Actor, target_critic: Critics) -> torch.Tensor:
    """n-step targets [N]: R + (1 - terminated_n) gamma^k Q'(s', mu'(s')).
    A truncation inside the window bootstraps from the episode's final observation s'."""
    with torch.no_grad():
        next_obs = batch["next_observation"]
        q_next = target_critic(next_obs, target_actor(next_obs)).float()[0]
        return batch["n_step_return"] + (1.0 - batch["terminated_n"]) * batch["bootstrap_discount"] * q_next


@compiled
def ddpg_critic_loss(target_actor: Actor, critic: Critics, target_critic: Critics, b: dict, bf16: bool) -> tuple:
    """The critic's loss on the batch ``b`` (targets under no_grad) and its statistics, detached."""
    with autocast(b["action"].device, bf16):
        y = critic_target(b, target_actor, target_critic)  # [N]
        q = critic(b["observation"], b["action"]).float()[0]  # [N]
    loss = ((q - y) ** 2).mean()
    return loss, {"qf_loss": loss.detach(), "q_values": q.detach().mean()}


@compiled
def ddpg_actor_loss(actor: Actor, critic: Critics, obs: torch.Tensor, bf16: bool) -> torch.Tensor:
    """The actor's loss -E[Q(s, mu(s))]."""
    with autocast(obs.device, bf16):
        return -critic(obs, actor(obs)).float().mean()


@graphed
def ddpg_update(actor, target_actor, critic, target_critic, optimizers, b: dict | DeviceReplay, args: Args) -> dict:
    """One DDPG update from the batch ``b`` (tensors [N, ...], or the replay's mirror, sampled here): critic, actor,
    then the soft target updates (one CUDA graph under --compile on a GPU)."""
    b = b.sample(args.batch_size) if isinstance(b, DeviceReplay) else b  # a CUDA learner's batch: drawn in this graph
    actor_opt, critic_opt = optimizers

    critic_loss, critic_stats = ddpg_critic_loss(target_actor, critic, target_critic, b, args.bf16)
    critic_opt.zero_grad(set_to_none=True)
    critic_loss.backward()
    distributed.average_gradients(critic)
    critic_opt.step()

    # the actor loss needs dQ/da only: skip the critic's weight gradients
    critic.requires_grad_(False)
    actor_loss = ddpg_actor_loss(actor, critic, b["observation"], args.bf16)
    actor_opt.zero_grad(set_to_none=True)
    actor_loss.backward()
    distributed.average_gradients(actor)
    actor_opt.step()
    critic.requires_grad_(True)

    with torch.no_grad():
        for target, online in ((target_critic, critic), (target_actor, actor)):
            for tp, p in zip(target.parameters(), online.parameters()):
                tp.lerp_(p, args.tau)  # Polyak averaging: tp += tau * (p - tp)
    # Detached tensors: read when a row is written (a non-finite one ends the run there), never per update.
    return {**critic_stats, "actor_loss": actor_loss.detach()}


# --------------------------------------------------------------------------------------------- main


def make_learner(args: Args, run: Run) -> tuple:
    """The actor, the critic, their target copies, their optimisers (actor's, critic's) and the observation
    statistics."""
    actor, critic = (net.to(run.device) for net in make_networks(args, run.obs_space, run.act_space))
    target_actor, target_critic = (copy.deepcopy(net).requires_grad_(False) for net in (actor, critic))
    fused = {"fused": True} if run.device.type in ("cpu", "cuda") else {}
    actor_opt = torch.optim.Adam(actor.parameters(), lr=args.learning_rate, **fused)
    critic_opt = torch.optim.Adam(critic.parameters(), lr=args.learning_rate, **fused)
    obs_norm = ObsNorm(int(np.prod(run.obs_space.shape)), args.normalize_obs, shared=args.sampler == "async")
    return actor, target_actor, critic, target_critic, (actor_opt, critic_opt), obs_norm


def make_replay(args: Args, run: Run) -> ReplayBuffer:
    """Each rank's replay of raw (unnormalised) observations and [-1, 1] actions, n-step returns."""
    obs_dim, act_dim = int(np.prod(run.obs_space.shape)), int(np.prod(run.act_space.shape))
    example = Step(observation=np.zeros(obs_dim, np.float32), action=np.zeros(act_dim, np.float32), **ROW)
    n_step = {"discount": args.gamma, "n_step_return": args.n_step_return}
    seed = distributed.rank_seed(args.seed)
    return ReplayBuffer(example, args.buffer_size, args.num_envs, **n_step, shared=args.sampler == "async", seed=seed)


# Evaluation's act (shared.evaluation): the observations [B, ...], then by parameter name only those of draws,
# starts, rewards, mask that it names (another name is refused at the start: a renamed one would never be passed).
def act(policy: Policy, device: torch.device, obs: np.ndarray) -> np.ndarray:
    """Evaluation: Policy's action [B, A] at observations [B, S]."""
    return to_host(policy(upload(obs, device)))


def main() -> int:
    args = parse_args(Args, PRESETS, check_replay_sizes)
    run = Run(args, __file__, make_env, action_space=gym.spaces.Box, bounded=True, stop_window=10)
    run.setup()  # this process: TF32, Ctrl-C/SIGTERM, the torchrun job, cores, seeds
    with run.allocating("buffer_size", "hidden"):  # sizes this machine cannot hold: exit 2
        actor, target_actor, critic, target_critic, optimizers, obs_norm = make_learner(args, run)
        buffer = None if args.eval_only or args.export else make_replay(args, run)  # evaluating or exporting: no replay
        batches = ReplayBatches(buffer, HOST_ONLY, run.device, obs_norm)  # a CUDA learner samples on the device
    policy = Policy(actor, obs_norm, run.act_space).to(run.device)
    named_optimizers = {"actor_optimizer": optimizers[0], "critic_optimizer": optimizers[1]}  # the checkpoint's names
    saved = dict(actor=actor, target_actor=target_actor, critic=critic, target_critic=target_critic, **named_optimizers)
    start = run.begin(partial(act, policy, run.device), buffer, **saved, obs_norm=obs_norm)
    if args.eval_only or args.export:  # with --resume: evaluate the checkpoint's policy or export it, train nothing
        return run.evaluate_or_export(policy, ["action"])
    global_step, updates = start.global_step, start.updates
    stats, waits = {}, {}
    updates_per_step = args.replay_ratio / (args.batch_size * run.world)  # per job env step: each update samples on every rank
    pacer = ReplayPacer(updates_per_step, args.min_steps_learn * run.world, *start.replay_origin)
    with run:
        # this process steps the envs: in turn (serial), or in worker processes (parallel)
        if args.sampler != "async":
            envs = run.hold(make_envs(args, make_env, args.sampler))
            stepper = EnvStepper(envs, args, obs_norm, distributed.env_seed(args.seed + global_step, args.num_envs))
        else:  # a sampler process fills the shared replay (the last section of this file)
            sampler = AsyncReplay.start(run, buffer, actor, pacer, global_step, sampler_main, (args, buffer, obs_norm))
        while global_step < args.total_timesteps:
            if args.sampler != "async":  # the actions first: on a GPU the envs then step while the updates below run
                action = stepper.act(actor, pacer.warming_up(global_step), run.device)
            else:  # the rows the sampler appended meanwhile; actor is published to it when due
                global_step, waits = sampler.exchange(run, actor, updates)
            for _ in range(pacer.due(global_step, updates)):  # replay_ratio samples per env step
                b, _ = batches.next(args.batch_size)  # [N, ...] on the device, or the mirror it is drawn from
                stats = ddpg_update(actor, target_actor, critic, target_critic, optimizers, b, args)
                updates += 1
            if args.sampler != "async":  # one step of every env, into the replay
                row, episodes = stepper.step(action)
                buffer.append(row)
                global_step += args.num_envs * run.world  # the job's env steps: every rank steps as many
                run.episodes(episodes, global_step)
            if run.periodic(global_step, **stats, updates=updates, **waits):
                break  # --stop-at-return reached, or a signal: finish ends as Ctrl-C does
        run.finish(global_step)  # the last row, checkpoint and evaluation
    return run.exit_code


# ----------------------------------------------------------------------------------- async sampling
# Only --sampler async runs this: a sampler process stepping the envs into the shared replay.


def sampler_main(args: Args, buffer: ReplayBuffer, obs_norm: ObsNorm, link: AsyncReplay, proc: SamplerProcess) -> None:
    """Async sampler process: steps the envs and appends to the shared replay with the newest actor the learner
    published; waits while it is more than max_lag_steps ahead of what the learner's updates cover."""
    with closing(make_envs(args, make_env, "serial")) as envs:
        step = link.start_step
        stepper = EnvStepper(envs, args, obs_norm, distributed.env_seed(args.seed + step, args.num_envs))
        actor = proc.place(make_networks(args, envs.single_observation_space, envs.single_action_space)[0], args.bf16)
        torch.manual_seed(distributed.rank_seed(args.seed + 1))  # the exploration noise: a stream of each rank's own
        while step < args.total_timesteps:
            if not link.ready(proc, step, actor, args.max_lag_steps):  # too far ahead of the learner
                continue
            row, episodes = stepper.step(stepper.act(actor, link.pacer.warming_up(step), proc.device))
            buffer.append(row)
            step += args.num_envs * distributed.world_size()  # counted as global steps, like the learner's
            link.report(episodes, step)


if __name__ == "__main__":
    sys.exit(main())
