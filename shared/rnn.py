"""A one-layer ``nn.LSTM`` stepped row by row, for ``--compile``: Dynamo refuses ``nn.LSTM``'s fused kernel, and
under its experimental ``allow_rnn`` (which ``shared.compiling.enable`` sets, so that a graph may read the LSTM's
weights) the kernel fails to compile whenever its input needs no gradient but its weights do (torch 2.13, both
aot_eager and inductor; r2d1's learner has such inputs). Dynamo traces this in every case, one graph per sequence
length, in less time than the fused kernel where that compiles.

Guarantees
- ``lstm_rows(lstm, x, h, c, keep)`` is ``lstm``'s own function over ``x`` [T, B, in] from the state ``h``, ``c``
  [1, B, hidden], with the state multiplied by ``keep`` [T, B, 1] before each row (0 where an episode starts
  there, 1 elsewhere): the scripts' fused calls over stretches between episode starts compute the same, within
  float rounding (the same weights, torch's gate order i, f, g, o). Returns (out [T, B, hidden], (h, c)).
- Static: T Python steps, no data-dependent branch, so one graph per sequence length.
- Only a one-layer, unidirectional LSTM without projections (what the scripts build); anything else is a
  ``ValueError``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["lstm_rows"]


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
