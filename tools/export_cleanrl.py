"""Export a checkpoint's weights as a plain state_dict that CleanRL's `Agent` of the same script loads.

    python tools/export_cleanrl.py runs/<run_name>/checkpoint.pt agent.pt
    # then, in CleanRL's script of the same name:  agent.load_state_dict(torch.load("agent.pt"))

ppo.py and the four Atari scripts have CleanRL's parameter names already; ppo_continuous_action.py's `actor` is
CleanRL's `actor_mean`; ppo_shared.py and the MicroRTS scripts are not in CleanRL: their names are those of the blog's
own scripts (github.com/vwxyzjn/ppo-implementation-details), whose MicroRTS trunk starts with a `Transpose` layer.
Observation normalization (ppo_continuous_action.py) is not in CleanRL's Agent: its statistics are written beside, as
<out>.normalize.npz (mean, var, count), for what plays the policy.
"""

import argparse
import os
import sys
from pathlib import Path

from _common import exit_with

# script -> (old prefix, new prefix) of parameter names; the first that matches a name renames it
RENAMES = {
    "ppo_continuous_action.py": [("actor.", "actor_mean.")],
    "ppo_multidiscrete.py": [("network.0.", "network.1."), ("network.2.", "network.3."), ("network.5.", "network.6.")],
}
RENAMES["ppo_multidiscrete_mask.py"] = RENAMES["ppo_multidiscrete.py"]


def cleanrl_state_dict(checkpoint):
    """The checkpoint's weights under the names of CleanRL's (or the blog's) Agent of the same script."""
    renames = RENAMES.get(checkpoint["script"], [])
    state = {}
    for name, tensor in checkpoint["model"].items():
        old, new = next(((old, new) for old, new in renames if name.startswith(old)), ("", ""))
        state[new + name[len(old) :]] = tensor
    return state


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", type=Path, help="a checkpoint.pt of one of the scripts (--save-model)")
    parser.add_argument("out", type=Path, help="the state_dict file to write, e.g. agent.pt")
    opts = parser.parse_args(argv)
    import numpy as np
    import torch

    try:
        checkpoint = torch.load(opts.checkpoint, map_location="cpu", weights_only=True)
    except Exception as e:  # no such file, not a checkpoint, or holding code (refused by weights_only)
        sys.exit(f"error: cannot load the checkpoint {opts.checkpoint}: {(str(e).strip().splitlines() or [''])[0]}")
    if not (isinstance(checkpoint, dict) and {"script", "model"} <= checkpoint.keys()):
        sys.exit(f"error: {opts.checkpoint} is not a checkpoint of these scripts (give runs/<run_name>/checkpoint.pt)")
    if opts.out.is_dir() or not opts.out.parent.is_dir():
        where = f"{opts.out} is a folder" if opts.out.is_dir() else f"{opts.out.parent} is not a folder"
        sys.exit(f"error: {where}; give the path of the file to write, e.g. agent.pt")
    state = cleanrl_state_dict(checkpoint)
    tmp = opts.out.with_name(f".{opts.out.name}.tmp{os.getpid()}")  # whole or not at all
    try:
        torch.save(state, tmp)
        os.replace(tmp, opts.out)
    except (OSError, RuntimeError) as e:  # a full disk, a read-only folder (torch says RuntimeError)
        sys.exit(f"error: cannot write {opts.out}: {(str(e).strip().splitlines() or [type(e).__name__])[0]}")
    finally:
        tmp.unlink(missing_ok=True)
    print(f"wrote {opts.out}: {len(state)} tensors of {checkpoint['script']} (step {checkpoint.get('global_step')})")
    if checkpoint.get("normalize") and "obs" in checkpoint["normalize"]:  # VecNormalize's: {name: [mean, var, count]}
        np.savez(
            f"{opts.out}.normalize.npz",
            **{k: x.numpy() for k, x in zip(["mean", "var", "count"], checkpoint["normalize"]["obs"])},
        )
        print(f"wrote {opts.out}.normalize.npz: the observations' running mean, var and count (obs: clip((obs - mean) /")
        print("  sqrt(var + 1e-8), -10, 10), as the run normalized them; CleanRL's NormalizeObservation holds its own)")


if __name__ == "__main__":
    exit_with(main)
