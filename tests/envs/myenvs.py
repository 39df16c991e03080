"""Tiny custom envs, registered on import: what a researcher's own package does (`--env-id myenvs:DictCartPole-v0`)."""

import gymnasium as gym
import numpy as np


class DictObservation(gym.ObservationWrapper):
    """The wrapped env's flat observation split into a Dict of two Boxes, in float64 (as many simulators give)."""

    def __init__(self, env):
        super().__init__(env)
        n = env.observation_space.shape[0]
        box = gym.spaces.Box(-np.inf, np.inf, (n // 2,), np.float64)
        self.observation_space = gym.spaces.Dict({"head": box, "tail": gym.spaces.Box(-np.inf, np.inf, (n - n // 2,))})

    def observation(self, obs):
        half = len(obs) // 2
        return {"head": obs[:half].astype(np.float64), "tail": obs[half:]}


gym.register("DictCartPole-v0", entry_point=lambda: DictObservation(gym.make("CartPole-v1")))
gym.register("DictPendulum-v0", entry_point=lambda: DictObservation(gym.make("Pendulum-v1")))
