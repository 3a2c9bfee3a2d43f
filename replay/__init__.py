"""Trace replay: run the real engine and policy over a real trace against a
simulated fleet, next to baselines, and report cost, latency and quality.
"""
