"""PPO (clipped objective, GAE) for continuous actions (MuJoCo, any Box): serial, parallel and async sampling.

    python algos/ppo_mujoco.py                                    # HalfCheetah-v5, the PPO paper's settings
    python algos/ppo_mujoco.py --preset pendulum                  # InvertedPendulum-v5 to 1000 in a minute
    python algos/ppo_mujoco.py --sampler async --num-envs 4       # sampler process + learner
    torchrun --standalone --nproc-per-node 2 algos/ppo_mujoco.py  # 2 ranks, gradients averaged

The policy is a diagonal Gaussian: an MLP gives the mean, the log standard deviations are parameters of their own
(state-independent), and the critic is a separate MLP (Schulman et al. 2017). Actions are sampled unbounded, trained on
as sampled, and clipped to the env's bounds only when stepping the env.

Observations are normalised by running statistics and rewards divided by the running standard deviation of the
discounted return (SB3's VecNormalize), both updated by the learner after each PPO update from every rank's rollout
(shared/normalize.py): a rollout is sampled and trained on with the same statistics. The observation statistics are
buffers of the agent, so they travel with its parameters (to the async sampler, the checkpoint, every rank; one rank's
own statistics would not do: on InvertedPendulum the ranks' carts drift apart and two ranks stopped learning at 50).

Envs autoreset on the step after an episode ends (gymnasium's next-step mode): that final row only resets the env, so
it weighs 0 in every loss; its observation is the episode's last, whose value a time-limit truncation bootstraps from
(every MuJoCo v5 episode ends at 1000 steps).

Where to change what: the env in make_env (a wrapper there reaches every sampling mode); the network in make_agent
(Agent here), whose forward(obs) takes raw observations [N, S] and returns the Gaussian mean [N, A], its log-std [N, A]
and values [N], with `obs_norm` (the observation statistics) and `log_std` beside; the loss in ppo_loss, whose stats
dict is logged (a new key is a new progress.csv column); a new per-step quantity (stored in the rollout) is a field in
rollout_example, written in collect, put in learn_from's rows and read by the loss; the schedule in main. An @graphed
step (one CUDA graph under --compile) sees a setting changed between calls (an Args field) at its next call, each value
one graph, 8 at most: pass a schedule as a tensor, and return what the step computes (a write to a setting or to a list
or dict argument is refused).
"""

import importlib.util
import math
import sys
from collections import defaultdict
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

from shared import distributed
from shared.argtypes import Fraction, NonNegFloat, PositiveInt, Range
from shared.buffer import buffer_from_example
from shared.cli import RunArgs, bad_args, parse_args
from shared.compiling import compiled, graphed, set_lr
from shared.device import to_host, upload
from shared.envs import make_envs
from shared.namedarraytuple import namedarraytuple
from shared.normalize import RunningNorm
from shared.precision import autocast
from shared.procs import DoubleBuffer, SamplerProcess
from shared.run import Run


