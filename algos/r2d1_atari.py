"""R2D1 (recurrent replay DQN, Kapturowski et al. 2019, one learner): serial, parallel, async.

    # Breakout, 16 envs, prioritized sequences
    python algos/r2d1_atari.py
    # sampler process + learner, shared replay
    python algos/r2d1_atari.py --sampler async
    # the memory task: CartPole without its velocities, which only a recurrent agent solves
    python algos/r2d1_atari.py --preset memory

Replay holds sequences of burn_in_steps + sequence_length rows (plus n_step_return rows for the targets) starting
every rnn_state_interval rows, where the sampler stored its recurrent state. Both networks start from that state; the
burn-in rows only advance it. Targets are n-step double DQN under the invertible value rescaling h (no reward
clipping); a sequence's priority mixes the max and the mean of its absolute TD errors (eta), and the sampler gives new
sequences input priorities from the Q-values it acted with. The recurrent state, previous action and previous reward are
zeroed at every row that starts an episode. replay_ratio: training rows (burn-in not counted) per env step, as in rlpyt.

Where to change what: the env in make_env; the network in make_network (R2D1Net here), any nn.Module over sequences [T,
B, ...] in three parts: embed(obs, prev_action, prev_reward, episode_start) the core's input, recur(x, state,
episode_start, start_rows=None) the core's output and the state after the last row, head(out) the Q-values [T, B, A]
(--compile compiles embed and head and runs recur, the recurrence, eagerly between them); forward(obs, prev_action,
prev_reward, state, episode_start, start_rows=None) the three in turn (evaluation and --export use it) and
initial_state(B, device) the zero state; the loss in r2d1_loss; the target in n_step_target; the acting policy of
evaluation and --export in Policy; a new stored quantity (per step, in the replay) is an entry in ROW, written in
EnvStepper.step and read by the loss (every batch field but HOST_ONLY is uploaded); the schedule in main. An @graphed
step (one CUDA graph under --compile) sees a setting changed between calls (an Args field) at its next call, each value
one graph, 8 at most: pass a schedule as a tensor, and return what the step computes (a write to a setting or to a list
or dict argument is refused).
"""

import copy
import importlib.util
import sys
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

from shared import distributed
from shared.argtypes import Fraction, NonNegFloat, NonNegInt, PositiveFloat, PositiveInt, Range
from shared.atari import is_atari, make_atari_env
from shared.cli import RunArgs, bad_args, parse_args
from shared.compiling import compiled, enabled, graphed
from shared.device import to_host, upload
from shared.envs import EpisodeTally, image_shape, make_envs, observe_only, replay_frame_stack
from shared.evaluation import Draws
from shared.namedarraytuple import namedarraytuple
from shared.pacing import AsyncReplay, ReplayPacer
from shared.precision import channels_last
from shared.procs import SamplerProcess
from shared.replay import SequenceReplayBuffer, prefetch_on, stacked
from shared.rnn import lstm_stretches
from shared.run import Run


