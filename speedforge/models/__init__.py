"""The model registry in the store: versions with their lineage and held-out evaluation, the
`champion` alias, the promotion gate, and references (`champion`, `models:/NAME@3`) resolved to a
local checkpoint.

    records.py   ModelVersion, HeldoutEval, AliasChange, GateDecision (append-only JSON objects)
    registry.py  ModelRegistry: register, promote, roll back, read the history (models/<name>/ in a store)
    gate.py      judge(new, champion, GateConfig): promote or not, why, with the figures
    fetch.py     a reference -> a local folder of the version's files, each checked by sha256 (store.models)

The recipe speedforge.recipes.models assembles them for `speedforge models`, the consumers of a
policy model and the training pipeline.
"""
