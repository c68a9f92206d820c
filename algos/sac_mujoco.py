"""Soft Actor-Critic for continuous control (MuJoCo, any Box action space), every sampler.

    python algos/sac_mujoco.py                     # HalfCheetah-v5, one update per env step
    python algos/sac_mujoco.py --sampler async     # a sampler process fills a shared replay while this one learns
    python algos/sac_mujoco.py --preset pendulum   # Pendulum-v1 in 20k steps

SAC (Haarnoja et al. 2018, with automatic entropy tuning): a tanh-squashed Gaussian policy trained through the
reparameterisation trick, twin Q critics with the minimum in the target, soft target updates (tau) and a temperature
alpha tuned towards the target entropy -|A|. replay_ratio is samples consumed per env step (256 at batch 256: the
paper's one update per step). n-step targets sum the rewards only; n = 1 is the paper's SAC. Actions are in [-1, 1]
inside the agent and the replay and scaled to the env's bounds when stepping; --normalize-obs keeps running
observation statistics, frozen in evaluation and in --export.

Where to change what: the env in make_env (a wrapper there reaches every sampling mode); the networks in make_networks:
Actor (mean_and_log_std(obs) -> the pre-tanh Gaussian's mean and log std, [N, A] each, which evaluation and --export
read; forward(obs) -> a sampled action in [-1, 1] [N, A] and its log-probability [N]) and Critics (forward(obs, action)
-> Q-values [K, N]); the losses in sac_critic_loss, sac_actor_loss and sac_alpha_loss, whose statistics sac_update
returns (a new key is a new progress.csv column); the evaluation and --export action in Policy; a new stored quantity
(per step, in the replay) is an entry in ROW, written in EnvStepper.step and read by the loss (every batch field but
HOST_ONLY is uploaded); the schedule in main. An @graphed step (one CUDA graph under --compile) sees a setting changed
between calls (an Args field) at its next call, each value one graph, 8 at most: pass a schedule as a tensor, and
return what the step computes (a write to a setting or to a list or dict argument is refused).
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
from shared.argtypes import Fraction, NonNegInt, PositiveFloat, PositiveInt, Range
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
    """named settings, flags given override them (mujoco: the SAC paper's, HalfCheetah-v5; pendulum: Pendulum-v1, 20k steps)"""
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
    """samples consumed per env step (256 with batch 256: one update per step, as in the paper)"""
    min_steps_learn: NonNegInt = 5_000
    """env steps of uniformly random actions collected before learning starts (in each rank's replay)"""
    learning_rate: Annotated[float, Range(gt=0, lt=1)] = 3e-4
    """Adam step size of the actor, the critics and the temperature"""
    hidden: PositiveInt = 256
    """units in each of the two hidden layers of the actor and the critics"""
    gamma: Fraction = 0.99
    """discount"""
    tau: Annotated[float, Range(gt=0, le=1)] = 0.005
    """soft target update: the target critics move this fraction of the way every update"""
    n_step_return: PositiveInt = 1
    """steps summed before bootstrapping"""
    autotune: bool = True
    """tune the temperature alpha towards the target entropy -|A|"""
    alpha: PositiveFloat = 0.2
    """temperature: fixed value without --autotune, initial value with it"""
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
    # rl-baselines3-zoo's sac.yml Pendulum-v1 budget (20k steps), learning after 1000 random steps.
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

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0


def squashed_gaussian(mean: torch.Tensor, log_std: torch.Tensor, noise: torch.Tensor) -> tuple:
    """a = tanh(u), u = mean + std * noise; returns (a [N, A], log pi(a|s) [N]). The exact change of variables:
    log pi(a) = log N(u; mean, std) - sum log(1 - tanh(u)^2), with log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)),
    finite where tanh(u) rounds to +-1."""
    u = mean + log_std.exp() * noise
    log_normal = (-0.5 * noise**2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
    log_det = (2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))).sum(-1)
    return torch.tanh(u), log_normal - log_det