@dataclass
class Args(RunArgs):
    # seed, run folder, resume, checkpoints, evaluation, device, bf16: in shared.cli.RunArgs, the same everywhere
    # experiment
    preset: Literal["atari", "memory"] = "atari"
    """named settings to start from (atari: the R2D2 paper's; memory: CartPole-v1 without its velocities); flags override"""
    env_id: str = "BreakoutNoFrameskip-v4"
    """gymnasium id: an Atari `*NoFrameskip-v4` game (Nature CNN) or an env with vector observations (MLP)"""
    total_timesteps: PositiveInt = 10_000_000
    """agent steps summed over all envs (Atari: 4 emulator frames each)"""
    log_every: PositiveInt = 10_000
    """env steps between progress rows"""
    save_replay: bool = False
    """each checkpoint also writes the replay (replay.npz, plain arrays); --resume then continues with it"""
    eval_epsilon: Fraction = 0.01
    """epsilon of the evaluation episodes"""
    # algorithm
    num_envs: PositiveInt = 16
    """environments stepped together on each rank (torchrun), each with its own recurrent state and epsilon"""
    buffer_size: PositiveInt = 1_000_000
    """replay capacity in rows (env steps; each rank's, torchrun)"""
    batch_size: PositiveInt = 64
    """sequences per gradient step"""
    sequence_length: PositiveInt = 80
    """training rows per sequence (after the burn-in)"""
    burn_in_steps: NonNegInt = 40
    """rows at the start of each sequence that only advance the recurrent state (no loss, no gradient)"""
    rnn_state_interval: PositiveInt = 40
    """rows between stored recurrent states: sequences start only there"""
    replay_ratio: PositiveFloat = 1.0
    """training rows consumed per env step (burn-in not counted)"""
    min_steps_learn: NonNegInt = 50_000
    """env steps collected before learning starts (in each rank's replay, torchrun)"""
    learning_rate: Annotated[float, Range(gt=0, lt=1)] = 1e-4
    """Adam step size (eps 1e-3, as in R2D2)"""
    gamma: Fraction = 0.997
    """discount"""
    n_step_return: PositiveInt = 5
    """steps summed before bootstrapping"""
    value_rescale_eps: NonNegFloat = 1e-3
    """epsilon of the value rescaling h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x"""
    value_rescale: bool = True
    """learn h(Q) instead of Q (no reward clipping needed)"""
    alpha: Fraction = 0.9
    """priority exponent"""
    beta: Fraction = 0.6
    """importance-weight exponent (annealed linearly to 1 over the run)"""
    eta: Fraction = 0.9
    """sequence priority = eta * max + (1 - eta) * mean of the absolute TD errors"""
    target_update_interval: PositiveInt = 2_500
    """learner updates between target-network copies"""
    max_grad_norm: float = 80.0
    """global gradient-norm clip"""
    hidden: PositiveInt = 512
    """width of the fully connected layer, the LSTM and the MLP torso (vector observations)"""
    recurrent: bool = True
    """use the LSTM; --no-recurrent replaces it with a feed-forward layer of the same width (the ablation)"""
    # environment (Atari ids only)
    noop_max: NonNegInt = 30
    """Atari: up to this many random no-ops at reset (paper convention 30)"""
    sticky_actions: Fraction = 0.0
    """Atari: probability of repeating the previous action (0: paper convention, no sticky actions)"""
    observe_indices: tuple[int, ...] = ()
    """vector observations: keep only these components (e.g. 0 2 on CartPole: positions without velocities)"""
    # infrastructure
    sampler: Literal["serial", "parallel", "async"] = "serial"
    """serial, parallel (ale-py threads / AsyncVectorEnv) or async (a sampler process filling a shared replay)"""
    max_lag_steps: NonNegInt = 2_000
    """async: the sampler waits when it is this many env steps ahead of the learner's updates (0: never waits)"""


# Named starting points: --preset NAME, then any flag overrides them; a field not named keeps its default.
PRESETS = {
    "atari": Args(),
    # Ours: the memory task of tests/test_r2d1.py (positions only: velocities must be remembered).
    "memory": Args(
        preset="memory",
        env_id="CartPole-v1",
        observe_indices=(0, 2),
        total_timesteps=30_000,
        num_envs=4,
        hidden=64,
        sequence_length=20,
        burn_in_steps=10,
        rnn_state_interval=10,
        n_step_return=3,
        gamma=0.99,
        batch_size=32,
        replay_ratio=64,
        learning_rate=1e-3,
        target_update_interval=100,
        min_steps_learn=2000,
        buffer_size=50_000,
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
        return observe_only(env, args.observe_indices) if args.observe_indices else env

    return thunk


# ------------------------------------------------------------------------------------------ network

RnnState = namedarraytuple("RnnState", ["h", "c"])  # each [B, hidden]


class R2D1Net(nn.Module):
    """torso -> fc -> LSTM(fc, one-hot previous action, previous reward) -> dueling head, over sequences [T, B, ...].
    Where episode_start [T, B] is set, the recurrent state, the previous action and reward are zeroed before that row."""

    def __init__(self, obs_shape: tuple[int, ...], n_actions: int, hidden: int, recurrent: bool = True):
        super().__init__()
        self.image = len(obs_shape) == 3
        self.n_actions = int(n_actions)
        self.hidden = hidden
        self.recurrent = recurrent
        if self.image:
            # ValueError with the reason when the CNN cannot take the images
            c, h, w = image_shape(obs_shape)
            self.channels_last = tuple(obs_shape) != (c, h, w)
            conv = nn.Sequential(
                nn.Conv2d(c, 32, 8, stride=4),
                nn.ReLU(),
                nn.Conv2d(32, 64, 4, stride=2),
                nn.ReLU(),
                nn.Conv2d(64, 64, 3, stride=1),
                nn.ReLU(),
                nn.Flatten(),
            )
            n_flat = conv(torch.zeros(1, c, h, w)).shape[1]  # 64 * 7 * 7 for 84x84 frames
            self.torso = nn.Sequential(*conv, nn.Linear(n_flat, hidden), nn.ReLU())
        else:
            self.torso = nn.Sequential(nn.Linear(int(np.prod(obs_shape)), hidden), nn.ReLU())
        core_in = hidden + self.n_actions + 1
        self.core = nn.LSTM(core_in, hidden) if recurrent else nn.Sequential(nn.Linear(core_in, hidden), nn.ReLU())
        self.v = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))
        self.a = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, n_actions))

    def initial_state(self, batch: int, device=None) -> RnnState:
        z = torch.zeros(batch, self.hidden, device=device)
        return RnnState(z, z.clone())

    def forward(self, obs, prev_action, prev_reward, state: RnnState, episode_start, start_rows=None) -> tuple:
        """Q-values [T, B, A] and the state after the last row: ``embed``, ``recur``, ``head``. ``start_rows`` [T] (host,
        optional): whether any sequence starts an episode at each row, which the learner knows from the batch: the fused
        LSTM over the stretches between them; without it the LSTM runs row by row (static: no host data)."""
        # Evaluation and --export call this; the learner and the acting step call the three parts themselves (--compile
        # compiles the first and the last): a change to the network belongs in them, not here.
        x = self.embed(obs, prev_action, prev_reward, episode_start)
        out, state = self.recur(x, state, episode_start, start_rows)
        return self.head(out), state

    def embed(self, obs, prev_action, prev_reward, episode_start) -> torch.Tensor:
        """The core's input [T, B, hidden + A + 1]: the torso's features, the one-hot previous action and the previous
        reward, the last two zeroed where ``episode_start`` [T, B] is set. No recurrence: --compile compiles this."""
        T, B = episode_start.shape
        x = obs.flatten(0, 1)  # [T*B, ...]
        if self.image:
            x = x.permute(0, 3, 1, 2) if self.channels_last else x  # [T*B, C, H, W]
            x = x.float() / 255.0 if obs.dtype == torch.uint8 else x.float()
        else:
            x = x.float().flatten(1)
        x = self.torso(x).view(T, B, -1)
        keep = (~episode_start).float().unsqueeze(-1)  # [T, B, 1]
        # one-hot by comparison: F.one_hot checks the range of the actions on the host
        a = (prev_action.long().unsqueeze(-1) == torch.arange(self.n_actions, device=x.device)).float() * keep
        return torch.cat([x, a, prev_reward.float().unsqueeze(-1) * keep], dim=-1)

    def recur(self, x, state: RnnState, episode_start, start_rows=None) -> tuple:
        """The core over ``x`` [T, B, ...] from ``state``, zeroed before each row where ``episode_start`` [T, B] is set:
        (out [T, B, hidden], the state after the last row). The recurrence runs eagerly, also under --compile (inside
        the update's CUDA graph on a GPU): unrolled into one inductor graph, 125 rows took minutes to compile."""
        if not self.recurrent:
            return self.core(x), state
        keep = (~episode_start).float().unsqueeze(-1)  # [T, B, 1]
        out, (hs, cs) = lstm_stretches(self.core, x, state.h[None], state.c[None], keep, start_rows)
        return out, RnnState(hs[0], cs[0])

    def head(self, out: torch.Tensor) -> torch.Tensor:
        """Dueling head: Q [T, B, A] from the core's output [T, B, hidden]. No recurrence: --compile compiles this."""
        adv = self.a(out)
        return self.v(out) + adv - adv.mean(-1, keepdim=True)


