"""Recurrent PPO: an LSTM policy for partially observed tasks, discrete or continuous actions; serial, parallel and async
sampling.

    python algos/ppo_lstm.py --num-envs 8                        # Breakout, Nature CNN -> LSTM
    python algos/ppo_lstm.py --preset cartpole                   # CartPole-v1 without velocities
    python algos/ppo_lstm.py --preset pendulum                   # Pendulum-v1 without angular velocity
    python algos/ppo_lstm.py --preset cartpole --no-lstm         # the same without memory (the ablation)
    torchrun --standalone --nproc-per-node 2 algos/ppo_lstm.py   # 2 ranks, gradients averaged

PPO's clipped objective and GAE, with ppo_atari.py's logits or ppo_mujoco.py's Gaussian (a state-independent log-std).
The sampler carries each env's LSTM state from step to step and rollout to rollout, and stores the state each env held at
the rollout's first row; the learner replays the LSTM from there over whole env sequences (minibatches split the envs,
never time), the state zeroed where an episode starts, so its first pass gives the sampler's log-probabilities and values
(PPO's first ratio is 1).

Envs autoreset on the step after an episode ends (gymnasium's next-step mode): that final row only resets the env, so it
weighs 0 in every loss; its observation is the episode's last, seen with the episode's state, whose value a time-limit
truncation bootstraps from; the row after it starts from a zero state. On Atari a lost life ends the training episode
(no bootstrap across it) but neither the game nor the LSTM's memory.

Where to change what: the env in make_env (a wrapper there reaches every sampling mode); the network in make_agent
(Agent here), any nn.Module with `discrete` (Discrete actions, else Box), forward(obs, state, episode_start) from
observations [T * B, ...] (rows time-major) and the state, zeroed before the rows where episode_start [T, B], to the
policy's outputs [T * B, A] (logits or a Gaussian's mean), values [T * B] and the last state, policy(out, mask, action)
to the action (sampled where None), its log-probability and entropy, initial_state(B), obs_norm (observation
statistics) and, continuous, log_std; the loss in ppo_loss, whose stats dict is logged (a new key is a new progress.csv
column); a new per-step quantity (stored in the rollout) is a field in rollout_example, written in collect, put in
learn_from's rows and read by the loss; the schedule in main. An @graphed step (one CUDA graph under --compile) sees a
setting changed between calls (an Args field) at its next call, each value one graph, 8 at most: pass a schedule as a
tensor, and return what the step computes (a write to a setting or to a list or dict argument is refused).
"""

import importlib.util
import math
import sys
from collections import defaultdict
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
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
from torch.distributions import Categorical

from shared import distributed
from shared.argtypes import Fraction, NonNegFloat, NonNegInt, PositiveInt, Range
from shared.atari import is_atari, make_atari_env
from shared.buffer import buffer_from_example, on_device
from shared.cli import RunArgs, bad_args, parse_args
from shared.compiling import compiled, enabled, graphed, set_lr
from shared.device import to_host, upload
from shared.dict_obs import DictTorso, is_dict, obs_example, without_text
from shared.envs import action_mask, image_shape, make_envs, observe_only
from shared.evaluation import Draws
from shared.namedarraytuple import namedarraytuple
from shared.normalize import RunningNorm
from shared.precision import autocast, channels_last
from shared.procs import DoubleBuffer, SamplerProcess
from shared.rnn import lstm_stretches
from shared.run import Run


