"""Weights & Biases tracking of a run (``--track``): what W&B receives, and what happens when it fails.

Guarantees
- Rank 0 alone talks to W&B (``shared.run.Run`` starts a ``Tracker`` only where it writes the run folder).
- ``start(args, path, script)`` opens the W&B run before training starts, with the whole config: every flag, the
  script's name and the git commit of the code when it runs from a git work tree. The run id is kept in
  ``{run folder}/wandb_id``, so ``--resume`` and ``--eval-only`` continue the same W&B run; its x-axis is the
  run's ``global_step``. After a crash, the rows logged past the last checkpoint stay in W&B (it cannot take rows
  back, as TensorBoard's purge and progress.csv do), so those steps appear twice there.
- ``tee(writer)``: every scalar written to TensorBoard also goes to W&B, under the same tag and step. Logged
  directly rather than synced from the event files (CleanRL's ``sync_tensorboard``): what W&B holds does not
  depend on a background parser of TensorBoard's files, which also holds ``wandb.finish`` up to 10 s.
- ``video(path)`` logs an evaluation video (``--capture-video``) as ``eval/video``.
- Failures: W&B that cannot start (not installed, not logged in or no network while online, a bad entity)
  exits 2 in one line before training starts; once started, a W&B call that raises prints one warning and
  tracking stops for the rest of the run, which trains on. ``finish`` closes the W&B run on every exit path.
- ``WANDB_MODE=offline`` needs no network: the run is written to ``{run folder}/wandb/offline-run-*`` and
  uploaded later with ``wandb sync``.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["Tracker", "start"]


def _git_commit(where: Path) -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip() if out.returncode == 0 else ""
    return commit or None


class Tracker:
    """An open W&B run (see the module docstring)."""

    def __init__(self, run: Any):
        self.run = run

    def log(self, values: dict[str, Any], step: int) -> None:
        if self.run is None:
            return
        try:
            self.run.log({**values, "global_step": step})
        except Exception as e:  # W&B's trouble never ends the training run
            print(
                f"warning: Weights & Biases stopped logging ({type(e).__name__}: {e}); training goes on",
                file=sys.stderr,
                flush=True,
            )
            self.run = None

    def tee(self, writer: Any) -> Any:
        """``writer`` (a TensorBoard SummaryWriter) whose scalars go to W&B too."""
        return _Tee(writer, self)

    def video(self, path: Path, step: int) -> None:
        if self.run is not None and path.exists():
            import wandb

            try:
                video = wandb.Video(str(path), format="mp4")
            except Exception as e:
                print(
                    f"warning: Weights & Biases could not take the video {path} ({type(e).__name__}: {e})",
                    file=sys.stderr,
                    flush=True,
                )
                return
            self.log({"eval/video": video}, step)

    def finish(self, exit_code: int) -> None:
        if self.run is None:
            return
        try:
            self.run.finish(exit_code=exit_code)
        except Exception as e:
            print(f"warning: Weights & Biases did not close the run ({type(e).__name__}: {e})", file=sys.stderr, flush=True)
        self.run = None


class _Tee:
    def __init__(self, writer: Any, tracker: Tracker):
        self.writer, self.tracker = writer, tracker

    def add_scalar(self, tag: str, value: Any, step: int, *args: Any, **kwargs: Any) -> None:
        self.writer.add_scalar(tag, value, step, *args, **kwargs)
        self.tracker.log({tag: value}, step)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.writer, name)


def start(args: Any, path: Path, script: str) -> Tracker:
    """Open (or, with an id in ``path``, continue) the W&B run of the run folder ``path``; raises RuntimeError
    with the reason when W&B cannot start."""
    try:
        import wandb
    except ImportError as e:
        raise RuntimeError(f"--track needs wandb ({e}): pip install -r requirements.txt") from None
    created = not path.exists()
    path.mkdir(parents=True, exist_ok=True)
    id_file = path / "wandb_id"
    run_id = id_file.read_text().strip() if id_file.exists() else secrets.token_hex(6)
    config = {**vars(args), "script": script, "git_commit": _git_commit(Path(sys.argv[0]).resolve().parent)}
    try:
        # Under torchrun the other ranks wait for this one in init_process_group for distributed.TIMEOUT_S: W&B
        # gives up before they do, so that its failure is this rank's exit 2, not their timeout.
        timeout = {"init_timeout": 25} if int(os.environ.get("WORLD_SIZE", 1)) > 1 else {}
        run = wandb.init(
            project=args.wandb_project_name,
            entity=args.wandb_entity or None,
            name=path.name,
            id=run_id,
            resume="allow",
            config=config,
            dir=str(path),
            settings=wandb.Settings(**timeout),
        )
        run.define_metric("global_step")
        run.define_metric("*", step_metric="global_step")
    except Exception as e:
        if created and not any(path.iterdir()):
            path.rmdir()  # nothing started: no empty run folder left behind
        raise RuntimeError(
            f"Weights & Biases did not start ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
            "log in with `wandb login`, or run offline with WANDB_MODE=offline"
        ) from None
    if not id_file.exists():
        id_file.write_text(run_id + "\n")
    return Tracker(run)
