"""Categorical DQN (C51), up to Rainbow, for Atari and vector-observation envs.

    python algos/catdqn_atari.py                                                 # Breakout: C51, 1M-step replay (7.1 GB)
    python algos/catdqn_atari.py --preset atari100k --env-id PongNoFrameskip-v4  # data-efficient Rainbow, Atari 100k
    python algos/catdqn_atari.py --preset cartpole --sampler async               # a sampler process beside the learner
    torchrun --standalone --nproc-per-node 2 algos/catdqn_atari.py --preset cartpole
    python algos/catdqn_atari.py --double-dqn --dueling --n-step-return 3 --prioritized --noisy             # Rainbow

The network outputs a distribution over n_atoms returns between v_min and v_max per action; the target distribution
r + gamma^k z (no bootstrap after termination) is projected back onto the support and the loss is the cross-entropy to
it, which is also the priority in prioritized replay (Rainbow's KL-based priority: the two differ by the target's
entropy, constant in the parameters). The settings that matter: v_min/v_max (they must cover the returns), replay_ratio
(samples learned per env step: updates per env step are replay_ratio / batch_size), target_update_interval, the epsilon
schedule (eps_*), n_step_return, and --double-dqn, --dueling, --prioritized, --noisy (NoisyNet: the heads' noise
explores once learning starts; evaluation uses the mean weights). On Atari a lost life is terminal for learning and
rewards are clipped to their sign; logged returns are whole games, unclipped. Replay rows and autoreset:
shared/replay.py; the async and torchrun pacing (`wait_s`, `sampler_wait_s`): shared/pacing.py.

Where to change what: the env in make_env (a wrapper there reaches every sampling mode); the network in make_network
(QNetwork here): any nn.Module with forward(obs, noise) -> log-probabilities [N, A, n_atoms], q_values(obs, noise) ->
their means [N, A] and a `support` tensor [n_atoms] (obs [N, ...] as the env gives them; noise: None or the noisy
layers' torch.Generator; make_network refuses --noisy and --dueling for a network that cannot honour them); the loss in
c51_loss (its dict: the row's logged statistics, a new key a new progress.csv column); a new stored quantity (per step,
in the replay) is an entry in ROW, written in EnvStepper.step and read by the loss (every batch field but HOST_ONLY is
uploaded); the schedule in main. An @graphed step (one CUDA graph under --compile) sees a setting changed between calls
(an Args field) at its next call, each value one graph, 8 at most: pass a schedule as a tensor, and return what the
step computes (a write to a setting or to a list or dict argument is refused).
"""

import copy
import importlib.util
import sys
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
from shared.atari import is_atari, make_atari_env
from shared.cli import RunArgs, bad_args, check_replay_sizes, parse_args
from shared.compiling import compiled, graphed
from shared.device import to_host, upload
from shared.device_replay import DeviceReplay, ReplayBatches
from shared.envs import EpisodeTally, image_shape, make_envs, replay_frame_stack
from shared.namedarraytuple import namedarraytuple
from shared.pacing import AsyncReplay, ReplayPacer
from shared.precision import autocast, channels_last
from shared.procs import SamplerProcess
from shared.replay import ReplayBuffer, prefetch_on, stacked
from shared.run import Run