@dataclass
class Args(RunArgs):
    # seed, run folder, resume, checkpoints, evaluation, device, bf16: in shared.cli.RunArgs, the same everywhere
    # experiment
    preset: Literal["atari", "cartpole", "pendulum"] = "atari"
    """named settings to start from (atari: CleanRL's ppo_atari_lstm settings; cartpole: CartPole-v1 without its
    velocities, pendulum: Pendulum-v1 without its angular velocity, both with rl-baselines3-zoo's RecurrentPPO settings);
    flags given override them"""
    env_id: str = "BreakoutNoFrameskip-v4"
    """gymnasium id: an Atari `*NoFrameskip-v4` game (Nature CNN) or an env with vector observations (MLP), with discrete
    (Discrete) or continuous (Box) actions"""
    total_timesteps: PositiveInt = 10_000_000
    """agent steps summed over all envs (Atari: 4 emulator frames each)"""
    log_every: PositiveInt = 1
    """rollouts between progress rows"""
    # algorithm
    num_envs: PositiveInt = 8
    """environments stepped together on each rank (torchrun); the job's batch is ranks x num_envs x num_steps"""
    num_steps: PositiveInt = 128
    """steps per env in each rollout: the length of every sequence the learner replays"""
    learning_rate: Annotated[float, Range(gt=0, lt=1)] = 2.5e-4
    """Adam step size at the start"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0 over the run (the job's total_timesteps)"""
    gamma: Fraction = 0.99
    """discount (also of the return whose standard deviation scales the rewards)"""
    gae_lambda: Fraction = 0.95
    """GAE lambda"""
    num_minibatches: PositiveInt = 4
    """minibatches per epoch, each num_envs / num_minibatches whole env sequences (on every rank)"""
    update_epochs: PositiveInt = 4
    """passes over each rollout"""
    norm_adv: bool = True
    """normalise advantages per minibatch"""
    clip_coef: NonNegFloat = 0.1
    """PPO clipping of the likelihood ratio (and of the value update when clip_vloss)"""
    clip_vloss: bool = True
    """clip the value update around the rollout's values"""
    ent_coef: NonNegFloat = 0.01
    """entropy bonus"""
    vf_coef: NonNegFloat = 0.5
    """value loss weight"""
    max_grad_norm: NonNegFloat = 0.5
    """global gradient-norm clip"""
    hidden: PositiveInt = 128
    """units of the LSTM (its input: the torso's 512 features for images, 64 for vectors)"""
    lstm: bool = True
    """use the LSTM; --no-lstm puts a feed-forward layer of the same width in its place (the ablation)"""
    init_log_std: Annotated[float, Range(ge=-20, le=5)] = 0.0
    """continuous actions: initial log standard deviation of every action dimension"""
    normalize_obs: bool = False
    """vector observations: normalise them by running mean and variance (in the checkpoint, frozen in evaluation)"""
    normalize_reward: bool = False
    """divide rewards by the running standard deviation of the discounted return"""
    # environment
    observe_indices: tuple[int, ...] = ()
    """vector observations: keep only these components (0 2 on CartPole: positions without velocities)"""
    noop_max: NonNegInt = 30
    """Atari: up to this many random no-ops at reset (paper convention 30)"""
    sticky_actions: Annotated[float, Range(ge=0, lt=1)] = 0.0
    """Atari: probability of repeating the previous action (0: paper convention, no sticky actions)"""
    clip_rewards: bool = True
    """Atari: train on the sign of the reward (logged returns stay unclipped)"""
    life_loss_terminal: bool = True
    """Atari: a lost life ends the training episode for bootstrapping (the game itself goes on)"""
    # infrastructure
    sampler: Literal["serial", "parallel", "async"] = "serial"
    """serial (one process), parallel (ale-py threads / gymnasium AsyncVectorEnv) or async (sampler process collects rollout
    k+1 with the parameters of update k-1 while the learner trains on rollout k)"""


# Named starting points: --preset NAME, then any flag overrides them. Every field not named keeps its default.
PRESETS = {
    # CleanRL's ppo_atari_lstm.py (its LSTM of 128 units, PPO's Atari settings); 4 stacked frames as everywhere here.
    "atari": Args(),
    # rl-baselines3-zoo, hyperparams/ppo_lstm.yml (RecurrentPPO), CartPoleNoVel-v1: 8 envs x 32 steps, batch 256 in one
    # minibatch, 20 epochs, lr 1e-3 annealed (its clip range is annealed too; here it stays 0.2), gamma 0.98, lambda 0.8,
    # no entropy bonus; observations and rewards normalised, as the zoo's published agent (sb3/ppo_lstm-CartPoleNoVel-v1:
    # normalize True). Ours: an LSTM of 64 units (the zoo's default is 256).
    "cartpole": Args(
        preset="cartpole",
        env_id="CartPole-v1",
        observe_indices=(0, 2),
        total_timesteps=100_000,
        num_envs=8,
        num_steps=32,
        num_minibatches=1,
        update_epochs=20,
        gae_lambda=0.8,
        gamma=0.98,
        ent_coef=0.0,
        learning_rate=1e-3,
        clip_coef=0.2,
        clip_vloss=False,
        hidden=64,
        normalize_obs=True,
        normalize_reward=True,
    ),
    # rl-baselines3-zoo, hyperparams/ppo_lstm.yml, PendulumNoVel-v1: 4096 steps a rollout, 10 epochs, lr 1e-3 constant,
    # gamma 0.9, lambda 0.95, clip 0.2, no entropy bonus. Not the zoo's: its gSDE exploration (a state-independent
    # log-std here, with which its 100k steps reach about -450: 200k here), its 4 envs x 1024 steps in minibatches of 128
    # steps (whole sequences here: 16 envs x 256 steps, minibatches of 2 envs); observations and rewards normalised as
    # ppo_mujoco.py.
    "pendulum": Args(
        preset="pendulum",
        env_id="Pendulum-v1",
        observe_indices=(0, 1),
        total_timesteps=200_000,
        num_envs=16,
        num_steps=256,
        num_minibatches=8,
        update_epochs=10,
        gamma=0.9,
        gae_lambda=0.95,
        ent_coef=0.0,
        learning_rate=1e-3,
        anneal_lr=False,
        clip_coef=0.2,
        hidden=64,
        normalize_obs=True,
        normalize_reward=True,
    ),
}

# ------------------------------------------------------------------------------------- environments


