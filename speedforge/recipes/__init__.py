"""Recipes: the flows that commands and Kubeflow components share, written once.

A command parses its arguments, calls one recipe and formats what comes back; a component does
the same with its own inputs. Each module is named after what its recipe produces, and none
imports a command: the library parts are assembled here, in the order they run.
"""