def make_network(args: Args, obs_space: gym.Space, act_space: gym.Space) -> nn.Module:
    """The network, for the learner (and its target copy) and the async sampler alike: a new network is one edit here
    (its ``embed``, ``recur``, ``head`` and ``initial_state``, which ``forward`` chains: R2D1Net's)."""
    return R2D1Net(obs_space.shape, int(act_space.n), args.hidden, args.recurrent)


class Policy(nn.Module):
    """The greedy policy, one step for B envs, for evaluation and --export: obs [B, ...], the previous action and reward
    [B], the state h, c [B, hidden] and episode_start [B] (True: all three are zeroed first) -> greedy actions [B],
    Q-values [B, A] and the next h, c."""

    def __init__(self, net: R2D1Net):
        super().__init__()
        self.net = net

    def forward(self, obs, prev_action, prev_reward, h, c, episode_start) -> tuple:
        q, state = self.net(obs[None], prev_action[None], prev_reward[None], RnnState(h, c), episode_start[None])
        return q[0].argmax(1), q[0], state.h, state.c


# ---------------------------------------------------------------------------------- value rescaling


def h(x: torch.Tensor, eps: float) -> torch.Tensor:
    """h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x (Pohlen et al. 2018)."""
    return torch.sign(x) * (torch.sqrt(x.abs() + 1.0) - 1.0) + eps * x


def h_inv(x: torch.Tensor, eps: float) -> torch.Tensor:
    """The exact inverse of h: sign(x)(((sqrt(1 + 4 eps (|x| + 1 + eps)) - 1) / (2 eps))^2 - 1) (eps = 0: sign(x)((|x| +
    1)^2 - 1))."""
    if eps == 0:
        return torch.sign(x) * ((x.abs() + 1.0) ** 2 - 1.0)
    return torch.sign(x) * (((torch.sqrt(1.0 + 4.0 * eps * (x.abs() + 1.0 + eps)) - 1.0) / (2.0 * eps)) ** 2 - 1.0)


