"""CRINN on the Python side: data sets, exact ground truth, ef sweeps, the QPS-recall AUC
reward, the native engine's candidate builds, and the `ann` task family.

The engine itself is C++ (native/, built as speedforge._annengine).
"""
