"""The KL estimators on real updates: CleanRL's approx_kl and old_approx_kl (logged) against ppo2's approxkl.

    python benchmark/kl_estimators.py [--total-timesteps 100000] [ppo.py flags...]

Runs ppo.py in this process with its ppo_loss observed: for every minibatch, mean((r - 1) - log r) (losses/approx_kl),
mean(-log r) (losses/old_approx_kl) and ppo2's 0.5 * mean((log r)^2); prints how far they are apart. Writes a normal
run under runs/ (exp name kl_estimators)."""

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
from _common import checked_args, exit_with, load_script  # noqa: E402  (tools/_common.py)


def main(argv):
    if "-h" in argv or "--help" in argv:
        print(__doc__)
        return
    flags = ["--total-timesteps", "100000", "--exp-name", "kl_estimators", *argv]
    args, error = checked_args(ROOT / "ppo.py", flags)  # what ppo.py would refuse, before it starts
    if not error and args.num_minibatches * args.update_epochs < 2:
        error = "one minibatch per update sees only the rollout's weights (log r = 0): give 2 or more minibatches or epochs"
    if error:
        sys.exit(f"error: {error}")
    ppo = load_script(ROOT / "ppo.py")
    loss, seen = ppo.ppo_loss, []

    def observed(newlogprob, entropy, newvalue, oldlogprob, *args, **kwargs):
        logratio = (newlogprob - oldlogprob).detach()
        k3, k1 = ((logratio.exp() - 1) - logratio).mean().item(), (-logratio).mean().item()
        seen.append((k3, k1, 0.5 * (logratio**2).mean().item()))
        return loss(newlogprob, entropy, newvalue, oldlogprob, *args, **kwargs)

    ppo.ppo_loss = observed
    sys.argv = ["ppo.py", *flags]
    try:
        ppo.main()
    except SystemExit as e:
        if e.code:
            raise
    k3, k1, k2 = np.array([s for s in seen if s[2] > 0]).T  # the first minibatch of an update: log r = 0, all three 0
    print(f"{len(k2)} minibatches; mean approx_kl {k3.mean():.4g}, old_approx_kl {k1.mean():.4g}, ppo2's {k2.mean():.4g}")
    print(
        f"median |approx_kl - ppo2's| / ppo2's: {np.median(abs(k3 - k2) / k2):.2%}; the same of old_approx_kl: "
        f"{np.median(abs(k1 - k2) / k2):.0%} (a mean of -log r, often near 0 or below in one minibatch)"
    )


if __name__ == "__main__":
    exit_with(main, sys.argv[1:])
