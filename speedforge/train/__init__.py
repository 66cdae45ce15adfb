"""Training: SFT, self-training and contrastive GRPO (TRL) under Ray Train.

    rewards.py     reward functions registered by name, computed from EvalResults
    rollouts.py    the rollouts table: one Rollout per sample, with its result and reward
    data.py        the task split, SFT pairs from the variants table, GRPO's live prompts
    scoring.py     a step's completions -> candidates -> one evaluation batch -> rewards
    evaluation.py  the batch evaluators: this machine's sandbox, or the Ray evaluation service
    state.py       a run's state in the object store: checkpoints, data, the stage's progress
    metrics.py     per-step metrics: JSONL, TensorBoard, the reward curve
    stages.py      the three stages, each a TRL trainer run inside one Ray Train worker
    raytrain.py    the TorchTrainer that runs a stage (ScalingConfig from the config)

The recipe `speedforge.recipes.training` assembles them; `speedforge train` calls it.
"""