class Actor(nn.Module):
    """s -> (mean, log_std) of the pre-tanh Gaussian, 2 hidden ReLU layers; forward samples an action from it."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(obs_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 2 * act_dim)
        )

    def mean_and_log_std(self, obs: torch.Tensor) -> tuple:
        mean, log_std = self.net(obs).chunk(2, dim=-1)
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)  # [N, A] each

    def forward(self, obs: torch.Tensor) -> tuple:
        mean, log_std = self.mean_and_log_std(obs)
        return squashed_gaussian(mean, log_std, torch.randn_like(mean))  # a in [-1, 1] [N, A], log pi [N]


# Batched rather than two plain MLPs: one kernel per layer for both critics (small kernels are launch-bound on a GPU),
# and two MLPs would draw other initial weights.
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
    return Actor(obs_dim, act_dim, args.hidden), Critics(obs_dim, act_dim, args.hidden)


class Policy(nn.Module):
    """Evaluation and --export: raw observations [B, S] -> the deterministic action tanh(mean) scaled to the env's
    bounds [B, A], and the Gaussian's mean before tanh [B, A]; the observation statistics are read, never updated."""

    def __init__(self, actor: Actor, obs_norm: ObsNorm, space: gym.spaces.Box):
        super().__init__()
        self.actor = actor
        self.obs_norm = obs_norm
        self.register_buffer("low", torch.as_tensor(space.low, dtype=torch.float32))
        self.register_buffer("high", torch.as_tensor(space.high, dtype=torch.float32))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, _ = self.actor.mean_and_log_std(self.obs_norm.normalize(obs.float()))
        return scale_action(torch.tanh(mean), self.low, self.high), mean


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
def policy_step(actor: Actor, obs: torch.Tensor, bf16: bool) -> torch.Tensor:
    """The acting step: actions [B, A] in [-1, 1] sampled from the policy at observations [B, S]."""
    with torch.no_grad(), autocast(obs.device, bf16):  # here, not around the caller: a replay runs none of it
        return actor(obs)[0].float()


class EnvStepper:
    """Steps the envs one step at a time; keeps per-env episode state. Actions: uniform in [-1, 1] before learning
    starts, then sampled from the policy."""

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
        return to_host(policy_step(actor, obs, self.args.bf16))

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


def critic_target(batch: dict, actor: Actor, target_critics: Critics, alpha: torch.Tensor) -> torch.Tensor:
    """n-step soft targets [N]: R + (1 - terminated_n) gamma^k (min_j Q'_j(s', a') - alpha log pi(a'|s')), a' ~ pi(.|s').
    A truncation inside the window bootstraps from the episode's final observation s'."""
    with torch.no_grad():
        next_action, next_log_pi = actor(batch["next_observation"])
        q_next = target_critics(batch["next_observation"], next_action).float().min(0).values
        v_next = q_next - alpha * next_log_pi.float()
        return batch["n_step_return"] + (1.0 - batch["terminated_n"]) * batch["bootstrap_discount"] * v_next


@compiled
def sac_critic_loss(actor: Actor, critics: Critics, target_critics: Critics, b: dict, alpha: torch.Tensor, bf16: bool):
    """The twin critics' loss on the batch ``b`` (soft targets under no_grad) and its statistics, detached."""
    with autocast(alpha.device, bf16):
        y = critic_target(b, actor, target_critics, alpha)  # [N]
        q = critics(b["observation"], b["action"]).float()  # [2, N]
    loss = 0.5 * ((q - y) ** 2).mean(1).sum()
    return loss, {"qf_loss": loss.detach(), "q_values": q.detach().mean()}


@compiled
def sac_actor_loss(actor: Actor, critics: Critics, obs: torch.Tensor, alpha: torch.Tensor, bf16: bool) -> tuple:
    """The actor's loss E[alpha log pi(a|s) - min_j Q_j(s, a)], a ~ pi(.|s) reparameterised, and log pi [N] detached
    (for the temperature's loss and the entropy statistic)."""
    with autocast(obs.device, bf16):
        pi_action, log_pi = actor(obs)
        q_pi = critics(obs, pi_action).float().min(0).values
    log_pi = log_pi.float()
    loss = (alpha * log_pi - q_pi).mean()
    return loss, log_pi.detach()


@compiled
def sac_alpha_loss(log_alpha: torch.Tensor, log_pi: torch.Tensor, target_entropy: float) -> torch.Tensor:
    """The temperature's loss: alpha grows while the policy's entropy (-log pi [N]) is below the target entropy."""
    return -(log_alpha * (log_pi + target_entropy)).mean()


