"""The low shared core: the lab's names and ports, files written whole, the one-line usage error,
the argument parser and its flag types, and where the configuration lives.

Every other part imports it; it imports nothing of the project (tests/test_layers.py holds it).
"""
