"""Adapters of runwatch.watch for the trainers people use: transformers' `Trainer` and Lightning's.

Each is a thin callback over `runwatch.watch.Watch`, an optional extra (`pip install
runwatch[transformers]` or `runwatch[lightning]`); importing one imports its framework. Imports
runwatch.watch only.
"""