@dataclass
class Args(RunArgs):
    # seed, run folder, resume, checkpoints, evaluation, device, bf16: in shared.cli.RunArgs, the same everywhere

    # experiment
    preset: Literal["atari", "atari100k", "cartpole"] = "atari"
    """named settings to start from (atari: the C51 paper's; atari100k: data-efficient Rainbow; cartpole); flags override"""
    env_id: str = "BreakoutNoFrameskip-v4"
    """gymnasium id: an Atari `*NoFrameskip-v4` game (Nature CNN) or an env with vector observations (MLP)"""
    total_timesteps: PositiveInt = 10_000_000
    """agent steps summed over all envs (Atari: 4 emulator frames each)"""
    log_every: PositiveInt = 10_000
    """env steps between progress rows"""
    save_replay: bool = False
    """each checkpoint also writes the replay (replay.npz, plain arrays); --resume then continues with it"""
    eval_epsilon: Fraction = 0.001
    """epsilon of the evaluation episodes"""
    # algorithm
    num_envs: PositiveInt = 4
    """environments stepped together on each rank (torchrun)"""
    buffer_size: PositiveInt = 1_000_000
    """replay capacity in transitions (each rank's, torchrun)"""
    batch_size: PositiveInt = 32
    """transitions per gradient step"""
    replay_ratio: PositiveFloat = 8.0
    """samples consumed per env step (8: a batch of 32 every 4 steps, as in the DQN paper)"""
    min_steps_learn: NonNegInt = 50_000
    """env steps collected before learning starts (in each rank's replay, torchrun)"""
    learning_rate: Annotated[float, Range(gt=0, lt=1)] = 2.5e-4
    """optimiser step size (C51 paper: Adam 2.5e-4, eps 0.01/32)"""
    optimizer: Literal["adam", "rmsprop"] = "adam"
    """adam or rmsprop (centered, alpha 0.95, eps 0.01)"""
    adam_epsilon: PositiveFloat = 0.01 / 32
    """Adam's epsilon (C51 paper: 0.01 / batch size 32)"""
    network: Literal["nature", "data-efficient"] = "nature"
    """image torso: nature (3 convolutions, 512 hidden units) or data-efficient (two 5x5 stride-5 convolutions, 256)"""
    n_atoms: Annotated[int, Range(ge=2)] = 51
    """atoms of the return distribution's support"""
    v_min: float = -10.0
    """lowest return on the support"""
    v_max: float = 10.0
    """highest return on the support"""
    gamma: Fraction = 0.99
    """discount"""
    n_step_return: PositiveInt = 1
    """steps summed before bootstrapping"""
    double_dqn: bool = False
    """select the bootstrap action with the online network's mean Q, take the target network's distribution"""
    dueling: bool = False
    """dueling head: Q = V + A - mean(A), gradient into the torso scaled by 1/sqrt(2)"""
    noisy: bool = False
    """noisy nets: factorised Gaussian noise in the heads explores once learning starts (uniform actions before, no --eps-*)"""
    noisy_sigma: PositiveFloat = 0.5
    """noisy nets' sigma_0: noise scales start at sigma_0 / sqrt(fan-in) (0.5: NoisyNet, Rainbow; 0.1: data-efficient)"""
    noisy_epsilon: Fraction = 0.0
    """noisy nets: epsilon-greedy beside the noise once learning starts (0: the noise alone, as Rainbow and DER)"""
    prioritized: bool = False
    """prioritized replay: priorities the cross-entropy, importance weights with beta annealed to 1"""
    alpha: Fraction = 0.6
    """priority exponent"""
    beta: Fraction = 0.4
    """initial importance-weight exponent (annealed linearly to 1 over the run)"""
    target_update_interval: PositiveInt = 10_000
    """env steps between target-network updates"""
    tau: Annotated[float, Range(gt=0, le=1)] = 1.0
    """target update: 1 copies the online network (hard); below 1 moves a fraction tau of the way (soft)"""
    eps_start: Fraction = 1.0
    """exploration epsilon at the start"""
    eps_end: Fraction = 0.01
    """exploration epsilon after eps_decay_steps"""
    eps_decay_steps: NonNegInt = 1_000_000
    """env steps over which epsilon anneals linearly"""
    vector_epsilon: bool = False
    """Ape-X: fixed epsilon 0.4^(1 + 7 i / (N - 1)) for env i instead of the annealed one"""
    max_grad_norm: float = 10.0
    """global gradient-norm clip"""
    # environment (Atari ids only)
    noop_max: NonNegInt = 30
    """Atari: up to this many random no-ops at reset (paper convention 30)"""
    sticky_actions: Fraction = 0.0
    """Atari: probability of repeating the previous action (0: paper convention, no sticky actions)"""
    clip_rewards: bool = True
    """Atari: train on the sign of the reward (logged returns stay unclipped)"""
    life_loss_terminal: bool = True
    """Atari: a lost life ends the training episode for bootstrapping (the game itself goes on)"""
    # infrastructure
    sampler: Literal["serial", "parallel", "async"] = "serial"
    """serial, parallel (ale-py threads / AsyncVectorEnv) or async (a sampler process fills a shared replay)"""
    max_lag_steps: NonNegInt = 1_000
    """async: the sampler waits when it is this many env steps ahead of the learner's updates (0: never waits)"""


