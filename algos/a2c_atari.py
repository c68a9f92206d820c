"""A2C (synchronous advantage actor-critic) for Atari and vector envs: serial, parallel and async sampling.

    python algos/a2c_atari.py                        # Breakout, 16 envs x 5 steps, serial sampling
    python algos/a2c_atari.py --sampler parallel     # ale-py's threaded vector env
    python algos/a2c_atari.py --preset cartpole      # MLP torso, trains in seconds

One gradient step per rollout on n-step (or GAE) returns. Async mode samples each rollout with the policy one update
older, so the policy gradient is corrected with a truncated importance weight min(pi / mu, 1) (V-trace's rho-bar = 1);
in serial and parallel mode it is 1.

Envs autoreset on the step after an episode ends (gymnasium's next-step mode): that final row only resets the env, so
it weighs 0 in the loss; its observation is the episode's last, whose value a time-limit truncation bootstraps from.
On Atari a lost life ends the training episode (no bootstrap across it) while the game goes on: logged returns are
whole games, unclipped.

Where to change what: the env in make_env (a wrapper there reaches every sampling mode); the network in make_agent
(Agent here), any nn.Module whose forward(obs) takes observations [N, ...] as the env gives them and returns logits [N,
A] and values [N]; the loss in a2c_loss, whose stats dict is logged (a new key is a new progress.csv column); a new
per-step quantity (stored in the rollout) is a field in rollout_example, written in collect, put in learn_from's rows
and read by the loss; the schedule in main. An @graphed step (one CUDA graph under --compile) sees a setting changed
between calls (an Args field) at its next call, each value one graph, 8 at most: pass a schedule as a tensor, and
return what the step computes (a write to a setting or to a list or dict argument is refused).
"""

import importlib.util
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
from torch.distributions import Categorical

from shared import distributed
from shared.argtypes import Fraction, NonNegFloat, NonNegInt, PositiveInt, Range
from shared.atari import is_atari, make_atari_env
from shared.buffer import buffer_from_example, on_device
from shared.cli import RunArgs, bad_args, parse_args
from shared.compiling import compiled, graphed, set_lr
from shared.device import to_host, upload
from shared.dict_obs import DictTorso, is_dict, obs_example, without_text
from shared.envs import action_mask, image_shape, make_envs
from shared.evaluation import Draws
from shared.namedarraytuple import namedarraytuple
from shared.precision import autocast, channels_last
from shared.procs import DoubleBuffer, SamplerProcess
from shared.run import Run


@dataclass
class Args(RunArgs):
    # seed, run folder, resume, checkpoints, evaluation, device, bf16: in shared.cli.RunArgs, the same everywhere
    # experiment
    preset: Literal["atari", "cartpole"] = "atari"
    """named settings to start from (atari: the A2C paper's Atari settings; cartpole: tuned for CartPole-v1); flags given
    override them"""
    env_id: str = "BreakoutNoFrameskip-v4"
    """gymnasium id: an Atari `*NoFrameskip-v4` game (Nature CNN) or an env with vector observations (MLP)"""
    total_timesteps: PositiveInt = 10_000_000
    """agent steps summed over all envs (Atari: 4 emulator frames each)"""
    log_every: PositiveInt = 100
    """rollouts between progress rows"""
    # algorithm
    num_envs: PositiveInt = 16
    """environments stepped together on each rank (torchrun); the job's batch is ranks x num_envs x num_steps"""
    num_steps: PositiveInt = 5
    """steps per env in each rollout"""
    learning_rate: Annotated[float, Range(gt=0, lt=1)] = 7e-4
    """RMSprop step size at the start"""
    anneal_lr: bool = True
    """anneal the learning rate linearly to 0 over the run"""
    rmsprop_alpha: Fraction = 0.99
    """RMSprop smoothing constant"""
    rmsprop_eps: NonNegFloat = 1e-5
    """RMSprop epsilon"""
    gamma: Fraction = 0.99
    """discount"""
    gae_lambda: Fraction = 1.0
    """GAE lambda (1: plain n-step returns, the A2C paper's)"""
    norm_adv: bool = False
    """normalise advantages over the batch (every rank's)"""
    ent_coef: NonNegFloat = 0.01
    """entropy bonus"""
    vf_coef: NonNegFloat = 0.5
    """value loss weight"""
    max_grad_norm: NonNegFloat = 0.5
    """global gradient-norm clip"""
    # environment (Atari ids only)
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
    "atari": Args(),
    # Ours, from rl-baselines3-zoo's a2c.yml CartPole-v1 (8 envs, no entropy bonus) with GAE and a larger step.
    "cartpole": Args(
        preset="cartpole",
        env_id="CartPole-v1",
        total_timesteps=150_000,
        num_envs=8,
        num_steps=8,
        ent_coef=0.0,
        gamma=0.98,
        gae_lambda=0.9,
        learning_rate=2e-3,
        norm_adv=True,
    ),
}

