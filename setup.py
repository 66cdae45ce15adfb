"""Native extensions built by the package build (see native/)."""

from setuptools import setup

setup()