def n_step_target(ret, not_done, discount, q_boot, args: Args) -> torch.Tensor:
    """h(ret + not_done * discount * h^-1(q_boot)), the n-step target of the learner and of the sampler's priorities;
    without h under --no-value-rescale."""
    if not args.value_rescale:
        return ret + not_done * discount * q_boot
    return h(ret + not_done * discount * h_inv(q_boot, args.value_rescale_eps), args.value_rescale_eps)


# ----------------------------------------------------------------------------------------- sampling

# A replay row by field, with its example (shape and dtype; the observation's from the env, rnn_state's from --hidden). A
# new stored quantity is an entry here, written in EnvStepper.step and read by the loss as b[name]: the update uploads
# every field of the batch but HOST_ONLY, the replay's bookkeeping (the loss reads the n-step fields made from them).
ROW = dict(action=np.int64(0), reward=np.float32(0), terminated=False, truncated=False)
ROW.update(prev_action=np.int64(0), prev_reward=np.float32(0))  # the previous step's, an input of the network
Row = namedarraytuple("Row", ["observation", *ROW, "rnn_state"])
HOST_ONLY = ("reward", "terminated", "truncated", "truncated_n")


def epsilons(num_envs: int) -> np.ndarray:
    """Ape-X / R2D2 vector epsilon: env i explores with 0.4^(1 + 7 i / (N - 1)), fixed over the run [B]."""
    return 0.4 ** (1 + 7 * np.arange(num_envs) / max(num_envs - 1, 1))


def sequence_priorities(td: np.ndarray, valid: np.ndarray, eta: float) -> np.ndarray:
    """Per-sequence priority [B] from absolute TD errors [T, B] over the valid rows: eta * max + (1 - eta) * mean (0
    where no row is valid)."""
    a = np.where(valid, np.abs(td), 0.0)
    return eta * a.max(0) + (1 - eta) * a.sum(0) / np.maximum(valid.sum(0), 1)


