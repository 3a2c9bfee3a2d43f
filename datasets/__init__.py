"""Loaders for the public outcome tables and traces in ``../shared/datasets``
and for Pointsman's own decision and outcome logs; leakage-safe splits.
"""