# ------------------------------------------------------------------------------------- environments


def make_env(args: Args, render: bool = False) -> Callable[[], gym.Env]:
    """One env, made in the process that steps it: a wrapper added here reaches every sampling mode. Atari ids get the
    papers' preprocessing (shared/atari.py), other ids a plain gym.make."""

    def thunk() -> gym.Env:
        if is_atari(args.env_id):
            return make_atari_env(args.env_id, args.noop_max, args.sticky_actions, render)
        env = gym.make(args.env_id, render_mode="rgb_array" if render else None)
        return without_text(env)  # Dict observations: their strings (MiniGrid's mission) dropped

    return thunk


# ------------------------------------------------------------------------------------------ network


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias: float = 0.0) -> nn.Module:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


class Agent(nn.Module):
    """Nature CNN for images ([C, H, W] or [H, W, C], at least 36x36; uint8 scaled to [0, 1] inside) or a 64x64 tanh MLP
    for vectors, with policy and value heads; for a gymnasium Dict space, one encoder per key (shared/dict_obs.py)."""

    def __init__(self, obs_shape: tuple[int, ...] | gym.spaces.Dict, n_actions: int):
        super().__init__()
        self.dict = is_dict(obs_shape)
        self.image = not self.dict and len(obs_shape) == 3
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
            self.torso = nn.Sequential(
                layer_init(nn.Linear(int(np.prod(obs_shape)), 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)), nn.Tanh()
            )
            width = 64
        self.actor = layer_init(nn.Linear(width, n_actions), std=0.01)
        self.critic = layer_init(nn.Linear(width, 1), std=1.0)

    def forward(self, obs) -> tuple[torch.Tensor, torch.Tensor]:
        if self.dict:  # tensors [N, ...] by key
            x = obs
        elif self.image:
            x = obs.permute(0, 3, 1, 2) if self.channels_last else obs  # [N, C, H, W]
            x = x.float() / 255.0 if obs.dtype == torch.uint8 else x.float()
        else:
            x = obs.float().flatten(1)
        h = self.torso(x)
        return self.actor(h).float(), self.critic(h).float().squeeze(-1)  # logits [N, A], value [N]


def make_agent(args: Args, obs_space: gym.Space, act_space: gym.Space) -> nn.Module:
    """The network, for the learner and the async sampler alike: a new network is one edit here (its forward: Agent's)."""
    return Agent(obs_space if is_dict(obs_space) else obs_space.shape, int(act_space.n))  # a Dict: the space itself