# Named starting points: --preset NAME, then any flag overrides them. Every field not named keeps its default.
PRESETS = {
    "atari": Args(),
    # Data-efficient Rainbow (van Hasselt, Hessel and Aslanides 2019, "When to use parametric models in reinforcement
    # learning?", appendix table), as Dopamine's labs/atari_100k/configs/DER.gin reproduces it: Rainbow (C51, double,
    # dueling, noisy, prioritized, n-step) with one update of 32 per agent step, learning from 1,600 steps, a target copy
    # every 2,000 updates, Adam 1e-4 / eps 1.5e-4, a 10 clip, 51 atoms on [-10, 10], priority exponent 0.5 and importance
    # exponent 0.4 -> 1, noisy sigma_0 0.1, the smaller torso (two 5x5 stride-5 convolutions, 256 hidden units), a replay
    # holding all 100k steps ("unbounded"), n-step 20. Where Dopamine's DER.gin differs from the paper: n-step 10 (SPR's
    # choice), the Nature torso (padded 'SAME') with one 512-unit hidden layer shared by both streams, importance
    # exponent fixed at 0.5, training epsilon beside the noise (0.01; 0 since late 2022). Before learning starts, uniform
    # actions (SPR's; Dopamine acts with the untrained noisy net, which repeats one action). Not done here: Dopamine and
    # SPR clear the frame stack at a lost life.
    # Protocol of the published Atari 100k scores (Kaiser et al. 2019; Dopamine, SPR): 100k agent steps (400k frames,
    # action repeat 4, one env), no sticky actions, episodes cut at 108k frames (27k agent steps), a lost life terminal
    # for learning (whole games scored), rewards clipped to their sign for training, up to 30 no-op frames at reset
    # (Dopamine: up to 30 no-op agent steps), the score the mean of 100 evaluation episodes after training, played with
    # the mean weights and epsilon 0.001 (Dopamine's evaluation). Those of these settings that are the defaults (atoms and
    # support, gamma, batch 32, beta, the clip, the Atari protocol, eval_epsilon) are not repeated below.
    "atari100k": Args(
        preset="atari100k",
        total_timesteps=100_000,
        num_envs=1,
        buffer_size=100_000,
        replay_ratio=32,
        min_steps_learn=1600,
        learning_rate=1e-4,
        adam_epsilon=1.5e-4,
        network="data-efficient",
        noisy=True,
        noisy_sigma=0.1,
        dueling=True,
        double_dqn=True,
        prioritized=True,
        alpha=0.5,
        n_step_return=20,
        target_update_interval=2000,
        eval_episodes=100,
        log_every=1000,
    ),
    # Ours, as dqn_atari.py's cartpole preset, with the value support over CartPole's returns.
    "cartpole": Args(
        preset="cartpole",
        env_id="CartPole-v1",
        total_timesteps=100_000,
        buffer_size=50_000,
        min_steps_learn=1000,
        batch_size=64,
        eps_decay_steps=20_000,
        eps_end=0.02,
        n_step_return=3,
        replay_ratio=16,
        learning_rate=1e-3,
        adam_epsilon=0.01 / 64,
        dueling=True,
        target_update_interval=250,
        v_min=0.0,
        v_max=100.0,
    ),
}

# ------------------------------------------------------------------------------------- environments


def make_env(args: Args, render: bool = False):
    """A thunk making one env in the process that steps it (a wrapper added here reaches every sampling mode): Atari ids
    with the papers' preprocessing (shared/atari.py), other ids a plain gym.make."""

    def thunk() -> gym.Env:
        if is_atari(args.env_id):
            return make_atari_env(args.env_id, args.noop_max, args.sticky_actions, render)
        return gym.make(args.env_id, render_mode="rgb_array" if render else None)

    return thunk


# ------------------------------------------------------------------------------------------ network


