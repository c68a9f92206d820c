"""Why LeanRL's SAC and TD3 raced with an edit (``benchmarks/gpu/race.py``'s ``LEANRL_EDITS``): plain torch, no
tensordict.

A compiled function that makes an ``nn.Parameter`` of a tensor it was given and then checks the Parameter's type (as
tensordict 0.15's ``to_module`` does with its default ``preserve_module_state=True``) makes dynamo guard the type of a
temporary it creates before the graph runs, which the guard cannot name. Its first call raises
``InternalTorchDynamoError: NameError: name 'SYNTHETIC_LOCAL' is not defined``, as LeanRL's SAC and TD3 did at their
first update on an H200 node (torch 2.11.0+cu130, 2026-12-04). Seen on the CPU with torch 2.11.0 and 2.13.0.

    python benchmarks/gpu/dynamo_parameter_guard.py    # prints the error on an affected torch, a tensor otherwise
"""

import torch
from torch import nn


def made_and_checked(x: torch.Tensor) -> torch.Tensor:
    p = nn.Parameter(x, requires_grad=True)  # a Parameter made inside the compiled function
    y = p * 2
    if type(p) is nn.Parameter:  # the check that asks dynamo for a type guard on it
        y = y + 1
    torch._dynamo.graph_break()
    return y


if __name__ == "__main__":
    try:
        print(torch.__version__, torch.compile(made_and_checked, backend="eager")(torch.randn(3)))
    except Exception as e:  # the point is to show what it raises
        print(torch.__version__, type(e).__name__, str(e)[:200])
