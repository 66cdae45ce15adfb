"""Training: SFT, self-training and contrastive GRPO (TRL) under Ray Train.

    rewards.py     reward functions registered by name, computed from EvalResults
    rollouts.py    the rollouts table: one Rollout per sample, with its result and reward
    data.py        the task split, SFT pairs (measured variants, or trusted source kernels), GRPO's live prompts
    curriculum.py  GRPO's prompts from the easiest task levels first, the next level admitted as samples pass
    scoring.py     a step's completions -> candidates -> one evaluation batch -> rewards
    state.py       a run's state in the object store: checkpoints, data, the stage's progress
    metrics.py     per-step metrics: JSONL, TensorBoard, the reward curve
    job.py         the job record of a stage, sent to every Ray Train worker
    memory_plan.py a worker's device memory per train.strategy, and the one-line refusal of a plan that cannot fit
    weights.py     a stage's starting weights, loaded as train.strategy trains them (ddp, fsdp, lora)
    lora.py        LoRA adapters (peft): a new adapter's config, an adapter saved with its base's record
    sharding.py    FSDP: weights sharded as they load, sharded checkpoints a resume reads on any worker count
    stages.py      the three stages, each a TRL trainer run inside one Ray Train worker
    raytrain.py    the TorchTrainer that runs a stage (ScalingConfig from the config)
    run.py         a stage of a run: checked, run on Ray Train, its outcome; a run's status; the held-out check
    remote.py      a stage where a pipeline wants it: in this process, as a KubeRay RayJob, or a Ray job

Batches are evaluated through speedforge.evaluation (local or service, by name), responses become
candidates through speedforge.policy.parser.candidate_from, and variants go to the core's
variants table (speedforge.variants): nothing here imports speedforge.search.

`run.py` assembles them; `speedforge train` calls it, and the pipeline's train step through `remote.py`.
"""
