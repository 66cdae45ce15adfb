"""Kubeflow components: each a thin call into one speedforge recipe, recorded as a step of the run.

A component takes the run's config (YAML text, strictly parsed; empty: the embedded defaults),
the run's store prefix and the run id, calls its recipe through
speedforge.kubeflow.run_steps.run_step (which records the step, and its error, in the store) and
returns the recipe's small JSON summary; data stays in the store, only URIs pass between steps.
Components import speedforge inside their body (KFP ships the function's source, not this
module) and run in the speedforge image (`IMAGE`), which carries kfp: nothing is installed when
a step starts.

    IMAGE: $SPEEDFORGE_IMAGE when set (read once, when this package is imported), else
    DEFAULT_IMAGE, the placeholder the checked-in YAML carries; `speedforge pipeline compile
    --image` sets it, and `speedforge pipeline submit|schedule` put the image they are given
    (--image or $SPEEDFORGE_IMAGE, fully qualified) in place of it.
"""

from __future__ import annotations

import os

from speedforge import __version__

IMAGE_ENV = "SPEEDFORGE_IMAGE"
DEFAULT_IMAGE = f"registry.example.com/speedforge:{__version__}"  # fully qualified: a bare name means Docker Hub
IMAGE = os.environ.get(IMAGE_ENV) or DEFAULT_IMAGE