def make_env(args: Args, render: bool = False) -> Callable[[], gym.Env]:
    """One env, made in the process that steps it: a wrapper added here reaches every sampling mode. Atari ids get the
    papers' preprocessing (shared/atari.py), other ids a plain gym.make, optionally observing only some entries."""

    def thunk() -> gym.Env:
        if is_atari(args.env_id):
            return make_atari_env(args.env_id, args.noop_max, args.sticky_actions, render)
        env = gym.make(args.env_id, render_mode="rgb_array" if render else None)
        env = without_text(env)  # Dict observations: their strings (MiniGrid's mission) dropped
        return observe_only(env, args.observe_indices) if args.observe_indices else env

    return thunk


# ------------------------------------------------------------------------------------------ network


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias: float = 0.0) -> nn.Module:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def masked(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``logits`` [N, A] with the actions ``mask`` [N, A] forbids at the lowest float: probability 0 when sampling and in
    the ratios, no term in the entropy (0 * logit). Envs without masks pass all True, which changes nothing."""
    return logits.masked_fill(~mask, torch.finfo(logits.dtype).min)


def gaussian(mean: torch.Tensor, log_std: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-density of action [N, A] under the diagonal Gaussian N(mean, exp(log_std)^2), and its entropy, [N]:
    log p = sum_i -(a_i - mu_i)^2 / (2 sigma_i^2) - log sigma_i - log(2 pi) / 2, H = sum_i log sigma_i + (1 + log 2 pi) / 2"""
    z = (action - mean) * torch.exp(-log_std)
    log_prob = (-0.5 * z**2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
    entropy = (log_std + 0.5 * (1.0 + math.log(2 * math.pi))).sum(-1).expand_as(log_prob)
    return log_prob, entropy


RnnState = namedarraytuple("RnnState", ["h", "c"])  # each [B, hidden]


class Agent(nn.Module):
    """torso (Nature CNN for images, uint8 scaled inside; 64x64 tanh MLP for vectors; for a gymnasium Dict space, one
    encoder per key) -> LSTM -> policy head (logits, or a Gaussian mean and one log-std per action dimension) and value
    head."""

    def __init__(
        self,
        obs_shape: tuple[int, ...] | gym.spaces.Dict,
        action_space: gym.Space,
        hidden: int,
        lstm: bool = True,
        init_log_std: float = 0.0,
        normalize_obs: bool = False,
    ):
        super().__init__()
        self.dict = is_dict(obs_shape)
        self.image = not self.dict and len(obs_shape) == 3
        self.hidden = hidden
        self.recurrent = lstm
        self.discrete = isinstance(action_space, gym.spaces.Discrete)
        n_out = int(action_space.n) if self.discrete else int(np.prod(action_space.shape))
        if self.dict:
            self.torso = DictTorso(obs_shape, layer_init)  # ValueError: an entry it cannot take
            width = self.torso.width
        elif self.image:
            c, h, w = image_shape(obs_shape)  # ValueError with the reason when the CNN cannot take the images
            self.channels_last = tuple(obs_shape) != (c, h, w)
            conv = nn.Sequential(
                layer_init(nn.Conv2d(c, 32, 8, stride=4)),
                nn.ReLU(),
                layer_init(nn.Conv2d(32, 64, 4, stride=2)),
                nn.ReLU(),
                layer_init(nn.Conv2d(64, 64, 3, stride=1)),
                nn.ReLU(),
                nn.Flatten(),
            )
            n_flat = conv(torch.zeros(1, c, h, w)).shape[1]  # 64 * 7 * 7 for 84x84 frames
            self.torso = nn.Sequential(*conv, layer_init(nn.Linear(n_flat, 512)), nn.ReLU())
            width = 512
        else:
            obs_dim = int(np.prod(obs_shape))
            self.torso = nn.Sequential(layer_init(nn.Linear(obs_dim, 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)), nn.Tanh())
            width = 64
        vector = not (self.image or self.dict)  # --normalize-obs: Box vectors only
        self.obs_norm = RunningNorm(obs_dim if vector else 1, normalize_obs and vector)
        if lstm:
            self.core = nn.LSTM(width, hidden)
            for name, p in self.core.named_parameters():  # as CleanRL's ppo_atari_lstm: orthogonal, zero biases
                nn.init.constant_(p, 0.0) if "bias" in name else nn.init.orthogonal_(p, 1.0)
        else:
            self.core = nn.Sequential(layer_init(nn.Linear(width, hidden)), nn.Tanh())
        self.actor = layer_init(nn.Linear(hidden, n_out), std=0.01)
        self.critic = layer_init(nn.Linear(hidden, 1), std=1.0)
        if not self.discrete:
            self.log_std = nn.Parameter(torch.full((n_out,), float(init_log_std)))

    def initial_state(self, batch: int, device=None) -> RnnState:
        z = torch.zeros(batch, self.hidden, device=device)
        return RnnState(z, z.clone())

    def forward(self, obs, state: RnnState, episode_start: torch.Tensor, start_rows: np.ndarray | None = None) -> tuple:
        """obs [T * B, ...] (rows time-major) -> logits or mean [T * B, A], values [T * B] and the state after the last
        row. ``start_rows`` [T] (host): whether any sequence starts an episode at each row, which the learner knows from
        the rollout (without it, shared.rnn reads it from ``episode_start``: a wait on a GPU for more than one row)."""
        T, B = episode_start.shape
        if self.dict:  # tensors [T * B, ...] by key
            x = obs
        elif self.image:
            x = obs.permute(0, 3, 1, 2) if self.channels_last else obs  # [T * B, C, H, W]
            x = x.float() / 255.0 if obs.dtype == torch.uint8 else x.float()
        else:
            x = self.obs_norm(obs.float().flatten(1))
        x = self.torso(x).view(T, B, -1)
        keep = (~episode_start).float().unsqueeze(-1)  # [T, B, 1]: 0 where the state is zeroed before the row
        if not self.recurrent:
            x = self.core(x)
        else:  # eager: the fused LSTM between episode starts; traced (Dynamo cannot trace it): row by row
            x, (h, c) = lstm_stretches(self.core, x, state.h[None], state.c[None], keep, start_rows)
            state = RnnState(h[0].float(), c[0].float())
        x = x.flatten(0, 1)
        return self.actor(x).float(), self.critic(x).float().squeeze(-1), state

    def policy(self, out: torch.Tensor, mask: torch.Tensor, action: torch.Tensor | None = None) -> tuple:
        """The action (sampled when not given), its log-probability and the entropy, from the policy head's output
        [N, A]: logits, masked where ``mask`` [N, A] forbids, or the Gaussian's mean (``mask`` unused)."""
        if self.discrete:
            dist = Categorical(logits=masked(out, mask), validate_args=False)  # validation would wait on a GPU
            action = dist.sample() if action is None else action
            return action, dist.log_prob(action), dist.entropy()
        log_std = self.log_std.expand_as(out)
        action = out + log_std.exp() * torch.randn_like(out) if action is None else action
        return (action, *gaussian(out, log_std, action))


def make_agent(args: Args, obs_space: gym.Space, act_space: gym.Space) -> nn.Module:
    """The network, for the learner and the async sampler alike: a new network is one edit here (its forward,
    ``initial_state``, ``discrete`` and ``obs_norm``: Agent's)."""
    shape = obs_space if is_dict(obs_space) else obs_space.shape  # a Dict: the space itself
    return Agent(shape, act_space, args.hidden, args.lstm, args.init_log_std, args.normalize_obs)


class Policy(nn.Module):
    """Evaluation and --export, one step of B envs: observations [B, ...], the state h, c [B, hidden] and episode_start
    [B] (the state zeroed first) -> the greedy action (continuous: the mean clipped to the bounds), the logits or mean
    [B, A] and the next h, c. The observation statistics are the agent's, frozen."""

    def __init__(self, agent: Agent, space: gym.Space):
        super().__init__()
        self.agent = agent
        if not agent.discrete:
            self.register_buffer("low", torch.as_tensor(space.low, dtype=torch.float32))
            self.register_buffer("high", torch.as_tensor(space.high, dtype=torch.float32))

    def forward(self, obs, h: torch.Tensor, c: torch.Tensor, episode_start: torch.Tensor) -> tuple:
        out, _, state = self.agent(obs, RnnState(h, c), episode_start[None])
        if self.agent.discrete:
            return out.argmax(1), out, state.h, state.c
        return out.view(-1, *self.low.shape).clamp(self.low, self.high), out, state.h, state.c


# ----------------------------------------------------------------------------------------- sampling

# Either edge of a rollout, [B]: the state at its first row (h0, c0), the row after its last (obs, episode_start) and
# the state that row continues from (h, c).
Bootstrap = namedarraytuple("Bootstrap", ["h0", "c0", "obs", "episode_start", "h", "c"])


class EnvState:
    """What a sampler carries between rollouts, per env: current observation, final-row and episode-start flags, valid
    actions, the LSTM state (on the sampler's device), lives, episode sums and the discounted return."""

    def __init__(self, envs, seed: int, agent: Agent, device: torch.device):
        self.obs, info = envs.reset(seed=seed)  # a Dict space's: a dict of arrays by key
        n = envs.num_envs
        self.final_row = np.zeros(n, bool)  # True: this step only resets the env (next-step autoreset)
        self.episode_start = np.ones(n, bool)  # True: the row after a final row (and the first): a zero state
        self.space = envs.single_action_space
        n_actions = int(self.space.n) if agent.discrete else 1  # continuous: a mask of width 1, all True (unused)
        self.mask = action_mask(info, self.final_row, n_actions)  # [B, A]: all True where the env gives none
        self.rnn = agent.initial_state(n, device)
        self.lives = np.asarray(info.get("lives", np.zeros(n)), np.int64)
        # the episode sums travel in the rollout (ep_return, ep_length), which is how the async sampler's episodes reach
        # the learner; the replay scripts, whose rows hold no episode totals, keep them in shared.envs.EpisodeTally
        self.ep_return = np.zeros(n, np.float64)
        self.ep_length = np.zeros(n, np.int64)
        self.discounted = np.zeros(n, np.float64)  # G <- gamma G + r within the episode


def rollout_example(obs_space, act_space, hidden: int, B: int) -> tuple:
    """One step of the rollout by field (allocated [T, B]) and its edges [B]; a Dict's observations: one array per key.
    A new per-step quantity is a field here, written in collect and read in learn_from's rows and the loss."""
    discrete = isinstance(act_space, gym.spaces.Discrete)
    action = np.int64(0) if discrete else np.zeros(int(np.prod(act_space.shape)), np.float32)
    mask = np.ones(int(act_space.n) if discrete else 1, bool)
    zero = np.float32(0)
    acting = dict(obs=obs_example(obs_space), mask=mask, action=action, logprob=zero, value=zero)
    # discounted: the return so far (its statistics scale the rewards); final_row: the step only resets its env;
    # episode_start: the state is zeroed before this row; ep_*: the episode's totals where episode_end
    flags = dict(terminated=False, episode_end=False, final_row=False, episode_start=False)
    env = dict(reward=zero, discounted=zero, **flags, ep_return=0.0, ep_length=0)
    one = namedarraytuple("Rollout", [*acting, *env])(**acting, **env)
    z = np.zeros((B, hidden), np.float32)
    return one, Bootstrap(z, z, obs_example(obs_space, (B,)), np.zeros(B, bool), z, z)


@graphed
@compiled
def policy_step(agent: Agent, obs, state: RnnState, start: torch.Tensor, mask: torch.Tensor, bf16: bool) -> tuple:
    """The acting step: observations [B, ...] from ``state`` (zeroed where ``start`` [1, B]) -> actions [B] sampled
    (among the valid ones, ``mask`` [B, A]), their log-probabilities [B], the values [B] and the next state."""
    with autocast(mask.device, bf16):
        out, value, state = agent(obs, state, start)
    action, logprob, _ = agent.policy(out, mask)
    return action, logprob, value, state


@graphed
def bootstrap_value(agent: Agent, obs, state: RnnState, start: torch.Tensor, bf16: bool) -> torch.Tensor:
    """The values [B] of the observations after a rollout's last row [B, ...], from ``state`` (zeroed where ``start``
    [1, B]): one step on; under --compile on a GPU one CUDA graph replay, not a launch for each of its kernels."""
    with torch.no_grad(), autocast(start.device, bf16):
        return agent(obs, state, start)[1]


@torch.no_grad()
def collect(envs, agent: Agent, state: EnvState, buf, boot, args: Args, device: torch.device) -> None:
    """Step the envs num_steps times, writing buf [T, B] and the rollout's edges boot [B]."""
    boot.h0[:], boot.c0[:] = to_host(state.rnn.h, state.rnn.c)  # the state each env's first row continues from
    for t in range(args.num_steps):
        buf.final_row[t], buf.episode_start[t] = state.final_row, state.episode_start
        into = {"obs": buf.obs[t], "mask": buf.mask[t]}  # step t of the rollout, copied there (start is not kept in it)
        up = upload({"obs": state.obs, "start": state.episode_start[None], "mask": state.mask}, device, into=into)
        action, logprob, value, state.rnn = policy_step(agent, up["obs"], state.rnn, up["start"], up["mask"], args.bf16)
        buf.action[t], buf.logprob[t], buf.value[t] = to_host(action, logprob, value)  # one copy
        env_action = buf.action[t]
        if not agent.discrete:  # sampled unbounded, trained on as sampled, clipped for the env only
            env_action = np.clip(env_action.reshape((-1, *state.space.shape)), state.space.low, state.space.high)
        next_obs, reward, term, trunc, info = envs.step(env_action)
        lives = np.asarray(info.get("lives", state.lives), np.int64)
        life_lost = (lives < state.lives) & ~state.final_row
        raw = np.where(state.final_row, 0.0, reward)  # a final row's reward belongs to no episode
        train_r = np.sign(raw) if (args.clip_rewards and is_atari(args.env_id)) else raw
        buf.reward[t] = train_r
        # of the rewards trained on (clipped on Atari): their scale is what --normalize-reward divides out
        state.discounted = np.where(state.final_row, 0.0, state.discounted * args.gamma + train_r)
        buf.discounted[t] = state.discounted
        buf.terminated[t] = term | (life_lost & args.life_loss_terminal)
        buf.episode_end[t] = term | trunc
        state.ep_return += raw
        state.ep_length += ~state.final_row
        buf.ep_return[t], buf.ep_length[t] = state.ep_return, state.ep_length
        state.ep_return[buf.episode_end[t]] = 0.0
        state.ep_length[buf.episode_end[t]] = 0
        # The final row (next) still belongs to the episode; the row after it starts the next one.
        state.episode_start, state.final_row = state.final_row, term | trunc
        state.obs, state.lives = next_obs, lives
        state.mask = action_mask(info, state.final_row, state.mask.shape[1])  # for next_obs
    boot.obs[:], boot.episode_start[:] = state.obs, state.episode_start
    boot.h[:], boot.c[:] = to_host(state.rnn.h, state.rnn.c)


# ---------------------------------------------------------------------------------- loss and update


def compute_gae(reward, value, next_value, terminated, episode_end, final_row, gamma: float, lam: float):
    """Advantages and returns [T, B], numpy on the host (on a GPU this loop over T would be T x 7 tiny kernels). Final
    rows get 0; `terminated` stops bootstrapping, `episode_end` or `terminated` the trace; a truncated row bootstraps
    from the next row's value, the value of the episode's final observation."""
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
def ppo_loss(agent: Agent, mb: dict, state: RnnState, start_rows: np.ndarray, args: Args) -> tuple:
    """The clipped-PPO loss of whole sequences ``mb`` (rows [T * n, ...], time-major; advantages normalised; final rows
    weigh 0), replayed from their first states ``state`` [n] as the sampler ran them, and its statistics, detached."""
    with autocast(mb["weight"].device, args.bf16):
        out, value, _ = agent(mb["obs"], state, mb["episode_start"].view(args.num_steps, -1), start_rows)
    _, logprob, entropy = agent.policy(out, mb["mask"], mb["action"])
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
def ppo_step(agent: Agent, optimizer, data: dict, state: RnnState, seq: torch.Tensor, start_rows, args: Args) -> dict:
    """One clipped-PPO step on the whole env sequences ``seq`` [n] of the rollout ``data`` [T, B, ...], replayed from
    their first states (one CUDA graph under --compile on a GPU); its statistics."""
    T, B = data["weight"].shape
    i = (torch.arange(T, device=seq.device)[:, None] * B + seq).flatten()  # the sequences' rows [T * n], time-major
    mb = {k: v[i // B, i % B] for k, v in data.items()}
    if args.norm_adv:  # over the minibatches of every rank: their gradients are averaged
        mean_adv, std = distributed.mean_std(mb["adv"], mb["weight"])
        mb["adv"] = (mb["adv"] - mean_adv) / (std + 1e-8)
    loss, stats = ppo_loss(agent, mb, state[seq], start_rows, args)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    distributed.average_gradients(agent)
    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
    optimizer.step()
    return stats


def ppo_update(agent: Agent, optimizer, data: dict, state: RnnState, episode_start: np.ndarray, args: Args, device, generator):
    """Several epochs of clipped-PPO steps over the rollout ``data`` [T, B, ...], each on whole env sequences replayed
    from their first states ``state`` [B] (``episode_start``: the host's [T, B]). Every minibatch has the same size (one
    graph under --compile); final rows are in them with weight 0."""
    T, B = episode_start.shape
    n = B // args.num_minibatches  # sequences a minibatch
    stats = defaultdict(list)  # name -> per-minibatch values: a new name is a new progress column
    for _ in range(args.update_epochs):
        perm = torch.randperm(B, generator=generator).numpy()
        for first in range(0, B, n):
            envs = np.sort(perm[first : first + n])
            # [T] on the host: where the fused LSTM's stretches end (eager); compiled, the LSTM runs row by row
            start_rows = None if enabled() else episode_start[:, envs].any(1)
            for k, v in ppo_step(agent, optimizer, data, state, upload(envs, device), start_rows, args).items():
                stats[k].append(v)
    if not agent.discrete:
        stats["action_std"] = agent.log_std.detach().exp().mean()
    return stats


def learn_from(agent: Agent, return_norm: RunningNorm, optimizer, buf, boot, args: Args, device: torch.device, generator):
    """Rewards scaled (--normalize-reward), GAE with the learner's current critic, the PPO update, then the observation
    statistics take the rollout; ``buf`` [T, B] and ``boot`` [B] are numpy (async: shared), but for the observations and
    masks of a rollout collected in this process, already on the device."""
    T, B = args.num_steps, args.num_envs
    final_row = np.asarray(buf.final_row)
    episode_start = np.asarray(buf.episode_start)
    start_rows = episode_start.any(1)  # [T] on the host: where the LSTM's stretches end
    rollout = {
        "obs": buf.obs,
        "mask": buf.mask,
        "episode_start": episode_start,
        "value": buf.value,
        "boot": boot,
        "discounted": np.asarray(buf.discounted)[~final_row],  # of the rows that are not final rows
    }
    up = upload(rollout, device)  # one copy to a GPU (serial/parallel: observations and masks are there already)
    edge = up.pop("boot")
    if args.sampler == "async":  # sampled with the previous parameters: the values and the last state again
        with torch.no_grad(), autocast(device, args.bf16):
            i = torch.arange(T * B, device=device)
            _, value, last = agent(up["obs"][i // B, i % B], RnnState(edge.h0, edge.c0), up["episode_start"], start_rows)
            up["value"] = value.view(T, B)
    else:  # sampled with the current parameters: the rollout's values are the critic's, the state it ended in too
        last = RnnState(edge.h, edge.c)
    next_value = bootstrap_value(agent, edge.obs, last, edge.episode_start[None], args.bf16)  # one step on
    return_norm.update(up.pop("discounted")[:, None])  # the std of every discounted return so far (every rank's)
    value, next_value, return_var = to_host(up["value"], next_value, return_norm.var)  # GAE runs on the host
    f32 = lambda x: np.asarray(x, np.float32)
    reward = f32(buf.reward)
    if return_norm.enabled:
        scale = np.sqrt(float(return_var[0]) + 1e-8)
        reward = np.clip(reward / scale, -return_norm.clip, return_norm.clip).astype(np.float32)
    adv, ret = compute_gae(
        reward, value, next_value, f32(buf.terminated), f32(buf.episode_end), f32(final_row), args.gamma, args.gae_lambda
    )
    rows = {"action": buf.action, "logprob": buf.logprob, "adv": adv, "ret": ret, "weight": f32(~final_row)}
    data = {**up, **upload(rows, device)}  # [T, B, ...] each
    stats = ppo_update(agent, optimizer, data, RnnState(edge.h0, edge.c0), episode_start, args, device, generator)
    if agent.obs_norm.enabled:  # every observation once (the bootstrap one is next rollout's first)
        agent.obs_norm.update(up["obs"].flatten(0, 1).flatten(1))
    return stats


# ------------------------------------------------------------------------------------------ sampler


class Sampler:
    """Where the learner's rollouts come from. serial/parallel: this process steps the envs with the current parameters;
    async: a sampler process (``sampler_main``) collects rollout k + 1 into the other slot of a double buffer, with the
    parameters of update k - 1, while the learner trains on rollout k."""

    def __init__(self, args: Args, run: Run, agent: Agent, first: int, last: int):
        self.args, self.run = args, run
        example, boot_example = rollout_example(run.obs_space, run.act_space, args.hidden, args.num_envs)
        if args.sampler == "async":
            self.buffers = DoubleBuffer(example, (args.num_steps, args.num_envs), module=agent)
            self.boots = [buffer_from_example(boot_example, (), shared=True) for _ in range(2)]
            self.worker = run.start_sampler(sampler_main, args, self.buffers, self.boots, first, last)
        else:
            self.envs = run.hold(make_envs(args, make_env, args.sampler, n_threads=len(run.affinity.learner_cpus)))
            # A resumed run starts fresh episodes (and states); every env of every rank has a seed of its own.
            self.state = EnvState(self.envs, distributed.env_seed(args.seed + first, args.num_envs), agent, run.device)
            # [T, B]; observations and masks where the update reads them, written there by each step's one copy
            self.buf = on_device(buffer_from_example(example, (args.num_steps, args.num_envs)), ("obs", "mask"), run.device)
            self.boot = buffer_from_example(boot_example, ())  # [B]

    def rollout(self, it: int, agent: Agent, global_step: int) -> tuple:
        """Rollout ``it`` [T, B] and its edges [B]; records the episodes that ended in it (at ``global_step``, the job's
        env steps after it)."""
        if self.args.sampler == "async":  # sampled by the other process with the parameters of update it - 1
            buf, boot = self.buffers.reader_acquire(it, self.worker.check), self.boots[it % 2]
        else:
            buf, boot = self.buf, self.boot
            collect(self.envs, agent, self.state, buf, boot, self.args, self.run.device)
        self.run.episodes(zip(buf.ep_return[buf.episode_end].tolist(), buf.ep_length[buf.episode_end].tolist()), global_step)
        return buf, boot

    def release(self, it: int, agent: Agent) -> None:
        """async: the slot goes back with the new parameters, which rollout it + 2 is collected with."""
        if self.args.sampler == "async":
            self.buffers.reader_release(it, module=agent, version=it + 1)


# --------------------------------------------------------------------------------------------- main


def check_args(args: Args) -> None:
    """What relates the flags to each other (each field's own range is declared on it): exit 2, one line."""
    if args.num_envs % args.num_minibatches:
        bad_args(
            f"--num-minibatches {args.num_minibatches} does not divide --num-envs {args.num_envs} "
            f"(minibatches are whole env sequences)"
        )
    if args.observe_indices and is_atari(args.env_id):
        bad_args("--observe-indices applies to vector observations, not Atari frames")
    if args.normalize_obs and is_atari(args.env_id):
        bad_args("--normalize-obs applies to vector observations, not Atari frames")


def make_learner(args: Args, run: Run) -> tuple:
    """The agent (its observation statistics included), its optimiser,
    the minibatch order's generator and the statistics of the discounted return."""
    if not isinstance(run.act_space, (gym.spaces.Discrete, gym.spaces.Box)):
        bad_args(f"--env-id {args.env_id}: {run.script} needs Discrete or Box actions, got {run.act_space}")
    if not isinstance(run.obs_space, (gym.spaces.Box, gym.spaces.Dict)):
        bad_args(f"--env-id {args.env_id}: {run.script} needs Box or Dict observations, got {run.obs_space}")
    if is_dict(run.obs_space) and args.normalize_obs:
        bad_args(f"--env-id {args.env_id}: --normalize-obs applies to Box vectors, not Dict observations")
    try:
        agent = make_agent(args, run.obs_space, run.act_space).to(run.device)
    except ValueError as e:  # observations the network cannot take
        observed = " --observe-indices " + " ".join(map(str, args.observe_indices)) if args.observe_indices else ""
        bad_args(f"--env-id {args.env_id}{observed}: {e}")
    agent = channels_last(agent, run.device, args.bf16)
    fused = {"fused": True} if run.device.type in ("cpu", "cuda") else {}  # one kernel for all parameters
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, **fused)
    return_norm = RunningNorm(1, args.normalize_reward).to(run.device)  # statistics of the discounted return
    return agent, optimizer, torch.Generator().manual_seed(args.seed), return_norm


# Evaluation's act (shared.evaluation): the observations [B, ...], then by parameter name only those of draws,
# starts, rewards, mask that it names (another name is refused at the start: a renamed one would never be passed).
class EvalPolicy:
    """Evaluation's act: the Policy, each env carrying its LSTM state through its episode (zeroed where ``starts`` [B]);
    discrete actions sampled among the valid ones ``mask`` [B, A] with each episode's own ``draws`` (Gumbel-max: the
    argmax of the logits plus Gumbel noise is a sample of Categorical(logits)), continuous ones the Policy's."""

    def __init__(self, policy: Policy, device: torch.device):
        self.policy = policy
        self.device = device
        self.state = policy.agent.initial_state(0, device)

    def __call__(self, obs, draws: Draws, starts: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        if len(starts) != len(self.state.h):  # another number of envs than the last evaluation
            self.state = self.policy.agent.initial_state(len(starts), self.device)
        action, out, h, c = self.policy(upload(obs, self.device), *self.state, upload(starts, self.device))
        self.state = RnnState(h, c)
        if not self.policy.agent.discrete:
            return to_host(action)
        noise = upload(draws.gumbel(out.shape[1]), self.device)
        return to_host((masked(out, upload(mask, self.device)) + noise).argmax(1))


def main() -> int:
    args = parse_args(Args, PRESETS, check_args)
    batch = args.num_envs * args.num_steps  # a rank's rollout; --log-every counts rollouts
    run = Run(args, __file__, make_env, iteration_steps=batch, dict_obs=True)
    run.setup()  # this process: TF32, Ctrl-C/SIGTERM, the torchrun job, cores, seeds
    with run.allocating("hidden"):  # sizes this machine cannot hold: exit 2
        agent, optimizer, generator, return_norm = make_learner(args, run)
    policy = Policy(agent, run.act_space).to(run.device)
    evaluation = EvalPolicy(policy, run.device)
    start = run.begin(evaluation, model=agent, optimizer=optimizer, generator=generator, return_norm=return_norm)
    if args.eval_only or args.export:  # with --resume: evaluate the checkpoint's policy or export it, train nothing
        state = agent.initial_state(8)  # 8 example rows: the graph's batch axis is dynamic
        outputs = ["action", "logits" if agent.discrete else "mean", "h_out", "c_out"]
        starts = torch.ones(8, dtype=torch.bool)
        return run.evaluate_or_export(policy, outputs, rows=8, h=state.h, c=state.c, episode_start=starts)
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
    """Async sampler process: rollout k goes to slot k % 2, collected with the parameters (observation statistics
    included) the learner left in that slot when it released rollout k - 2 (update k - 1): exactly one update behind the
    learner. The LSTM states carry over from rollout to rollout here."""
    with closing(make_envs(args, make_env, "parallel" if is_atari(args.env_id) else "serial", proc.n_threads)) as envs:
        agent = proc.place(make_agent(args, envs.single_observation_space, envs.single_action_space), args.bf16)
        state = EnvState(envs, distributed.env_seed(args.seed + first, args.num_envs), agent, proc.device)
        torch.manual_seed(distributed.rank_seed(args.seed + 1))  # the policy's sampling: a stream of each rank's own
        for k in range(first, last):
            buf = buffers.writer_acquire(k, proc.check, module=agent)
            collect(envs, agent, state, buf, boots[k % 2], args, proc.device)
            buffers.writer_release(k)


if __name__ == "__main__":
    sys.exit(main())