@dataclass
class Args(RunArgs):
    # seed, run folder, resume, checkpoints, evaluation, device, bf16: in shared.cli.RunArgs, the same everywhere
    # experiment
    preset: Literal["mujoco", "pendulum"] = "mujoco"
    """named settings to start from (mujoco: the PPO paper's MuJoCo settings; pendulum: InvertedPendulum-v5 in a minute);
    flags given override them"""
    env_id: str = "HalfCheetah-v5"
    """gymnasium id of an env with vector observations and a continuous (Box) action space"""
    total_timesteps: PositiveInt = 1_000_000
    """env steps summed over all envs"""
    log_every: PositiveInt = 1
    """rollouts between progress rows"""
    # algorithm
    num_envs: PositiveInt = 1
    """environments stepped together on each rank (torchrun); the job's batch is ranks x num_envs x num_steps"""
    num_steps: PositiveInt = 2048
    """steps per env in each rollout"""
    learning_rate: Annotated[float, Range(gt=0, lt=1)] = 3e-4
    """Adam step size at the start"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0 over the run (the job's total_timesteps)"""
    gamma: Fraction = 0.99
    """discount (also of the return whose standard deviation scales the rewards)"""
    gae_lambda: Fraction = 0.95
    """GAE lambda"""
    num_minibatches: PositiveInt = 32
    """minibatches per epoch (their size is the batch / num_minibatches; each rank takes its share)"""
    update_epochs: PositiveInt = 10
    """passes over each rollout"""
    norm_adv: bool = True
    """normalise advantages per minibatch"""
    clip_coef: NonNegFloat = 0.2
    """PPO clipping of the likelihood ratio (and of the value update when clip_vloss)"""
    clip_vloss: bool = True
    """clip the value update around the rollout's values"""
    ent_coef: NonNegFloat = 0.0
    """entropy bonus"""
    vf_coef: NonNegFloat = 0.5
    """value loss weight"""
    max_grad_norm: NonNegFloat = 0.5
    """global gradient-norm clip"""
    hidden: PositiveInt = 64
    """units in each of the 2 tanh hidden layers of the policy and of the critic"""
    init_log_std: Annotated[float, Range(ge=-20, le=5)] = 0.0
    """initial log standard deviation of every action dimension"""
    normalize_obs: bool = True
    """normalise observations by running mean and variance (saved in the checkpoint, frozen in evaluation)"""
    normalize_reward: bool = True
    """divide rewards by the running standard deviation of the discounted return"""
    # infrastructure
    sampler: Literal["serial", "parallel", "async"] = "serial"
    """serial (one process), parallel (envs in worker processes, gymnasium AsyncVectorEnv) or async (sampler process
    collects rollout k+1 with the parameters of update k-1 while the learner trains on rollout k)"""


# Named starting points: --preset NAME, then any flag overrides them. Every field not named keeps its default.
PRESETS = {
    # The PPO paper's MuJoCo settings (Schulman et al. 2017, table 3), which are SB3's PPO defaults and CleanRL's
    # ppo_continuous_action.py; obs and reward normalisation as rl-baselines3-zoo's ppo.yml for MuJoCo.
    "mujoco": Args(),
    # InvertedPendulum-v5: the paper's settings over 8 envs (batch 2048 as in the paper, minibatches of 256), a budget
    # of 150k steps; no reward scaling (every step is worth 1 until the pole falls).
    "pendulum": Args(
        preset="pendulum",
        env_id="InvertedPendulum-v5",
        total_timesteps=150_000,
        num_envs=8,
        num_steps=256,
        num_minibatches=8,
        normalize_reward=False,
    ),
}

# ------------------------------------------------------------------------------------- environments


def make_env(args: Args, render: bool = False) -> Callable[[], gym.Env]:
    """One env, made in the process that steps it: a wrapper added here reaches every sampling mode; plug your own env in
    here (shared/envs.py says how to register one)."""

    def thunk() -> gym.Env:
        return gym.make(args.env_id, render_mode="rgb_array" if render else None)

    return thunk


