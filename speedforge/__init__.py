"""speedforge: make code faster by contrastive RL with measured speed as the reward."""

__version__ = "0.1.0"