def masked(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``logits`` [N, A] with the actions ``mask`` [N, A] forbids at the lowest float: probability 0 when sampling and in
    the log-probabilities, no term in the entropy (0 * logit). Envs without masks pass all True, which changes nothing."""
    return logits.masked_fill(~mask, torch.finfo(logits.dtype).min)


class Policy(nn.Module):
    """Evaluation and --export: observations [B, ...] (a Dict's: one input per key) -> greedy actions [B] and the
    policy's logits [B, A] (evaluation samples from them; a deployment masks them itself)."""

    def __init__(self, agent: Agent):
        super().__init__()
        self.agent = agent

    def forward(self, obs) -> tuple[torch.Tensor, torch.Tensor]:
        logits, _ = self.agent(obs)
        return logits.argmax(1), logits


# ----------------------------------------------------------------------------------------- sampling

Bootstrap = namedarraytuple("Bootstrap", ["obs", "final_row"])


class EnvState:
    """What a sampler carries between rollouts, per env: current observation, action mask, final_row flag, lives,
    episode sums."""

    def __init__(self, envs, seed: int):
        self.obs, info = envs.reset(seed=seed)  # a Dict space's: a dict of arrays by key
        n = envs.num_envs
        self.final_row = np.zeros(n, bool)
        self.mask = action_mask(info, self.final_row, envs.single_action_space.n)  # [B, A]: all True without one
        self.lives = np.asarray(info.get("lives", np.zeros(n)), np.int64)
        # the episode sums travel in the rollout (ep_return, ep_length), which is how the async sampler's episodes reach
        # the learner; the replay scripts, whose rows hold no episode totals, keep them in shared.envs.EpisodeTally
        self.ep_return = np.zeros(n, np.float64)
        self.ep_length = np.zeros(n, np.int64)


def rollout_example(obs_space, n_actions: int, B: int) -> tuple:
    """One step of the rollout by field (allocated [T, B]) and the bootstrap [B]; a Dict's observations: one array per
    key. A new per-step quantity is a field here, written in collect and read in learn_from's rows and the loss."""
    zero = np.float32(0)
    acting = dict(obs=obs_example(obs_space), mask=np.ones(n_actions, bool), action=np.int64(0), logprob=zero, value=zero)
    # ep_*: the episode's totals where episode_end; final_row: the step only reset the env (next-step autoreset)
    env = dict(reward=zero, terminated=False, episode_end=False, final_row=False, ep_return=0.0, ep_length=0)
    one = namedarraytuple("Rollout", [*acting, *env])(**acting, **env)
    return one, Bootstrap(obs_example(obs_space, (B,)), np.zeros(B, bool))


@graphed
@compiled
def policy_step(agent: Agent, obs, mask: torch.Tensor, bf16: bool) -> tuple:
    """The acting step: actions [B] sampled among the valid ones (``mask`` [B, A]), their log-probabilities [B] and the
    values [B] of observations ``obs`` [B, ...]."""
    with autocast(mask.device, bf16):
        logits, value = agent(obs)
    dist = Categorical(logits=masked(logits, mask), validate_args=False)  # validation would wait on a GPU
    action = dist.sample()
    return action, dist.log_prob(action), value


@torch.no_grad()
def collect(envs, agent: Agent, state: EnvState, buf, boot, args: Args, device: torch.device) -> None:
    """Step the envs num_steps times, writing buf [T, B] and the bootstrap observation boot [B]."""
    for t in range(args.num_steps):
        # one copy, which lands in the rollout's step t (serial/parallel: on the learner's device; async: shared memory)
        up = upload({"obs": state.obs, "mask": state.mask}, device, into={"obs": buf.obs[t], "mask": buf.mask[t]})
        action, logprob, value = policy_step(agent, up["obs"], up["mask"], args.bf16)
        buf.final_row[t] = state.final_row
        buf.action[t], buf.logprob[t], buf.value[t] = to_host(action, logprob, value)  # one copy
        next_obs, reward, term, trunc, info = envs.step(buf.action[t])
        lives = np.asarray(info.get("lives", state.lives), np.int64)
        life_lost = (lives < state.lives) & ~state.final_row
        raw = np.where(state.final_row, 0.0, reward)  # a final row's reward belongs to no episode
        buf.reward[t] = np.sign(raw) if (args.clip_rewards and is_atari(args.env_id)) else raw
        buf.terminated[t] = term | (life_lost & args.life_loss_terminal)
        buf.episode_end[t] = term | trunc
        state.ep_return += raw
        state.ep_length += ~state.final_row
        buf.ep_return[t], buf.ep_length[t] = state.ep_return, state.ep_length
        state.ep_return[buf.episode_end[t]] = 0.0
        state.ep_length[buf.episode_end[t]] = 0
        state.obs, state.final_row = next_obs, term | trunc
        state.lives = lives
        state.mask = action_mask(info, state.final_row, state.mask.shape[-1])  # for next_obs
    boot.obs[:], boot.final_row[:] = state.obs, state.final_row


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
def a2c_loss(agent: Agent, data: dict, args: Args) -> tuple:
    """The A2C loss of the rollout's rows ``data`` (tensors [N, ...]; final rows weigh 0): the policy gradient weighted
    by the (truncated) importance weight, the value loss and the entropy bonus; and its statistics, detached."""
    with autocast(data["weight"].device, args.bf16):
        logits, value = agent(data["obs"])
    dist = Categorical(logits=masked(logits, data["mask"]), validate_args=False)
    mean = lambda x: (x * data["weight"]).sum() / data["weight"].sum().clamp(min=1)  # over the rows that count
    logprob = dist.log_prob(data["action"])
    # 1 unless the sampler lagged (async); exactly 1 otherwise, where another batch shape (or TF32, bf16 on a GPU) could
    # make the recomputed log-probability differ in its last bits
    rho = (logprob.detach() - data["logprob"]).exp().clamp(max=1.0) if args.sampler == "async" else torch.ones_like(logprob)
    pg_loss = -mean(rho * data["adv"] * logprob)
    v_loss = 0.5 * mean((value - data["ret"]) ** 2)
    entropy = mean(dist.entropy())
    loss = pg_loss - args.ent_coef * entropy + args.vf_coef * v_loss
    # Detached tensors: read when a row is written (a non-finite one ends the run there), never per update.
    stats = {
        "policy_loss": pg_loss.detach(),
        "value_loss": v_loss.detach(),
        "entropy": entropy.detach(),
        "rho_mean": mean(rho),
    }
    return loss, stats


@graphed
def a2c_update(agent: Agent, optimizer, data: dict, args: Args) -> dict:
    """One gradient step on a2c_loss over the rollout's rows ``data`` [N, ...] (one CUDA graph under --compile on a
    GPU); its statistics and the gradient norm."""
    if args.norm_adv:  # over every rank's rows: their gradients are averaged
        mean_adv, std = distributed.mean_std(data["adv"], data["weight"])
        data["adv"] = (data["adv"] - mean_adv) / (std + 1e-8)
    loss, stats = a2c_loss(agent, data, args)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    distributed.average_gradients(agent)
    grad_norm = nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
    optimizer.step()
    rho_mean = stats.pop("rho_mean")  # the progress columns keep their order
    return {**stats, "grad_norm": grad_norm, "rho_mean": rho_mean}


def learn_from(agent: Agent, optimizer, buf, boot, args: Args, device: torch.device) -> dict:
    """Returns with the learner's current critic, then the A2C step over every row of the rollout; ``buf`` [T, B] and
    ``boot`` [B] are numpy (async: shared), but for the observations and masks of a rollout collected in this process,
    already on the device."""
    T, B = args.num_steps, args.num_envs
    up = upload({"obs": buf.obs, "mask": buf.mask, "boot_obs": boot.obs}, device)  # one copy to a GPU
    i = torch.arange(T * B, device=device)
    obs = up["obs"][i // B, i % B]  # rows [T * B, ...] of [T, B, ...]
    with torch.no_grad(), autocast(device, args.bf16):
        _, next_value = agent(up["boot_obs"])
        if args.sampler == "async":  # sampled with the previous parameters: the values are the current critic's
            value, next_value = to_host(agent(obs)[1].view(T, B), next_value)
        else:
            value, next_value = np.asarray(buf.value, np.float32), to_host(next_value)
    f32 = lambda x: np.asarray(x, np.float32)
    flags = [f32(buf.terminated), f32(buf.episode_end), f32(buf.final_row)]  # [T, B] each
    adv, ret = compute_gae(f32(buf.reward), value, next_value, *flags, args.gamma, args.gae_lambda)
    rows = {"action": buf.action, "logprob": buf.logprob, "adv": adv, "ret": ret, "weight": f32(~buf.final_row)}
    data = {"obs": obs, "mask": up["mask"].flatten(0, 1), **{k: v.flatten() for k, v in upload(rows, device).items()}}
    return a2c_update(agent, optimizer, data, args)


# ------------------------------------------------------------------------------------------ sampler


class Sampler:
    """Where the learner's rollouts come from. serial/parallel: this process steps the envs with the current parameters;
    async: a sampler process (``sampler_main``) collects rollout k + 1 into the other slot of a double buffer, with the
    parameters of update k - 1, while the learner trains on rollout k."""

    def __init__(self, args: Args, run: Run, agent: Agent, first: int, last: int):
        self.args, self.run = args, run
        example, boot_example = rollout_example(run.obs_space, run.act_space.n, args.num_envs)
        if args.sampler == "async":
            self.buffers = DoubleBuffer(example, (args.num_steps, args.num_envs), module=agent)
            self.boots = [buffer_from_example(boot_example, (), shared=True) for _ in range(2)]
            self.worker = run.start_sampler(sampler_main, args, self.buffers, self.boots, first, last)
        else:
            self.envs = run.hold(make_envs(args, make_env, args.sampler, n_threads=len(run.affinity.learner_cpus)))
            # A resumed run starts fresh episodes; every env of every rank has a seed of its own.
            self.state = EnvState(self.envs, distributed.env_seed(args.seed + first, args.num_envs))
            # [T, B]; observations and masks where the update reads them, written there by each step's one copy
            self.buf = on_device(buffer_from_example(example, (args.num_steps, args.num_envs)), ("obs", "mask"), run.device)
            self.boot = buffer_from_example(boot_example, ())  # [B]

    def rollout(self, it: int, agent: Agent, global_step: int) -> tuple:
        """Rollout ``it`` [T, B] and its bootstrap [B]; records the episodes that ended in it (at ``global_step``, the
        job's env steps after it)."""
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


def make_learner(args: Args, run: Run) -> tuple[Agent, torch.optim.Optimizer]:
    """The agent and its RMSprop optimiser."""
    try:
        agent = make_agent(args, run.obs_space, run.act_space).to(run.device)
    except ValueError as e:  # observations the network cannot take
        bad_args(f"--env-id {args.env_id}: {e}")
    agent = channels_last(agent, run.device, args.bf16)
    optimizer = torch.optim.RMSprop(agent.parameters(), lr=args.learning_rate, alpha=args.rmsprop_alpha, eps=args.rmsprop_eps)
    return agent, optimizer


# Evaluation's act (shared.evaluation): the observations [B, ...], then by parameter name only those of draws,
# starts, rewards, mask that it names (another name is refused at the start: a renamed one would never be passed).
def act(policy: Policy, device: torch.device, obs, draws: Draws, mask: np.ndarray) -> np.ndarray:
    """Evaluation: each episode samples from the policy among the valid actions with its own ``draws`` (Gumbel-max: the
    argmax of the logits plus Gumbel noise is a sample of Categorical(logits))."""
    _, logits = policy(upload(obs, device))
    noise = upload(draws.gumbel(logits.shape[1]), device)
    return to_host((masked(logits, upload(mask, device)) + noise).argmax(1))


def main() -> int:
    args = parse_args(Args, PRESETS)  # each field's range is declared on it; no flag relates to another
    batch = args.num_envs * args.num_steps  # a rank's rollout; --log-every counts rollouts
    run = Run(args, __file__, make_env, action_space=gym.spaces.Discrete, iteration_steps=batch, dict_obs=True)
    run.setup()  # this process: TF32, Ctrl-C/SIGTERM, the torchrun job, cores, seeds
    with run.allocating():  # sizes this machine cannot hold: exit 2
        agent, optimizer = make_learner(args, run)
    policy = Policy(agent)
    start = run.begin(partial(act, policy, run.device), model=agent, optimizer=optimizer)
    if args.eval_only or args.export:  # with --resume: evaluate the checkpoint's policy or export it, train nothing
        return run.evaluate_or_export(policy, ["action", "logits"])
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
            stats = learn_from(agent, optimizer, buf, boot, args, run.device)
            sampler.release(it, agent)  # async: rollout it + 2 is sampled with the new parameters
            if run.periodic(global_step, learning_rate=lr, **stats):
                break  # --stop-at-return reached, or a signal: finish ends as Ctrl-C does
        run.finish(global_step)  # the last row, checkpoint and evaluation
    return run.exit_code


# ----------------------------------------------------------------------------------- async sampling
# Only --sampler async runs this: a sampler process collecting rollouts into the double buffer.


def sampler_main(args: Args, buffers: DoubleBuffer, boots: list, first: int, last: int, proc: SamplerProcess) -> None:
    """Async sampler process: rollout k goes to slot k % 2, collected with the parameters the learner left in that slot
    when it released rollout k - 2 (update k - 1): exactly one update behind the learner."""
    with closing(make_envs(args, make_env, "parallel" if is_atari(args.env_id) else "serial", proc.n_threads)) as envs:
        state = EnvState(envs, distributed.env_seed(args.seed + first, args.num_envs))  # as serial mode: fresh on resume
        agent = proc.place(make_agent(args, envs.single_observation_space, envs.single_action_space), args.bf16)
        torch.manual_seed(distributed.rank_seed(args.seed + 1))
        for k in range(first, last):
            buf = buffers.writer_acquire(k, proc.check, module=agent)
            collect(envs, agent, state, buf, boots[k % 2], args, proc.device)
            buffers.writer_release(k)


if __name__ == "__main__":
    sys.exit(main())
