"""A one-layer ``nn.LSTM`` over sequences in which episodes start at any row (the state zeroed there), fused or row by
row.

Row by row is static (no data-dependent branch, no host data): a CUDA graph captures it whole, and Dynamo traces it
where it refuses ``nn.LSTM``'s fused kernel (under Dynamo's experimental ``allow_rnn``, which
``shared.compiling.enable`` sets so that a graph may read the LSTM's weights, the kernel fails to compile whenever
its input needs no gradient but its weights do; torch 2.13, aot_eager and inductor alike). Traced, T rows are T
cells unrolled into one inductor graph: minutes of compiling for R2D1's 125 rows, so r2d1_atari.py runs the rows
eagerly inside its update's CUDA graph and compiles only its torso and heads; ppo_lstm.py traces them inside its
compiled loss. Both scripts' networks go through ``lstm_stretches``.

Guarantees
- ``lstm_rows(lstm, x, h, c, keep)`` is ``lstm``'s own function over ``x`` [T, B, in] from the state ``h``, ``c``
  [1, B, hidden], with the state multiplied by ``keep`` [T, B, 1] before each row (0 where an episode starts
  there, 1 elsewhere): the scripts' fused calls over stretches between episode starts compute the same, within
  float rounding (the same weights, torch's gate order i, f, g, o). Returns (out [T, B, hidden], (h, c)).
  Static: T Python steps, no data-dependent branch, so one graph per sequence length where it is traced.
- ``lstm_stretches(lstm, x, h, c, keep, start_rows=None)`` is the same function, eager and compiled alike, so a
  network calls it without asking which: eagerly, the fused ``lstm`` over each stretch of rows in which no
  sequence starts an episode, the state multiplied by ``keep`` at a stretch's first row (fast; the stretches
  depend on the data: ``start_rows`` [T], host booleans, where the caller knows them, else read from ``keep``, one
  wait on a GPU for more than one row, none for one); traced by Dynamo or captured into a CUDA graph,
  ``lstm_rows`` (static; ``start_rows`` is ignored there).
- Only a one-layer, unidirectional LSTM without projections (what the scripts build): ``lstm_rows`` refuses
  anything else with a ``ValueError``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["lstm_rows", "lstm_stretches"]


def lstm_rows(lstm: Any, x: Any, h: Any, c: Any, keep: Any) -> tuple[Any, tuple[Any, Any]]:
    """``lstm`` over ``x`` [T, B, in] row by row, its state zeroed where ``keep`` [T, B, 1] is 0."""
    import torch
    from torch.nn.functional import linear

    if lstm.num_layers != 1 or lstm.bidirectional or lstm.proj_size or lstm.batch_first:
        raise ValueError("lstm_rows steps a one-layer, unidirectional, sequence-first LSTM without projections")
    w_ih, w_hh = lstm.weight_ih_l0, lstm.weight_hh_l0
    b_ih, b_hh = getattr(lstm, "bias_ih_l0", None), getattr(lstm, "bias_hh_l0", None)  # None: bias=False
    gates_x = linear(x, w_ih, b_ih)  # [T, B, 4 hidden]: the input's part of every row at once
    h, c = h[0], c[0]
    out = []
    for t in range(x.shape[0]):
        h, c = h * keep[t], c * keep[t]
        i, f, g, o = (gates_x[t] + linear(h, w_hh, b_hh)).chunk(4, -1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        out.append(h)
    return torch.stack(out), (h[None], c[None])


def _traced(x: Any) -> bool:
    """Whether ``x`` is being traced by Dynamo or captured into a CUDA graph: no host read, no fused LSTM there."""
    import torch

    return torch.compiler.is_compiling() or (x.is_cuda and torch.cuda.is_current_stream_capturing())


def lstm_stretches(lstm: Any, x: Any, h: Any, c: Any, keep: Any, start_rows: Any = None) -> tuple[Any, tuple[Any, Any]]:
    """``lstm_rows``' function: the fused ``lstm`` between the episode starts ``start_rows`` [T] (host) marks (read
    from ``keep`` where not given), row by row where traced or captured."""
    import numpy as np
    import torch

    if _traced(x):  # static: row by row (a given start_rows would be baked into the graph)
        return lstm_rows(lstm, x, h, c, keep)
    if start_rows is None:
        # eager: read from keep where the caller did not give them (a wait on a GPU: the learners give them); one row
        # is one stretch
        start_rows = (keep[:, :, 0] == 0).any(1).cpu().numpy() if x.shape[0] > 1 else np.zeros(1, bool)
    # mostly one stretch: a batch of 64 Atari sequences of 125 rows holds a few episode starts
    bounds = [0, *(np.flatnonzero(np.asarray(start_rows)[1:]) + 1).tolist(), x.shape[0]]
    out = []
    for t0, t1 in zip(bounds[:-1], bounds[1:]):
        o, (h, c) = lstm(x[t0:t1], (h * keep[t0], c * keep[t0]))
        out.append(o)
    return (torch.cat(out) if len(out) > 1 else out[0]), (h, c)