# ------------------------------------------------------------------------------------------ network


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias: float = 0.0) -> nn.Module:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def gaussian(mean: torch.Tensor, log_std: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-density of action [N, A] under the diagonal Gaussian N(mean, exp(log_std)^2), and its entropy, [N]:
    log p = sum_i -(a_i - mu_i)^2 / (2 sigma_i^2) - log sigma_i - log(2 pi) / 2,  H = sum_i log sigma_i + (1 + log 2 pi) / 2"""
    z = (action - mean) * torch.exp(-log_std)
    log_prob = (-0.5 * z**2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
    entropy = (log_std + 0.5 * (1.0 + math.log(2 * math.pi))).sum(-1).expand_as(log_prob)
    return log_prob, entropy


class Agent(nn.Module):
    """Policy mean and critic: two separate tanh MLPs on the normalised observation; log_std: one parameter per action
    dimension; obs_norm: the observation statistics (buffers, updated by the learner)."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int, init_log_std: float, normalize_obs: bool = True):
        super().__init__()
        self.obs_norm = RunningNorm(obs_dim, normalize_obs)
        mlp = lambda out, std: nn.Sequential(
            layer_init(nn.Linear(obs_dim, hidden)),
            nn.Tanh(),
            layer_init(nn.Linear(hidden, hidden)),
            nn.Tanh(),
            layer_init(nn.Linear(hidden, out), std=std),
        )
        self.actor_mean = mlp(act_dim, 0.01)
        self.critic = mlp(1, 1.0)
        self.log_std = nn.Parameter(torch.full((act_dim,), float(init_log_std)))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """obs [N, S] (raw) -> mean [N, A], log_std [N, A], value [N]."""
        obs = self.obs_norm(obs.float())
        mean = self.actor_mean(obs).float()
        return mean, self.log_std.expand_as(mean), self.critic(obs).float().squeeze(-1)


def make_agent(args: Args, obs_space: gym.Space, act_space: gym.Space) -> nn.Module:
    """The network, for the learner and the async sampler alike: a new network is one edit here (its forward and
    ``obs_norm``: Agent's)."""
    obs_dim, act_dim = int(np.prod(obs_space.shape)), int(np.prod(act_space.shape))
    return Agent(obs_dim, act_dim, args.hidden, args.init_log_std, args.normalize_obs)


class Policy(nn.Module):
    """Evaluation and --export: raw observations [B, ...] -> the deterministic action [B, ...] (the Gaussian's mean,
    clipped to the action bounds) and the mean [B, A]; the observation statistics are the agent's, read as they are."""

    def __init__(self, agent: Agent, space: gym.spaces.Box):
        super().__init__()
        self.agent = agent
        self.shape = space.shape
        self.register_buffer("low", torch.as_tensor(space.low, dtype=torch.float32))
        self.register_buffer("high", torch.as_tensor(space.high, dtype=torch.float32))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean, _, _ = self.agent(obs.float().flatten(1))
        return mean.reshape(-1, *self.shape).clamp(self.low, self.high), mean


# ----------------------------------------------------------------------------------------- sampling

Bootstrap = namedarraytuple("Bootstrap", ["obs", "final_row"])


class EnvState:
    """What a sampler carries between rollouts, per env: raw observation, final-row flag, episode sums, and the
    discounted return so far (whose statistics scale the rewards)."""

    def __init__(self, envs, seed: int):
        self.obs, _ = envs.reset(seed=seed)
        n = len(self.obs)
        self.final_row = np.zeros(n, bool)
        # the episode sums travel in the rollout (ep_return, ep_length), which is how the async sampler's episodes reach
        # the learner; the replay scripts, whose rows hold no episode totals, keep them in shared.envs.EpisodeTally
        self.ep_return = np.zeros(n, np.float64)
        self.ep_length = np.zeros(n, np.int64)
        self.discounted = np.zeros(n, np.float64)  # G <- gamma G + r within the episode
        self.space = envs.single_action_space


def rollout_example(obs_dim: int, act_dim: int, B: int) -> tuple:
    """One step of the rollout by field (allocated [T, B]) and the bootstrap [B]. A new per-step quantity is a field
    here, written in collect and read in learn_from's rows and the loss."""
    zero = np.float32(0)
    acting = dict(obs=np.zeros(obs_dim, np.float32), action=np.zeros(act_dim, np.float32), logprob=zero, value=zero)
    # discounted: the return so far (its statistics scale rewards); ep_*: the episode's totals where episode_end;
    # final_row: the step only reset the env (next-step autoreset)
    env = dict(reward=zero, discounted=zero, terminated=False, episode_end=False, final_row=False, ep_return=0.0, ep_length=0)
    one = namedarraytuple("Rollout", [*acting, *env])(**acting, **env)
    return one, Bootstrap(np.zeros((B, obs_dim), np.float32), np.zeros(B, bool))


@graphed
@compiled
def policy_step(agent: Agent, obs: torch.Tensor, bf16: bool) -> tuple:
    """The acting step: actions [B, A] sampled from the Gaussian policy, unbounded, their log-densities [B] and the
    values [B]."""
    with autocast(obs.device, bf16):
        action_mean, log_std, value = agent(obs)
    action = action_mean + log_std.exp() * torch.randn_like(action_mean)
    return action, gaussian(action_mean, log_std, action)[0], value


@torch.inference_mode()
def collect(envs, agent: Agent, state: EnvState, buf, boot, args: Args, device: torch.device) -> None:
    """Step the envs num_steps times, writing buf [T, B] (raw observations and rewards) and the bootstrap observation
    boot [B]."""
    flat = lambda o: np.asarray(o, np.float32).reshape(len(o), -1)  # [B, S]
    for t in range(args.num_steps):
        buf.obs[t], buf.final_row[t] = flat(state.obs), state.final_row
        action, logprob, value = policy_step(agent, upload(buf.obs[t], device), args.bf16)
        buf.action[t], buf.logprob[t], buf.value[t] = to_host(action, logprob, value)
        env_action = buf.action[t].reshape((-1, *state.space.shape))  # [B, A] -> [B, *action shape]
        next_obs, reward, term, trunc, _ = envs.step(np.clip(env_action, state.space.low, state.space.high))
        raw = np.where(state.final_row, 0.0, reward)  # a final row's reward belongs to no episode
        state.discounted = np.where(state.final_row, 0.0, state.discounted * args.gamma + raw)
        buf.reward[t], buf.discounted[t] = raw, state.discounted
        buf.terminated[t], buf.episode_end[t] = term, term | trunc
        state.ep_return += raw
        state.ep_length += ~state.final_row
        buf.ep_return[t], buf.ep_length[t] = state.ep_return, state.ep_length
        state.ep_return[buf.episode_end[t]] = 0.0
        state.ep_length[buf.episode_end[t]] = 0
        state.obs, state.final_row = next_obs, term | trunc
    boot.obs[:], boot.final_row[:] = flat(state.obs), state.final_row


# ---------------------------------------------------------------------------------- loss and update


def compute_gae(reward, value, next_value, terminated, episode_end, final_row, gamma: float, lam: float):
    """Advantages and returns [T, B], numpy on the host (a loop over T of [B] operations: numpy's are several times
    cheaper than torch's at MuJoCo's few envs). Final rows get 0; `terminated` stops bootstrapping, `episode_end` the
    trace; a truncated row bootstraps from the next row's value, the value of the episode's final observation."""
    T = reward.shape[0]
    next_values = np.concatenate([value[1:], next_value[None]])  # [T, B]: V(s_{t+1})
    delta = reward + gamma * next_values * (1.0 - terminated) - value
    trace = gamma * lam * (1.0 - np.maximum(episode_end, terminated))
    keep = 1.0 - final_row
    adv = np.zeros_like(delta)
    last = np.zeros_like(delta[0])
    for t in reversed(range(T)):
        last = (delta[t] + trace[t] * last) * keep[t]
        adv[t] = last
    return adv, adv + value


@compiled
def ppo_loss(agent: Agent, mb: dict, args: Args) -> tuple:
    """The clipped-PPO loss of one minibatch ``mb`` (tensors [M, ...]; advantages normalised; final rows weigh 0) and
    its statistics, detached."""
    with autocast(mb["weight"].device, args.bf16):
        action_mean, log_std, value = agent(mb["obs"])
    logprob, entropy = gaussian(action_mean, log_std, mb["action"])
    mean = lambda x: (x * mb["weight"]).sum() / mb["weight"].sum().clamp(min=1)  # over the rows that count
    logratio = logprob - mb["logprob"]
    ratio = logratio.exp()
    adv = mb["adv"]
    pg_loss = mean(torch.max(-adv * ratio, -adv * ratio.clamp(1 - args.clip_coef, 1 + args.clip_coef)))
    ret, old_v = mb["ret"], mb["value"]
    if args.clip_vloss:
        v_clipped = old_v + (value - old_v).clamp(-args.clip_coef, args.clip_coef)
        v_loss = 0.5 * mean(torch.max((value - ret) ** 2, (v_clipped - ret) ** 2))
    else:
        v_loss = 0.5 * mean((value - ret) ** 2)
    entropy = mean(entropy)
    loss = pg_loss - args.ent_coef * entropy + args.vf_coef * v_loss
    # Detached tensors, averaged when a row is written (a non-finite one ends the run there): no wait on a GPU per
    # minibatch. A new key here is a new progress column.
    ratio, logratio = ratio.detach(), logratio.detach()
    stats = {
        "policy_loss": pg_loss.detach(),
        "value_loss": v_loss.detach(),
        "entropy": entropy.detach(),
        "approx_kl": mean((ratio - 1) - logratio),
        "clipfrac": mean(((ratio - 1.0).abs() > args.clip_coef).float()),
    }
    return loss, stats


@graphed
def ppo_step(agent: Agent, optimizer, data: dict, i: torch.Tensor, args: Args) -> dict:
    """One clipped-PPO step on the rollout's rows ``i`` [M] of ``data`` [T, B, ...] (one CUDA graph under --compile on a
    GPU); its statistics."""
    B = data["weight"].shape[1]
    mb = {k: v[i // B, i % B] for k, v in data.items()}  # rows [M, ...] of [T, B, ...]
    if args.norm_adv:  # over the minibatches of every rank: their gradients are averaged
        mean_adv, std = distributed.mean_std(mb["adv"], mb["weight"])
        mb["adv"] = (mb["adv"] - mean_adv) / (std + 1e-8)
    loss, stats = ppo_loss(agent, mb, args)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    distributed.average_gradients(agent)
    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
    optimizer.step()
    return stats


def ppo_update(agent: Agent, optimizer, data: dict, args: Args, device: torch.device, generator: torch.Generator) -> dict:
    """Several epochs of clipped-PPO minibatch steps over the rollout's rows ``data`` [T, B, ...]. Every minibatch has
    the same size (one graph under --compile); final rows are in them with weight 0."""
    T, B = data["weight"].shape
    mb_size = T * B // args.num_minibatches
    stats = defaultdict(list)  # name -> per-minibatch values: a new name is a new progress column
    for _ in range(args.update_epochs):
        perm = upload(torch.randperm(T * B, generator=generator).numpy(), device)
        for start in range(0, T * B, mb_size):
            for k, v in ppo_step(agent, optimizer, data, perm[start : start + mb_size], args).items():
                stats[k].append(v)
    return {**stats, "action_std": agent.log_std.detach().exp().mean()}


def learn_from(agent: Agent, return_norm: RunningNorm, optimizer, buf, boot, args: Args, device: torch.device, generator):
    """Rewards scaled, GAE with the learner's current critic, the PPO update, then the observation statistics take the
    rollout; ``buf`` [T, B] and ``boot`` [B] are numpy (possibly shared)."""
    T, B = args.num_steps, args.num_envs
    final_row = buf.final_row  # [T, B]: the rows that only reset their env
    # One copy to a GPU: raw observations [T, B, S], values [T, B], and the discounted returns of the rows that count.
    up = upload({"obs": buf.obs, "boot_obs": boot.obs, "value": buf.value, "discounted": buf.discounted[~final_row]}, device)
    return_norm.update(up["discounted"][:, None])  # the rewards' scale: every discounted return so far, every rank's
    with torch.no_grad(), autocast(device, args.bf16):
        _, _, next_value = agent(up["boot_obs"])
        # async: sampled with the previous parameters, so the values are the current critic's
        value = agent(up["obs"].flatten(0, 1))[2].view(T, B) if args.sampler == "async" else up["value"]
    value, next_value, return_var = to_host(value, next_value, return_norm.var)  # GAE runs on the host
    f32 = lambda x: np.asarray(x, np.float32)
    reward = f32(buf.reward)
    if return_norm.enabled:
        scale = np.sqrt(float(return_var[0]) + 1e-8)
        reward = np.clip(reward / scale, -return_norm.clip, return_norm.clip).astype(np.float32)
    flags = [f32(buf.terminated), f32(buf.episode_end), f32(final_row)]  # [T, B] each
    adv, ret = compute_gae(reward, value, next_value, *flags, args.gamma, args.gae_lambda)
    rows = {"action": buf.action, "logprob": buf.logprob, "value": value, "adv": adv, "ret": ret, "weight": f32(~final_row)}
    data = {"obs": up["obs"], **upload(rows, device)}  # [T, B, ...] each
    stats = ppo_update(agent, optimizer, data, args, device, generator)
    agent.obs_norm.update(up["obs"].flatten(0, 1))  # every observation once (the bootstrap one is next rollout's first)
    return stats


# ------------------------------------------------------------------------------------------ sampler


class Sampler:
    """Where the rollouts come from. serial/parallel: this process collects each with the current parameters; async: a
    sampler process (``sampler_main``) collects rollout k + 1 while the learner trains on rollout k, in the slots of a
    double buffer that carry the parameters back to it."""

    def __init__(self, args: Args, run: Run, agent: Agent, first: int, last: int):
        self.args, self.run = args, run
        obs_dim, act_dim = int(np.prod(run.obs_space.shape)), int(np.prod(run.act_space.shape))
        example, boot_example = rollout_example(obs_dim, act_dim, args.num_envs)
        if args.sampler == "async":
            self.buffers = DoubleBuffer(example, (args.num_steps, args.num_envs), module=agent)
            self.boots = [buffer_from_example(boot_example, (), shared=True) for _ in range(2)]
            self.worker = run.start_sampler(sampler_main, args, self.buffers, self.boots, first, last)
        else:
            self.envs = run.hold(make_envs(args, make_env, args.sampler))
            # A resumed run starts fresh episodes; every env of every rank has a seed of its own.
            self.state = EnvState(self.envs, distributed.env_seed(args.seed + first, args.num_envs))
            self.buf = buffer_from_example(example, (args.num_steps, args.num_envs))  # [T, B]
            self.boot = buffer_from_example(boot_example, ())  # [B]

    def rollout(self, it: int, agent: Agent, global_step: int) -> tuple:
        """Rollout ``it`` [T, B] and its bootstrap row [B]; records the episodes ended in it."""
        if self.args.sampler == "async":  # sampled by the other process with the parameters of update it - 1
            buf, boot = self.buffers.reader_acquire(it, self.worker.check), self.boots[it % 2]
        else:
            collect(self.envs, agent, self.state, self.buf, self.boot, self.args, self.run.device)
            buf, boot = self.buf, self.boot
        self.run.episodes(zip(buf.ep_return[buf.episode_end].tolist(), buf.ep_length[buf.episode_end].tolist()), global_step)
        return buf, boot

    def release(self, it: int, agent: Agent) -> None:
        """async: the slot goes back with the new parameters: rollout it + 2 uses them."""
        if self.args.sampler == "async":
            self.buffers.reader_release(it, module=agent, version=it + 1)


# --------------------------------------------------------------------------------------------- main


def check_args(args: Args) -> None:
    """What relates the flags to each other (each field's own range is declared on it): exit 2, one line."""
    batch = args.num_envs * args.num_steps
    if batch % args.num_minibatches:
        bad_args(f"--num-minibatches {args.num_minibatches} does not divide the batch {batch} (num_envs x num_steps)")


def make_learner(args: Args, run: Run) -> tuple:
    """The agent (its observation statistics included), its optimiser, the minibatch generator and the statistics of the
    discounted return."""
    if not isinstance(run.obs_space, gym.spaces.Box):
        bad_args(f"--env-id {args.env_id}: PPO here needs Box observations, got {run.obs_space}")
    agent = make_agent(args, run.obs_space, run.act_space).to(run.device)
    fused = {"fused": True} if run.device.type in ("cpu", "cuda") else {}  # one kernel for all parameters
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, **fused)
    generator = torch.Generator().manual_seed(args.seed)
    return_norm = RunningNorm(1, args.normalize_reward).to(run.device)  # statistics of the discounted return
    return agent, optimizer, generator, return_norm


# Evaluation's act (shared.evaluation): the observations [B, ...], then by parameter name only those of draws,
# starts, rewards, mask that it names (another name is refused at the start: a renamed one would never be passed).
def act(policy: Policy, device: torch.device, obs: np.ndarray) -> np.ndarray:
    """Evaluation: Policy's deterministic action [B, ...] at observations [B, ...]."""
    action, _ = policy(upload(obs, device))
    return to_host(action)


def main() -> int:
    args = parse_args(Args, PRESETS, check_args)
    batch = args.num_envs * args.num_steps  # a rank's rollout; --log-every counts rollouts
    run = Run(args, __file__, make_env, action_space=gym.spaces.Box, iteration_steps=batch)
    run.setup()  # this process: TF32, Ctrl-C/SIGTERM, the torchrun job, cores, seeds
    with run.allocating("hidden"):  # sizes this machine cannot hold: exit 2
        agent, optimizer, generator, return_norm = make_learner(args, run)
    policy = Policy(agent, run.act_space).to(run.device)
    start = run.begin(
        partial(act, policy, run.device), model=agent, optimizer=optimizer, generator=generator, return_norm=return_norm
    )
    if args.eval_only or args.export:  # with --resume: evaluate the checkpoint's policy or export it, train nothing
        return run.evaluate_or_export(policy, ["action", "mean"])
    batch *= run.world  # the job's: every rank's rollout
    first, num_iterations = start.global_step // batch, max(args.total_timesteps // batch, 1)
    global_step = start.global_step
    with run:
        sampler = Sampler(args, run, agent, first, num_iterations)
        for it in range(first, num_iterations):
            lr = args.learning_rate * (1.0 - it / num_iterations) if args.anneal_lr else args.learning_rate
            set_lr(optimizer, lr)  # in place: under --compile on a GPU the update's graph reads it
            global_step += batch
            buf, boot = sampler.rollout(it, agent, global_step)
            stats = learn_from(agent, return_norm, optimizer, buf, boot, args, run.device, generator)
            sampler.release(it, agent)  # async: rollout it + 2 is sampled with the new parameters
            if run.periodic(global_step, learning_rate=lr, **stats):
                break  # --stop-at-return reached, or a signal: finish ends as Ctrl-C does
        run.finish(global_step)  # the last row, checkpoint and evaluation
    return run.exit_code


# ----------------------------------------------------------------------------------- async sampling
# Only --sampler async runs this: a sampler process collecting rollouts into the double buffer.


def sampler_main(args: Args, buffers: DoubleBuffer, boots: list, first: int, last: int, proc: SamplerProcess) -> None:
    """Sampler process: rollout k goes to slot k % 2, collected with the parameters (observation statistics included)
    the learner left in that slot when it released rollout k - 2 (update k - 1): exactly one update behind the learner."""
    with closing(make_envs(args, make_env, "serial")) as envs:
        state = EnvState(envs, distributed.env_seed(args.seed + first, args.num_envs))
        agent = proc.place(make_agent(args, envs.single_observation_space, envs.single_action_space), args.bf16)
        torch.manual_seed(distributed.rank_seed(args.seed + 1))  # the policy's noise: a stream of each rank's own
        for k in range(first, last):
            buf = buffers.writer_acquire(k, proc.check, module=agent)
            collect(envs, agent, state, buf, boots[k % 2], args, proc.device)
            buffers.writer_release(k)


if __name__ == "__main__":
    sys.exit(main())