@graphed
def sac_update(actor, critics, target_critics, log_alpha, optimizers, b: dict | DeviceReplay, args: Args) -> dict:
    """One SAC update from the batch ``b`` (tensors [N, ...], or the replay's mirror, sampled here): critics, actor,
    temperature, then soft targets (one CUDA graph under --compile on a GPU)."""
    b = b.sample(args.batch_size) if isinstance(b, DeviceReplay) else b  # a CUDA learner's batch: drawn in this graph
    actor_opt, critic_opt = optimizers["actor_optimizer"], optimizers["critic_optimizer"]
    target_entropy = -float(b["action"].shape[1])  # -|A|
    alpha = log_alpha.exp().detach()

    critic_loss, critic_stats = sac_critic_loss(actor, critics, target_critics, b, alpha, args.bf16)
    critic_opt.zero_grad(set_to_none=True)
    critic_loss.backward()
    distributed.average_gradients(critics)
    critic_opt.step()

    # the actor loss needs dQ/da only: skip the critics' weight gradients
    critics.requires_grad_(False)
    actor_loss, log_pi = sac_actor_loss(actor, critics, b["observation"], alpha, args.bf16)
    actor_opt.zero_grad(set_to_none=True)
    actor_loss.backward()
    distributed.average_gradients(actor)
    actor_opt.step()
    critics.requires_grad_(True)

    if args.autotune:
        alpha_loss = sac_alpha_loss(log_alpha, log_pi, target_entropy)
        optimizers["alpha_optimizer"].zero_grad(set_to_none=True)
        alpha_loss.backward()
        distributed.average_gradients(log_alpha)
        optimizers["alpha_optimizer"].step()

    with torch.no_grad():
        for target, p in zip(target_critics.parameters(), critics.parameters()):
            target.lerp_(p, args.tau)
    # Detached tensors: read when a row is written (a non-finite one ends the run there), never per update.
    return {**critic_stats, "actor_loss": actor_loss.detach(), "alpha": alpha, "entropy": -log_pi.mean()}


# --------------------------------------------------------------------------------------------- main


def make_learner(args: Args, run: Run) -> tuple[Actor, Critics, Critics, torch.Tensor, dict, ObsNorm]:
    """The actor, the critics and their target copy, log alpha, the optimisers by their checkpoint names, and the
    observation statistics."""
    actor, critics = (net.to(run.device) for net in make_networks(args, run.obs_space, run.act_space))
    target_critics = copy.deepcopy(critics).requires_grad_(False)
    log_alpha = torch.tensor(math.log(args.alpha), device=run.device, requires_grad=True)
    fused = {"fused": True} if run.device.type in ("cpu", "cuda") else {}
    optimizers = {
        "actor_optimizer": torch.optim.Adam(actor.parameters(), lr=args.learning_rate, **fused),
        "critic_optimizer": torch.optim.Adam(critics.parameters(), lr=args.learning_rate, **fused),
        "alpha_optimizer": torch.optim.Adam([log_alpha], lr=args.learning_rate),
    }
    obs_norm = ObsNorm(int(np.prod(run.obs_space.shape)), args.normalize_obs, shared=args.sampler == "async")
    return actor, critics, target_critics, log_alpha, optimizers, obs_norm


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
    """Evaluation: Policy's deterministic action [B, A] at observations [B, S]."""
    return to_host(policy(upload(obs, device))[0])


def main() -> int:
    args = parse_args(Args, PRESETS, check_replay_sizes)
    run = Run(args, __file__, make_env, action_space=gym.spaces.Box, bounded=True, stop_window=10)
    run.setup()  # this process: TF32, Ctrl-C/SIGTERM, the torchrun job, cores, seeds
    with run.allocating("buffer_size", "hidden"):  # sizes this machine cannot hold: exit 2
        actor, critics, target_critics, log_alpha, optimizers, obs_norm = make_learner(args, run)
        buffer = None if args.eval_only or args.export else make_replay(args, run)  # evaluating or exporting: no replay
        batches = ReplayBatches(buffer, HOST_ONLY, run.device, obs_norm)  # a CUDA learner samples on the device
    policy = Policy(actor, obs_norm, run.act_space).to(run.device)
    saved = dict(actor=actor, critics=critics, target_critics=target_critics, log_alpha=log_alpha, **optimizers)
    start = run.begin(partial(act, policy, run.device), buffer, **saved, obs_norm=obs_norm)
    if args.eval_only or args.export:  # with --resume: evaluate the checkpoint's policy or export it, train nothing
        return run.evaluate_or_export(policy, ["action", "mean"])
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
                stats = sac_update(actor, critics, target_critics, log_alpha, optimizers, b, args)
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
        torch.manual_seed(distributed.rank_seed(args.seed + 1))  # the policy's noise: a stream of each rank's own
        while step < args.total_timesteps:
            if not link.ready(proc, step, actor, args.max_lag_steps):  # too far ahead of the learner
                continue
            row, episodes = stepper.step(stepper.act(actor, link.pacer.warming_up(step), proc.device))
            buffer.append(row)
            step += args.num_envs * distributed.world_size()  # counted as global steps, like the learner's
            link.report(episodes, step)


if __name__ == "__main__":
    sys.exit(main())