def priority_shift(args: Args) -> int:
    """State slots from a sequence's start to the chunk that completes it: where the chunk's input priorities land."""
    return -(-(args.burn_in_steps + args.sequence_length + args.n_step_return) // args.rnn_state_interval)


@compiled
def embed_row(net: R2D1Net, up: dict) -> torch.Tensor:
    """The acting step's core input [1, B, ...] (``R2D1Net.embed``: no recurrence, compiled)."""
    return net.embed(up["obs"][None], up["prev_action"][None], up["prev_reward"][None], up["episode_start"][None])


@compiled
def q_values(net: R2D1Net, out: torch.Tensor) -> torch.Tensor:
    """The acting step's Q-values [B, A] from the core's output [1, B, hidden] (``R2D1Net.head``: compiled)."""
    return net.head(out)[0].float()


@graphed
def q_step(net: R2D1Net, up: dict, state: RnnState) -> tuple:
    """The acting step over one row of B envs (one CUDA graph under --compile on a GPU, the LSTM's row eager inside
    it): Q-values [B, A], the recurrent state the row starts from (zeroed where an episode starts) and the state after
    it."""
    keep = (~up["episode_start"]).float().unsqueeze(-1)
    state = RnnState(state.h * keep, state.c * keep)
    out, new_state = net.recur(embed_row(net, up), state, up["episode_start"][None])  # eager: the fused LSTM, one kernel
    return q_values(net, out), state, new_state


class EnvStepper:
    """Steps the B envs epsilon-greedily, one recurrent state per env; returns replay chunks of rnn_state_interval rows
    with the input priorities of the sequence priority_shift slots back."""

    def __init__(self, envs, args: Args, net: R2D1Net, seed: int):
        self.envs, self.args = envs, args
        self.obs, _ = envs.reset(seed=seed)
        n = args.num_envs
        self.final_row = np.zeros(n, bool)  # this row only resets the env (next-step autoreset)
        self.episode_start = np.ones(n, bool)  # this row starts an episode: zero state, previous action and reward
        self.prev_action, self.prev_reward = np.zeros(n, np.int64), np.zeros(n, np.float32)
        self.state = net.initial_state(n, next(net.parameters()).device)  # on the net's device from the start
        self.episodes = EpisodeTally(n)  # each env's return and length so far
        self.rng = np.random.default_rng(seed)
        self.eps = epsilons(n)
        self.rows, self.states = [], []  # the chunk being collected, its recurrent states apart (on the device)
        self.shift = priority_shift(args)
        self.history = []  # (q_taken, q_max, reward, terminated, truncated, final_row) per row, newest last

    @torch.no_grad()
    def step(self, net: R2D1Net, device: torch.device) -> tuple:
        """One step of every env; returns (chunk or None, priorities or None, episodes [(return, length)])."""
        up = upload({k: getattr(self, k) for k in ("obs", "prev_action", "prev_reward", "episode_start")}, device)
        q, state, new_state = q_step(net, up, self.state)
        q = to_host(q)  # [B, A]
        greedy = q.argmax(1)
        explore = self.rng.random(len(greedy)) < self.eps
        action = np.where(explore, self.rng.integers(0, q.shape[1], len(greedy)), greedy)
        next_obs, reward, term, trunc, _ = self.envs.step(action)
        reward = np.where(self.final_row, 0.0, reward).astype(np.float32)
        prev_a = np.where(self.episode_start, 0, self.prev_action)
        prev_r = np.where(self.episode_start, 0.0, self.prev_reward).astype(np.float32)
        row = dict(observation=self.obs, action=action, reward=reward, terminated=term, truncated=trunc)
        self.rows.append(dict(row, prev_action=prev_a, prev_reward=prev_r))
        self.states.append(state)
        self.history.append((q[np.arange(len(action)), action], q.max(1), reward, term, trunc, self.final_row))
        episode_end = term | trunc
        episodes = self.episodes.step(reward, ~self.final_row, episode_end)  # [(return, length)] of those that ended
        self.state, self.obs = new_state, next_obs
        self.episode_start = self.final_row  # the row after a final row starts an episode
        self.final_row = episode_end
        self.prev_action, self.prev_reward = action, reward
        if len(self.rows) < self.args.rnn_state_interval:
            return None, None, episodes
        chunk = self.flush()
        keep_rows = (self.shift + 1) * self.args.rnn_state_interval
        self.history = self.history[-keep_rows:]
        priorities = self.input_priorities() if len(self.history) == keep_rows else None
        return chunk, priorities, episodes

    def flush(self) -> Row | None:
        """The rows collected so far as one chunk [T, B, ...] (None if none); their recurrent states come to the host
        here, in one copy per chunk."""
        if not self.rows:
            return None
        h, c = to_host(torch.stack([s.h for s in self.states]), torch.stack([s.c for s in self.states]))
        chunk = Row(**{k: np.stack([row[k] for row in self.rows]) for k in self.rows[0]}, rnn_state=RnnState(h, c))
        self.rows, self.states = [], []
        return chunk

    def input_priorities(self) -> np.ndarray:
        """Priorities [1, B] of the sequence starting at the oldest kept row: the learner's TD errors from the Q-values
        the sampler acted with (no target network, no double DQN: max_a Q at the bootstrap row), mixed as the learner's."""
        a = self.args
        q_taken, q_max, reward, terminated, truncated, final_row = (np.stack(x) for x in zip(*self.history))  # [W, B]
        L = a.burn_in_steps + a.sequence_length
        # the replay's n-step returns (shared/replay.py) of the sequence's rows: ret, terminated_n, k = n_taken
        ret = np.zeros((L, reward.shape[1]))
        alive = np.ones_like(ret, bool)
        terminated_n = np.zeros_like(ret, bool)
        k = np.zeros_like(ret, np.int64)
        for j in range(a.n_step_return):
            ret += np.where(alive, a.gamma**j * reward[j : L + j], 0.0)
            k += alive
            terminated_n |= alive & terminated[j : L + j]
            alive &= ~(terminated[j : L + j] | truncated[j : L + j])
        boot = q_max[np.arange(L)[:, None] + k, np.arange(reward.shape[1])]
        y = n_step_target(*map(torch.as_tensor, (ret, 1.0 - terminated_n, a.gamma**k, boot)), a).numpy()
        td = (y - q_taken[:L])[a.burn_in_steps :]
        return sequence_priorities(td, ~final_row[a.burn_in_steps : L], a.eta)[None]


# ---------------------------------------------------------------------------------- loss and update


@compiled
def embed_sequences(net: R2D1Net, target_net: R2D1Net, b: dict, args: Args) -> tuple:
    """Both networks' core inputs for the sequences b [W, B, ...] (``R2D1Net.embed``: no recurrence, compiled): the
    online net's over the burn-in rows (None without any) and over the rows after them, the target net's over all W."""
    burn = args.burn_in_steps
    obs = stacked(b)["observation"]  # Atari: the frames stacked here, [W, B, C, H, W]
    inputs = (obs, b["prev_action"], b["prev_reward"], b["episode_start"])
    with torch.no_grad():  # the burn-in rows only advance the online state: no gradient through them
        x_burn = net.embed(*(x[:burn] for x in inputs)) if burn else None
        x_target = target_net.embed(*inputs)
    x = net.embed(*(x[burn:] for x in inputs))
    return x_burn, x_target, x


@compiled
def loss_from_cores(net: R2D1Net, target_net: R2D1Net, out, out_target, b: dict, args: Args) -> tuple:
    """Double-DQN loss over the training rows from the cores' outputs, the online net's over the rows after the burn-in
    [L+n, B, hidden] and the target net's over all W rows (``R2D1Net.head``: no recurrence, compiled); returns (loss,
    |TD| [L, B], valid [L, B])."""
    burn = args.burn_in_steps
    L = args.sequence_length
    train = slice(burn, burn + L)
    q = net.head(out)  # [L+n, B, A]
    with torch.no_grad():
        q_target = target_net.head(out_target[burn:])  # [L+n, B, A]: the burn-in rows are never bootstrapped from
    q_taken = q[:L].gather(-1, b["action"][train].long().unsqueeze(-1)).squeeze(-1)  # [L, B]
    k = b["n_taken"][train].long()  # rows to the bootstrap row, relative
    boot_row = (torch.arange(L, device=k.device).unsqueeze(1) + k).clamp(max=q.shape[0] - 1)  # [L, B]
    with torch.no_grad():
        a_star = q.argmax(-1).gather(0, boot_row)  # double DQN: the online net picks the action
        q_next = q_target.gather(0, boot_row.unsqueeze(-1).expand(-1, -1, q.shape[-1]))
        q_next = q_next.gather(-1, a_star.unsqueeze(-1)).squeeze(-1)  # [L, B]
        not_done = 1.0 - b["terminated_n"][train].float()
        y = n_step_target(b["n_step_return"][train], not_done, b["bootstrap_discount"][train], q_next, args)
    valid = ~b["final_row"][train]  # rows that only reset the env carry no transition
    td = y - q_taken
    per_seq = (0.5 * td**2 * valid).sum(0) / valid.sum(0).clamp(min=1)  # [B]
    loss = (b["is_weights"] * per_seq).mean()
    return loss, td.detach().abs(), valid


def r2d1_loss(net: R2D1Net, target_net: R2D1Net, b: dict, args: Args) -> tuple:
    """Double-DQN loss over the training rows of sequences b [W, B, ...] (W = burn_in + sequence_length +
    n_step_return rows) starting from b["init_rnn_state"]; returns (loss, |TD| [L, B], valid [L, B]). Under --compile
    the parts without recurrence are compiled (embed_sequences, loss_from_cores) and the LSTM between them runs eagerly
    (inside the update's CUDA graph on a GPU): unrolled into one inductor graph, it took minutes to compile."""
    burn = args.burn_in_steps
    starts = b["episode_start"]  # [W, B]
    # [W] on the host: eager, the fused LSTM over the stretches between episode starts; compiled (not given), row by row
    rows = b.get("start_rows")
    part = lambda s: None if rows is None else rows[s]
    x_burn, x_target, x = embed_sequences(net, target_net, b, args)
    state = b["init_rnn_state"]
    # burn-in: advances the online state only; the target net sees the whole sequence
    with torch.no_grad():
        if burn:
            _, state = net.recur(x_burn, state, starts[:burn], part(slice(burn)))
        out_target, _ = target_net.recur(x_target, b["init_rnn_state"], starts, rows)  # [W, B, hidden]
    out, _ = net.recur(x, state, starts[burn:], part(slice(burn, None)))  # [L+n, B, hidden]
    return loss_from_cores(net, target_net, out, out_target, b, args)


def to_tensors(batch, device: torch.device) -> dict:
    """A replay batch on the device in one upload. Atari frames travel once each (frames [U, H, W] and frame_index
    [W, B, C]), stacked into the observations where the update reads them (inside its graph: no copy of them)."""
    out = upload({k: v for k, v in batch.items() if k not in HOST_ONLY}, device)  # init_rnn_state: an RnnState
    if not enabled():  # eager: where the fused LSTM's stretches end, [W] on the host
        out["start_rows"] = np.asarray(batch.episode_start).any(1)
    return out


@graphed
def r2d1_step(net, target_net, optimizer, b: dict, args: Args) -> tuple:
    """One gradient step on the sequences ``b`` (one CUDA graph under --compile on a GPU): the loss, |TD| [L, B] and
    the valid rows [L, B]."""
    loss, td, valid = r2d1_loss(net, target_net, b, args)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    distributed.average_gradients(net)
    nn.utils.clip_grad_norm_(net.parameters(), args.max_grad_norm)
    optimizer.step()
    return loss.detach(), td, valid


def r2d1_update(net, target_net, optimizer, buffer: SequenceReplayBuffer, args: Args, beta: float, device) -> dict:
    """One gradient step on a prioritized batch of sequences, their priorities written back; returns the row's logged
    statistics (a new key is a new progress.csv column)."""
    batch, index = buffer.sample(args.batch_size, beta=beta)
    loss, td, valid = r2d1_step(net, target_net, optimizer, to_tensors(batch, device), args)
    buffer.sample_ahead(args.batch_size, beta)  # async on a GPU: the host gathers the next batch while this trains
    td, valid = to_host(td, valid)  # the one copy an update makes: the sum tree lives on the host
    buffer.update_priorities(index, sequence_priorities(td, valid, args.eta))
    # Tensors, read when a row is written (a non-finite one ends the run there), never per update.
    return {"td_loss": loss, "td_abs": torch.from_numpy(td[valid]).mean()}


# --------------------------------------------------------------------------------------------- main


def check_args(args: Args) -> None:
    """What relates the flags to each other (each field's own range is declared on it): exit 2, one line."""
    rows = args.burn_in_steps + args.sequence_length + args.n_step_return  # a sequence and its n-step targets
    held = args.buffer_size // args.num_envs
    need = 2 * (rows + args.rnn_state_interval)
    if held < need:
        bad_args(f"--buffer-size {args.buffer_size} holds {held} rows per env, under twice a sequence + interval: {need}")
    per_env = args.min_steps_learn // args.num_envs
    sequences = args.num_envs * max((per_env - rows) // args.rnn_state_interval + 1, 0)
    if sequences < args.batch_size:
        bad_args(f"--min-steps-learn {args.min_steps_learn} gives {sequences} sequences, under --batch-size {args.batch_size}")
    if args.observe_indices and is_atari(args.env_id):
        bad_args("--observe-indices applies to vector observations, not Atari frames")
    if args.bf16:  # bfloat16 targets would be garbage: h_inv(1.0) comes out as -1.0 instead of 2.99
        bad_args("--bf16 is not supported by R2D1: its value rescaling needs float32")


def make_learner(args: Args, run: Run) -> tuple[R2D1Net, R2D1Net, torch.optim.Optimizer]:
    """The online network, its target copy and the optimiser."""
    try:
        net = make_network(args, run.obs_space, run.act_space).to(run.device)
    except ValueError as e:  # observations the network cannot take
        bad_args(f"--env-id {args.env_id}: {e}")
    net = channels_last(net, run.device, args.bf16)
    target_net = copy.deepcopy(net).requires_grad_(False)
    fused = {"fused": True} if run.device.type in ("cpu", "cuda") else {}  # one kernel for all parameters
    optimizer = torch.optim.Adam(net.parameters(), lr=args.learning_rate, eps=1e-3, **fused)
    return net, target_net, optimizer


def make_replay(args: Args, run: Run) -> SequenceReplayBuffer:
    """Each rank's replay: prioritized sequences of burn-in + sequence_length rows (plus n_step_return for the targets)
    from every rnn_state_interval-th row, with the sampler's input priorities."""
    obs = run.obs_space
    state = RnnState(np.zeros(args.hidden, np.float32), np.zeros(args.hidden, np.float32))
    example = Row(observation=np.zeros(obs.shape, obs.dtype), **ROW, rnn_state=state)
    return SequenceReplayBuffer(
        example,
        args.buffer_size,
        args.num_envs,
        sequence_length=args.burn_in_steps + args.sequence_length,
        rnn_state_interval=args.rnn_state_interval,
        discount=args.gamma,
        n_step_return=args.n_step_return,
        frame_stack=replay_frame_stack(args, make_env, obs),  # frames stored once only where exact
        prioritized=True,
        alpha=args.alpha,
        beta=args.beta,
        input_priority_shift=priority_shift(args),
        shared=args.sampler == "async",
        seed=distributed.rank_seed(args.seed),
        unique_frames=True,
        prefetch=prefetch_on(run.device, args.sampler),
    )


# Evaluation's act (shared.evaluation): the observations [B, ...], then by parameter name only those of draws,
# starts, rewards, mask that it names (another name is refused at the start: a renamed one would never be passed).
class EvalPolicy:
    """Evaluation's act: the Policy, eval_epsilon-greedy with each episode's own draws, each env carrying its recurrent
    state and previous action through its episode (``starts``: a new one begins there)."""

    def __init__(self, net: R2D1Net, device: torch.device, epsilon: float):
        self.net, self.policy = net, Policy(net)
        self.device = device
        self.epsilon = epsilon
        self.state, self.prev_action = None, np.zeros(0, np.int64)

    def __call__(self, obs: np.ndarray, draws: Draws, starts: np.ndarray, rewards: np.ndarray) -> np.ndarray:
        if len(starts) != len(self.prev_action):  # another number of envs than the last evaluation
            self.state = self.net.initial_state(len(starts), self.device)
            self.prev_action = np.zeros(len(starts), np.int64)
        up = upload({"obs": obs, "prev_action": self.prev_action, "rewards": rewards, "starts": starts}, self.device)
        greedy, q, h, c = self.policy(up["obs"], up["prev_action"], up["rewards"], *self.state, up["starts"])
        self.state = RnnState(h, c)
        explore = draws.random() < self.epsilon
        self.prev_action = np.where(explore, draws.integers(q.shape[1]), to_host(greedy))
        return self.prev_action


def main() -> int:
    args = parse_args(Args, PRESETS, check_args)
    run = Run(args, __file__, make_env, action_space=gym.spaces.Discrete)  # checks: device, --resume, spaces (exit 2)
    run.setup()  # this process: TF32, Ctrl-C/SIGTERM, the torchrun job, cores, seeds
    with run.allocating("buffer_size", "hidden"):  # sizes this machine cannot hold: exit 2
        net, target_net, optimizer = make_learner(args, run)
        buffer = None if args.eval_only or args.export else make_replay(args, run)  # no replay to evaluate or export
    policy = EvalPolicy(net, run.device, args.eval_epsilon)
    start = run.begin(policy, buffer, model=net, target_model=target_net, optimizer=optimizer)
    if args.eval_only or args.export:  # with --resume: evaluate the checkpoint's policy or export it, train nothing
        state = net.initial_state(8)  # 8 example rows: the graph's batch axis is dynamic
        zeros = torch.zeros(8)
        inputs = dict(prev_action=zeros.long(), prev_reward=zeros, h=state.h, c=state.c, episode_start=zeros.bool())
        return run.evaluate_or_export(Policy(net), ["action", "q_values", "h_out", "c_out"], rows=8, **inputs)
    global_step, updates = start.global_step, start.updates
    rows_per_update = args.batch_size * args.sequence_length * run.world  # the job's training rows
    pacer = ReplayPacer(args.replay_ratio / rows_per_update, args.min_steps_learn * run.world, *start.replay_origin)
    stats, waits = {"td_loss": None, "td_abs": None}, {}
    with run:
        # this process steps the envs: in turn (serial), or in threads or processes
        if args.sampler != "async":
            envs = run.hold(make_envs(args, make_env, args.sampler, len(run.affinity.learner_cpus)))
            stepper = EnvStepper(envs, args, net, distributed.env_seed(args.seed + global_step, args.num_envs))
        else:  # a sampler process fills the shared replay (the last section of this file)
            sampler = AsyncReplay.start(run, buffer, net, pacer, global_step, sampler_main, (args, buffer))
        # where this process starts (rows0: a restored replay's)
        step0, rows0 = global_step, buffer.cursor
        # the job's env steps whose rows are in the replay: behind while a chunk fills
        in_replay = global_step
        while global_step < args.total_timesteps:
            # one step of every env; every rnn_state_interval steps a chunk [I, B]
            if args.sampler != "async":
                chunk, priorities, episodes = stepper.step(net, run.device)
                if chunk is not None:
                    buffer.append(chunk, priorities)
                # the job's env steps: every rank steps as many
                global_step += args.num_envs * run.world
                run.episodes(episodes, global_step)
                in_replay = step0 + (buffer.cursor - rows0) * args.num_envs * run.world
            else:  # the chunks the sampler appended meanwhile; net is published to it when due
                global_step, waits = sampler.exchange(run, net, updates)
                in_replay = global_step
            due = pacer.due(in_replay, updates) if len(buffer) >= args.batch_size else 0
            for _ in range(due):  # replay_ratio training rows per env step
                beta = args.beta + (1.0 - args.beta) * min(in_replay / args.total_timesteps, 1.0)
                stats = r2d1_update(net, target_net, optimizer, buffer, args, beta, run.device)
                updates += 1
                if updates % args.target_update_interval == 0:
                    target_net.load_state_dict(net.state_dict())
            if run.periodic(global_step, **stats, updates=updates, **waits):
                break  # --stop-at-return reached, or a signal: finish ends as Ctrl-C does
        run.finish(global_step)  # the last row, checkpoint and evaluation
    return run.exit_code


# ----------------------------------------------------------------------------------- async sampling
# Only --sampler async runs this: a sampler process stepping the envs into the shared replay.


def sampler_main(args: Args, buffer: SequenceReplayBuffer, link: AsyncReplay, proc: SamplerProcess) -> None:
    """Async sampler process: steps the envs and appends chunks to the shared replay with the newest parameters the
    learner published; waits while it is more than max_lag_steps ahead of the learner's updates."""
    with closing(make_envs(args, make_env, "parallel" if is_atari(args.env_id) else "serial", proc.n_threads)) as envs:
        net = proc.place(make_network(args, envs.single_observation_space, envs.single_action_space), args.bf16)
        step = link.start_step
        stepper = EnvStepper(envs, args, net, distributed.env_seed(args.seed + step, args.num_envs))
        while step < args.total_timesteps:
            if not link.ready(proc, step, net, args.max_lag_steps, chunk_steps=args.num_envs * args.rnn_state_interval):
                continue  # too far ahead of the learner
            chunk, priorities, episodes = stepper.step(net, proc.device)
            if chunk is not None:
                buffer.append(chunk, priorities)
            step += args.num_envs * distributed.world_size()  # counted as global steps, like the learner's
            link.report(episodes, step)
        rest = stepper.flush()  # the last, partial chunk (no input priorities: its sequences get the default)
        if rest is not None:
            buffer.append(rest)


if __name__ == "__main__":
    sys.exit(main())