class ScaleGrad(torch.autograd.Function):
    """Identity forward; multiplies the gradient by `scale` backward (rlpyt's dueling torso scaling)."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale, None


class NoisyLinear(nn.Module):
    """Linear layer with factorised Gaussian noise (Fortunato et al. 2018, eqs. 10-11), drawn anew on every call given a
    generator (one draw for the whole batch [N, p]); without one (evaluation), the mean weights."""

    # y = (w + sigma_w * eps_w) x + b + sigma_b * eps_b with eps_w = f(e_out) f(e_in)^T, eps_b = f(e_out),
    # f(e) = sign(e) sqrt(|e|), e ~ N(0, 1): q + p draws instead of q p. Initialised as in the paper's section 3.2:
    # w, b ~ U(-1/sqrt(p), 1/sqrt(p)), sigma = sigma_0 / sqrt(p).

    def __init__(self, p: int, q: int, sigma_0: float):
        super().__init__()
        bound = p**-0.5
        self.weight = nn.Parameter(torch.empty(q, p).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(q).uniform_(-bound, bound))
        self.weight_sigma = nn.Parameter(torch.full((q, p), sigma_0 * bound))
        self.bias_sigma = nn.Parameter(torch.full((q,), sigma_0 * bound))

    def forward(self, x: torch.Tensor, noise: torch.Generator | None) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        if noise is None:
            return y
        p = self.weight.shape[1]
        e = torch.randn(p + self.weight.shape[0], generator=noise, device=x.device)
        f = e.sign() * e.abs().sqrt()
        f_in, f_out = f[:p], f[p:]
        # sigma_w * (f_out f_in^T) applied to x without forming the [q, p] noise: (sigma_w (f_in * x)) * f_out
        return y + (F.linear(x * f_in, self.weight_sigma) + self.bias_sigma) * f_out


def float32_out(layers: nn.Sequential, h: torch.Tensor, noise: torch.Generator | None = None) -> torch.Tensor:
    """A head (linear, ReLU, linear): the hidden layer under the caller's autocast, the output layer in float32 (bfloat16
    would round Q-values to steps of 1/16 near 10, the size of the TD errors left near convergence)."""
    hidden, relu, out = layers
    z = relu(hidden(h, noise) if isinstance(hidden, NoisyLinear) else hidden(h))
    with torch.autocast(z.device.type, enabled=False):
        z = z.float()
        return out(z, noise) if isinstance(out, NoisyLinear) else out(z)


class QNetwork(nn.Module):
    """Image torso (Nature CNN or the data-efficient one) or a 120-84 MLP for vectors, then a categorical head, plain or
    dueling, noisy when `noisy_sigma` is given. forward(obs, noise): log-probabilities [N, A, n_atoms] (noise: the noisy
    layers' generator, None for their mean weights); q_values(obs, noise): their means under the support [N, A]."""

    def __init__(self, obs_shape, n_actions: int, dueling: bool, support: torch.Tensor, network="nature", noisy_sigma=None):
        super().__init__()
        self.image = len(obs_shape) == 3
        self.dueling = dueling
        self.register_buffer("support", support)
        if self.image:
            c, h, w = image_shape(obs_shape)  # ValueError with the reason when the CNN cannot take the images
            self.channels_last = tuple(obs_shape) != (c, h, w)
            if network == "nature":
                self.torso = nn.Sequential(
                    nn.Conv2d(c, 32, 8, stride=4),
                    nn.ReLU(),
                    nn.Conv2d(32, 64, 4, stride=2),
                    nn.ReLU(),
                    nn.Conv2d(64, 64, 3, stride=1),
                    nn.ReLU(),
                    nn.Flatten(),
                )
            else:  # data-efficient: 64 * 3 * 3 features for 84x84 frames
                convs = [nn.Conv2d(c, 32, 5, stride=5), nn.ReLU(), nn.Conv2d(32, 64, 5, stride=5), nn.ReLU()]
                self.torso = nn.Sequential(*convs, nn.Flatten())
            # the width probed, not computed, so that another torso needs no edit here (Nature CNN: 64 * 7 * 7 at 84x84)
            width, hidden = self.torso(torch.zeros(1, c, h, w)).shape[1], (512 if network == "nature" else 256)
        else:
            self.torso = nn.Sequential(nn.Linear(int(np.prod(obs_shape)), 120), nn.ReLU())
            width, hidden = 120, 84
        linear = nn.Linear if noisy_sigma is None else partial(NoisyLinear, sigma_0=noisy_sigma)
        self.q = nn.Sequential(linear(width, hidden), nn.ReLU(), linear(hidden, n_actions * len(support)))
        if dueling:
            self.v = nn.Sequential(linear(width, hidden), nn.ReLU(), linear(hidden, len(support)))

    def forward(self, obs: torch.Tensor, noise: torch.Generator | None = None) -> torch.Tensor:
        if self.image:
            x = obs.permute(0, 3, 1, 2) if self.channels_last else obs  # [N, C, H, W]
            x = x.float() / 255.0 if obs.dtype == torch.uint8 else x.float()
        else:
            x = obs.float().flatten(1)
        h = self.torso(x)
        if self.dueling:
            h = ScaleGrad.apply(h, 2**-0.5)  # two streams feed the torso: keep its gradient scale
        logits = float32_out(self.q, h, noise).unflatten(1, (-1, len(self.support)))  # [N, A, K]
        if self.dueling:
            logits = float32_out(self.v, h, noise).unsqueeze(1) + logits - logits.mean(dim=1, keepdim=True)
        return logits.float().log_softmax(dim=-1)  # float32 whatever the autocast: the projection needs it

    def q_values(self, obs: torch.Tensor, noise: torch.Generator | None = None) -> torch.Tensor:
        return (self.forward(obs, noise).exp() * self.support).sum(-1)  # [N, A]


def make_network(args: Args, obs_space: gym.Space, act_space: gym.Space) -> nn.Module:
    """The network, for the learner (and its target copy) and the async sampler alike: a new network is one edit here
    (its forward: QNetwork's); and the one place that refuses a flag it cannot honour (a replaced network, say): exit 2."""
    support = torch.linspace(args.v_min, args.v_max, args.n_atoms)
    noisy_sigma = args.noisy_sigma if args.noisy else None
    net = QNetwork(obs_space.shape, int(act_space.n), args.dueling, support, args.network, noisy_sigma)
    if args.noisy and not any(isinstance(m, NoisyLinear) for m in net.modules()):
        bad_args("--noisy: the network has no NoisyLinear layer to draw noise for")
    if args.dueling and not isinstance(net, QNetwork):
        bad_args(f"--dueling: the dueling head is QNetwork's; {type(net).__name__} has none")
    return net


class Policy(nn.Module):
    """Raw observations [B, ...] -> greedy actions [B] and expected Q-values [B, A], noisy layers at their mean weights:
    what --export writes and what evaluation plays (``act``)."""

    def __init__(self, q_net: nn.Module):
        super().__init__()
        self.q_net = q_net

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q = self.q_net.q_values(obs)
        return q.argmax(1), q


# ----------------------------------------------------------------------------------------- sampling

# A replay row by field, with its example (shape and dtype; the observation's from the env). A new stored quantity is an
# entry here, written in EnvStepper.step and read by the loss as batch[name]: the update gets every field of the batch
# (uploaded, or from the replay's mirror on a CUDA learner) but HOST_ONLY, the replay's bookkeeping (the loss reads the
# n-step fields made from them).
ROW = dict(action=np.int64(0), reward=np.float32(0), terminated=False, truncated=False, episode_end=False)
Step = namedarraytuple("Step", ["observation", *ROW])
HOST_ONLY = ("reward", "terminated", "truncated", "episode_end", "truncated_n", "n_taken", "final_row", "episode_start")


def epsilons(args: Args, global_step: int) -> np.ndarray:
    """Exploration epsilon per env [B]."""
    if args.noisy:
        # the noise explores once learning starts (Rainbow acts greedily in the noisy Q-values); before, uniform actions
        # fill the replay, as SPR's DER does: an untrained noisy net repeats one action
        learning = global_step >= args.min_steps_learn * distributed.world_size()
        return np.full(args.num_envs, args.noisy_epsilon if learning else 1.0)
    if args.vector_epsilon:
        return 0.4 ** (1 + 7 * np.arange(args.num_envs) / max(args.num_envs - 1, 1))
    frac = min(global_step / max(args.eps_decay_steps, 1), 1.0)
    return np.full(args.num_envs, args.eps_start + frac * (args.eps_end - args.eps_start))


@graphed
@compiled
def greedy_actions(q_net: nn.Module, obs: torch.Tensor, noise, bf16: bool) -> torch.Tensor:
    """The acting step's greedy actions [B] in the Q-values of ``obs`` [B, ...] (noisy ones given a generator)."""
    with torch.no_grad(), autocast(obs.device, bf16):  # here, not around the caller: a replay runs none of it
        return q_net.q_values(obs, noise).float().argmax(dim=1)


# Evaluation's act (shared.evaluation): the observations [B, ...], then by parameter name only those of draws,
# starts, rewards, mask that it names (another name is refused at the start: a renamed one would never be passed).
def act(policy: Policy, device: torch.device, epsilon: float, obs: np.ndarray, draws) -> np.ndarray:
    """Evaluation: epsilon-greedy, each episode's coin and random action from its own ``draws`` (shared.evaluation)."""
    greedy, q = policy(upload(obs, device))
    return np.where(draws.random() < epsilon, draws.integers(q.shape[1]), to_host(greedy))


class EnvStepper:
    """Steps the [B] envs one step at a time, epsilon-greedy (in noisy Q-values, drawn anew each step, when `noise` is a
    generator); keeps per-env episode state."""

    def __init__(self, envs, args: Args, seed: int, noise: torch.Generator | None):
        self.envs, self.args = envs, args
        self.noise = noise
        self.obs, info = envs.reset(seed=seed)
        self.final_row = np.zeros(args.num_envs, bool)  # this step only resets the env (next-step autoreset)
        self.lives = np.asarray(info.get("lives", np.zeros(args.num_envs)), np.int64)
        self.episodes = EpisodeTally(args.num_envs)  # each env's return and length so far
        self.rng = np.random.default_rng(seed)

    def act(self, q_net: nn.Module, eps: np.ndarray, device: torch.device) -> np.ndarray:
        """Every env's action [B] for this step (on a GPU, waiting for the updates launched before it)."""
        obs = upload({"obs": self.obs}, device)["obs"]
        greedy = to_host(greedy_actions(q_net, obs, self.noise, self.args.bf16))  # the one copy a step makes
        explore = self.rng.random(len(greedy)) < eps
        return np.where(explore, self.rng.integers(0, self.envs.single_action_space.n, len(greedy)), greedy)

    def step(self, action: np.ndarray) -> tuple:
        """One step of every env with ``action``: the replay row [1, B] and the episodes that ended [(return, length)]."""
        next_obs, reward, term, trunc, info = self.envs.step(action)
        lives = np.asarray(info.get("lives", self.lives), np.int64)
        life_lost = (lives < self.lives) & ~self.final_row
        raw = np.where(self.final_row, 0.0, reward)
        train_r = (np.sign(raw) if self.args.clip_rewards and is_atari(self.args.env_id) else raw).astype(np.float32)
        terminal = term | (life_lost & self.args.life_loss_terminal)  # for learning: a lost life too, with the flag
        end = term | trunc
        row = Step(observation=self.obs, action=action, reward=train_r, terminated=terminal, truncated=trunc, episode_end=end)
        episodes = self.episodes.step(raw, ~self.final_row, end)  # [(return, length)] of those that ended
        self.obs, self.final_row = next_obs, end
        self.lives = lives
        return row[None], episodes  # [1, B]


# ---------------------------------------------------------------------------------- loss and update


def project(next_probs: torch.Tensor, returns: torch.Tensor, discounts: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
    """Project r + discount * z (each atom z carrying next_probs) onto the support [N, K]: each shifted atom's mass is
    split between its two neighbouring atoms in proportion to closeness (all of it to one atom when it lands on it);
    atoms beyond the ends go to the ends."""
    v_min, v_max = support[0], support[-1]
    K = len(support)
    dz = (v_max - v_min) / (K - 1)
    tz = (returns[:, None] + discounts[:, None] * support[None, :]).clamp(v_min, v_max)  # [N, K]
    b = (tz - v_min) / dz
    lower, upper = b.floor().long().clamp(0, K - 1), b.ceil().long().clamp(0, K - 1)
    m = torch.zeros_like(next_probs)
    m.scatter_add_(1, lower, next_probs * (upper.float() - b + (lower == upper).float()))
    m.scatter_add_(1, upper, next_probs * (b - lower.float()))
    return m


@compiled
def c51_loss(q_net, target_net, batch: dict, args: Args, noise=None) -> tuple:
    """The importance-weighted cross-entropy to the projected targets of one ``batch`` [N, ...], per sample [N] (the
    new priorities), and the statistics, detached (read when a row is written, never per update)."""
    rows = torch.arange(len(batch["action"]), device=batch["action"].device)
    # The target, m [N, K]: the target net's distribution at s_{t+k} for a* (the online net's greedy action when double,
    # else the target net's), shifted by the n-step return and gamma^k (0 after termination) and projected. In an
    # autocast region of its own: on torch before 2.6, weights cast under no_grad and reused by the forward with grad in
    # the same region carried no autograd history (pytorch#112583).
    with autocast(rows.device, args.bf16), torch.no_grad():
        next_logp = target_net(batch["next_observation"], noise)  # [N, A, K]
        next_q = (next_logp.exp() * target_net.support).sum(-1)
        a_star = (q_net.q_values(batch["next_observation"], noise) if args.double_dqn else next_q).argmax(dim=1)
        discounts = (1.0 - batch["terminated_n"].float()) * batch["bootstrap_discount"]
        m = project(next_logp[rows, a_star].exp(), batch["n_step_return"], discounts, target_net.support).float()
    with autocast(rows.device, args.bf16):
        logp = q_net(batch["observation"], noise).float()[rows, batch["action"].long()]  # [N, K]
    cross_entropy = -(m * logp).sum(-1)  # [N]
    loss = (batch["is_weights"] * cross_entropy).mean()
    q = (logp.detach().exp() * q_net.support).sum(-1)
    return loss, cross_entropy.detach(), {"td_loss": loss.detach(), "q_values": q.mean()}


@graphed
def c51_step(q_net, target_net, optimizer, batch: dict | DeviceReplay, args: Args, noise=None) -> tuple:
    """One gradient step on ``batch`` [N, ...] (one CUDA graph under --compile on a GPU): the cross-entropies [N] (the
    new priorities; None with a uniform replay) and the statistics."""
    batch = batch.sample(args.batch_size) if isinstance(batch, DeviceReplay) else stacked(batch)  # on the device, in the graph
    loss, cross_entropy, stats = c51_loss(q_net, target_net, batch, args, noise)  # Atari: frames stacked above
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    distributed.average_gradients(q_net)
    nn.utils.clip_grad_norm_(q_net.parameters(), args.max_grad_norm)
    optimizer.step()
    return (cross_entropy if args.prioritized else None), stats  # uniform: nothing more to copy out


def c51_update(q_net, target_net, optimizer, batches: ReplayBatches, args: Args, beta: float, noise=None) -> dict:
    batch, index = batches.next(args.batch_size, beta)  # a host draw, uploaded; or a CUDA learner's mirror (c51_step draws)
    cross_entropy, stats = c51_step(q_net, target_net, optimizer, batch, args, noise)
    batches.ahead(args.batch_size, beta)  # async on a GPU: the next batch gathered while this trains
    if args.prioritized:  # the one copy an update makes: the sum tree lives on the host
        batches.buffer.update_priorities(index, to_host(cross_entropy))
    return stats


# --------------------------------------------------------------------------------------------- main


def check_args(args: Args) -> None:
    """What relates the flags to each other (each field's own range is declared on it): exit 2, one line."""
    if not args.v_min < args.v_max:
        bad_args(f"--v-min {args.v_min} must be below --v-max {args.v_max}")
    if args.compile and args.noisy:  # a graph break, which --compile refuses
        bad_args("--compile: the --noisy layers draw from a torch.Generator, which it cannot trace")
    check_replay_sizes(args)


def make_learner(args: Args, run: Run) -> tuple[nn.Module, nn.Module, torch.optim.Optimizer, torch.Generator | None]:
    """The online network, its target copy, the optimiser and the noisy layers' noise generator (None without --noisy;
    in the checkpoint, so that a resumed run draws new noise)."""
    try:
        q_net = make_network(args, run.obs_space, run.act_space).to(run.device)
    except ValueError as e:  # observations the network cannot take
        bad_args(f"--env-id {args.env_id}: {e}")
    q_net = channels_last(q_net, run.device, args.bf16)
    target_net = copy.deepcopy(q_net).requires_grad_(False)
    if args.optimizer == "adam":
        fused = {"fused": True} if run.device.type in ("cpu", "cuda") else {}  # one kernel for all parameters
        optimizer = torch.optim.Adam(q_net.parameters(), lr=args.learning_rate, eps=args.adam_epsilon, **fused)
    else:
        optimizer = torch.optim.RMSprop(q_net.parameters(), lr=args.learning_rate, alpha=0.95, eps=0.01, centered=True)
    # Seeded apart from the weights' initialisation, the same on every rank (and restored to the same state): a job's
    # update draws one noise for its whole batch, as one process does.
    noise = torch.Generator(run.device).manual_seed(args.seed + 7_919) if args.noisy else None
    return q_net, target_net, optimizer, noise


def make_replay(args: Args, run: Run) -> ReplayBuffer:
    """Each rank's replay: frames stored once each, n-step returns, optionally prioritized."""
    return ReplayBuffer(
        # an example row: the fields, their shapes and dtypes
        Step(observation=np.zeros(run.obs_space.shape, run.obs_space.dtype), **ROW),
        args.buffer_size,
        args.num_envs,
        discount=args.gamma,
        n_step_return=args.n_step_return,
        frame_stack=replay_frame_stack(args, make_env, run.obs_space),  # frames stored once only where exact
        prioritized=args.prioritized,
        alpha=args.alpha,
        beta=args.beta,
        shared=args.sampler == "async",
        seed=distributed.rank_seed(args.seed),
        prefetch=prefetch_on(run.device, args.sampler),
        unique_frames=True,  # frame-wise: each frame sent once, stacked on the device
    )


def main() -> int:
    args = parse_args(Args, PRESETS, check_args)
    run = Run(args, __file__, make_env, action_space=gym.spaces.Discrete)  # checks: device, --resume, spaces (exit 2)
    run.setup()  # this process: TF32, Ctrl-C/SIGTERM, the torchrun job, cores, seeds
    with run.allocating("buffer_size", "n_atoms"):  # sizes this machine cannot hold: exit 2
        q_net, target_net, optimizer, noise = make_learner(args, run)
        buffer = None if args.eval_only or args.export else make_replay(args, run)
        batches = ReplayBatches(buffer, HOST_ONLY, run.device)  # a CUDA learner's uniform replay samples on the device
    policy = partial(act, Policy(q_net), run.device, args.eval_epsilon)
    start = run.begin(policy, buffer, model=q_net, target_model=target_net, optimizer=optimizer, noise=noise)
    if args.eval_only or args.export:  # with --resume: evaluate the checkpoint's policy or export it, train nothing
        return run.evaluate_or_export(Policy(q_net), ["action", "q_values"])
    global_step, updates = start.global_step, start.updates
    updates_per_step = args.replay_ratio / (args.batch_size * run.world)  # the job's: every rank learns from its batch
    pacer = ReplayPacer(updates_per_step, args.min_steps_learn * run.world, *start.replay_origin)
    stats, waits = {"td_loss": None, "q_values": None}, {}
    next_target = global_step + args.target_update_interval
    with run:
        if args.sampler != "async":  # this process steps the envs: in turn (serial), or in threads or processes
            envs = run.hold(make_envs(args, make_env, args.sampler, len(run.affinity.learner_cpus)))
            stepper = EnvStepper(envs, args, distributed.env_seed(args.seed + global_step, args.num_envs), noise)
        else:  # a sampler process fills the shared replay (the last section of this file)
            sampler = AsyncReplay.start(run, buffer, q_net, pacer, global_step, sampler_main, (args, buffer))
        while global_step < args.total_timesteps:
            if args.sampler != "async":  # the actions first: on a GPU the envs then step while the updates below run
                action = stepper.act(q_net, epsilons(args, global_step), run.device)
            else:  # the rows the sampler appended meanwhile (and its episodes); q_net is published to it when due
                global_step, waits = sampler.exchange(run, q_net, updates)
            for _ in range(pacer.due(global_step, updates)):  # replay_ratio samples per env step
                beta = args.beta + (1.0 - args.beta) * min(global_step / args.total_timesteps, 1.0)
                stats = c51_update(q_net, target_net, optimizer, batches, args, beta, noise)
                updates += 1
            if global_step >= next_target:  # tau 1 copies the online network, below 1 moves the target a fraction tau
                with torch.no_grad():
                    for p, tp in zip(q_net.parameters(), target_net.parameters()):
                        tp.lerp_(p, args.tau)
                next_target += args.target_update_interval
            if args.sampler != "async":  # one step of every env, into the replay
                row, episodes = stepper.step(action)
                buffer.append(row)
                global_step += args.num_envs * run.world  # the job's env steps: every rank steps as many
                run.episodes(episodes, global_step)
            if run.periodic(global_step, epsilon=float(epsilons(args, global_step).mean()), **stats, updates=updates, **waits):
                break  # --stop-at-return reached, or a signal: finish ends as Ctrl-C does
        run.finish(global_step)  # the last row, checkpoint and evaluation
    return run.exit_code


# ----------------------------------------------------------------------------------- async sampling
# Only --sampler async runs this: a sampler process stepping the envs into the shared replay.


def sampler_main(args: Args, buffer: ReplayBuffer, link: AsyncReplay, proc: SamplerProcess) -> None:
    """Async sampler process: steps the envs into the shared replay with the newest parameters the learner published,
    waiting while it is more than max_lag_steps ahead of what the learner's updates cover."""
    with closing(make_envs(args, make_env, "parallel" if is_atari(args.env_id) else "serial", proc.n_threads)) as envs:
        step = link.start_step
        seed = distributed.env_seed(args.seed + step, args.num_envs)
        stepper = EnvStepper(envs, args, seed, torch.Generator(proc.device).manual_seed(seed) if args.noisy else None)
        q_net = proc.place(make_network(args, envs.single_observation_space, envs.single_action_space), args.bf16)
        while step < args.total_timesteps:
            if not link.ready(proc, step, q_net, args.max_lag_steps):  # too far ahead of the learner
                continue
            row, episodes = stepper.step(stepper.act(q_net, epsilons(args, step), proc.device))
            buffer.append(row)
            step += args.num_envs * distributed.world_size()  # counted as global steps, like the learner's
            link.report(episodes, step)


if __name__ == "__main__":
    sys.exit(main())
